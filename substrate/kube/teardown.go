package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dexaflow/reaper/sdk"
)

// stopAction is what teardown does to one pod.
type stopAction int

const (
	// stopSkipTerminal: the pod finished; nothing runs, and its outcome
	// record must stay for the reconciler.
	stopSkipTerminal stopAction = iota
	// stopInPlace: lower activeDeadlineSeconds to 1 so the kubelet stops
	// the containers and the pod object stays, with its record.
	stopInPlace
	// stopDelete: delete the pod (it never started, so it has no record;
	// or its node stopped reporting).
	stopDelete
)

// judgeTeardown decides how to stop pod p: skip a finished pod, delete a
// pod that never started (a Pending pod can still start the task) or whose
// phase is Unknown (its node is not reporting, so nothing would enforce a
// deadline, and nothing else would collect it), stop a started pod in
// place.
func judgeTeardown(p *pod) (stopAction, string) {
	switch {
	case finished(p.phase):
		return stopSkipTerminal, "reap teardown: task pod is already in a terminal phase (" + string(p.phase) + ")"
	case p.phase == corev1.PodUnknown:
		return stopDelete, "phase Unknown: its node is not reporting"
	case p.started.IsZero():
		return stopDelete, "never started"
	}
	return stopInPlace, "started " + p.started.UTC().Format("2006-01-02T15:04:05Z")
}

// Teardown stops exactly the named attempt's pods (or every pod of the
// named run), each pinned by the UID the live read returned, so a pod
// created after the read is never touched. With the pod UID the attempt
// records (req.PodUID), only that pod is: any other with its labels is
// foreign (foreign.go), left alone. Outcomes say what happened to
// each pod; an error means the pods could not be read, and nothing was
// done.
func (s *Substrate) Teardown(ctx context.Context, req sdk.TeardownRequest) ([]sdk.TeardownOutcome, error) {
	r, err := s.current()
	if err != nil {
		return nil, err
	}
	var (
		sel   labels.Selector
		match func(*pod) bool
		what  string
	)
	switch {
	case req.Attempt != nil:
		a := *req.Attempt
		sel, err = attemptsSelector([]sdk.Attempt{a})
		match, what = func(p *pod) bool { return p.labels.matches(a) }, "attempt "+a.String()
	case req.RunID != "":
		sel, err = runSelector(req.RunID)
		match, what = func(p *pod) bool { return p.labels.run == req.RunID }, "run "+req.RunID
	default:
		return nil, errors.New("kube teardown: the request names neither an attempt nor a run")
	}
	if err != nil {
		return nil, fmt.Errorf("kube teardown of %s: %w", what, err)
	}
	var pods []*pod
	if err := r.list(ctx, sel, func(p *pod) {
		if match(p) {
			pods = append(pods, p)
		}
	}); err != nil {
		return nil, fmt.Errorf("kube teardown of %s: reading its pods: %w", what, err)
	}
	if req.Attempt != nil {
		// Only the pod the attempt records, when it records one: a pod
		// someone else made with its labels is never touched.
		pods = r.ownPods(*req.Attempt, req.PodUID, pods, "teardown")
	}
	if len(pods) == 0 {
		return []sdk.TeardownOutcome{{Object: what, Action: sdk.TeardownNothing}}, nil
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	out := make([]sdk.TeardownOutcome, 0, len(pods))
	for _, p := range pods {
		// The attempt its Event names: the one torn down, or, in a run's
		// teardown, the one the pod's labels name.
		subject := podAttemptNote(p)
		if req.Attempt != nil {
			subject = attemptNote(*req.Attempt)
		}
		out = append(out, s.stop(ctx, r, p, req, subject))
	}
	return out, nil
}

// stop applies one pod's teardown, and records an Event regarding the pod
// when it stopped or deleted it (events.go), naming subject, the attempt.
func (s *Substrate) stop(ctx context.Context, r *running, p *pod, req sdk.TeardownRequest, subject string) sdk.TeardownOutcome {
	reason := req.Reason
	act, why := judgeTeardown(p)
	out := s.apply(ctx, r, p, act, why, reason)
	switch note := " for " + subject; out.Action {
	case sdk.TeardownStoppedInPlace:
		r.events.record(p, teardownWarns(req), reason, EventActionStop,
			"Stopped in place (activeDeadlineSeconds lowered to 1)"+note)
	case sdk.TeardownDeleted:
		r.events.record(p, teardownWarns(req), reason, EventActionDelete, "Deleted ("+why+")"+note)
	case sdk.TeardownDeleteFallback:
		r.events.record(p, true, reason, EventActionDelete,
			"Deleted: stopping it in place was refused ("+sdk.LabelTeardownDeleteFallback+")"+note)
	}
	return out
}

// apply carries out action act (judgeTeardown's, for why) on one pod.
func (s *Substrate) apply(ctx context.Context, r *running, p *pod, act stopAction, why, reason string) sdk.TeardownOutcome {
	log := s.log.With("pod", p.Name, "namespace", p.Namespace, "uid", p.UID, "reason", reason)
	switch act {
	case stopSkipTerminal:
		log.Info(why)
		return sdk.TeardownOutcome{Object: p.ref(), Action: sdk.TeardownSkipTerminal}
	case stopDelete:
		return r.deletePinned(ctx, p, sdk.TeardownDeleted, log.With("why", why))
	}
	_, err := r.client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.JSONPatchType, deadlinePatch(p.UID), metav1.PatchOptions{})
	switch {
	case err == nil:
		log.Info("reap teardown: stopped the task pod in place (activeDeadlineSeconds lowered to 1)")
		return sdk.TeardownOutcome{Object: p.ref(), Action: sdk.TeardownStoppedInPlace}
	case gone(err) || (apierrors.IsInvalid(err) && r.replaced(ctx, p)):
		log.Info("reap teardown: the listed pod is gone or was replaced; nothing to stop", "error", err)
		return sdk.TeardownOutcome{Object: p.ref(), Action: sdk.TeardownNothing, Error: sdk.TeardownGone + err.Error()}
	case refused(err):
		log.Warn("reap teardown: stopping the pod in place was refused; deleting it instead", "error", err)
		return r.deletePinned(ctx, p, sdk.TeardownDeleteFallback, log)
	}
	log.Warn("reap teardown: stopping the pod in place failed", "error", err)
	return sdk.TeardownOutcome{Object: p.ref(), Action: sdk.TeardownNothing,
		Error: fmt.Sprintf("lowering the deadline of %s: %v", p.ref(), err)}
}

// deadlinePatch lowers a pod's activeDeadlineSeconds to 1, pinned to its
// UID: a JSON patch whose first operation tests /metadata/uid, so the API
// server refuses it (the test fails, nothing is applied) for a pod that was
// replaced under the same name since it was read, as the delete's UID
// precondition does.
// StopInPlaceDeadline is the activeDeadlineSeconds a stop in place gives a
// pod: past at once, so its kubelet ends it within its grace. A pod
// carrying it is one a teardown stopped.
const StopInPlaceDeadline = 1

func deadlinePatch(uid types.UID) []byte {
	b, err := json.Marshal([]map[string]any{
		{"op": "test", "path": "/metadata/uid", "value": string(uid)},
		{"op": "add", "path": "/spec/activeDeadlineSeconds", "value": StopInPlaceDeadline},
	})
	if err != nil {
		panic(fmt.Sprintf("kube: building the deadline patch: %v", err)) // strings and numbers: cannot fail
	}
	return b
}

// replaced: the pod under p's name is no longer p (another UID, or none).
// The API server answers a patch whose test failed with a bare 422
// Invalid, as it answers a patch it judged invalid: reading the name tells
// the two apart. A read that fails says nothing: false.
func (r *running) replaced(ctx context.Context, p *pod) bool {
	got, err := r.client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true
	}
	return err == nil && got.UID != p.UID
}

// deletePinned deletes p only while it is still the pod with the UID read.
func (r *running) deletePinned(ctx context.Context, p *pod, action string, log hclog.Logger) sdk.TeardownOutcome {
	uid := p.UID
	err := r.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &uid}})
	switch {
	case err == nil:
		log.Info("reap teardown: deleted the task pod", "action", action)
		return sdk.TeardownOutcome{Object: p.ref(), Action: action}
	case gone(err):
		log.Info("reap teardown: the listed pod is gone or was replaced; nothing to delete", "error", err)
		return sdk.TeardownOutcome{Object: p.ref(), Action: sdk.TeardownNothing, Error: sdk.TeardownGone + err.Error()}
	}
	log.Warn("reap teardown: deleting the task pod failed", "error", err)
	return sdk.TeardownOutcome{Object: p.ref(), Action: sdk.TeardownNothing,
		Error: fmt.Sprintf("deleting %s: %v", p.ref(), err)}
}

// gone: the pod read is no longer there (deleted, or replaced by a pod of
// the same name whose UID fails the precondition).
func gone(err error) bool { return apierrors.IsNotFound(err) || apierrors.IsConflict(err) }

// refused: the server answered the patch with a refusal (a Role without
// patch, an admission webhook rejecting pod updates), not a failure to
// answer.
func refused(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) ||
		apierrors.IsMethodNotSupported(err)
}

package kuberunner

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/runner/internal/steps"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube"
)

// The valve on an unreachable node.
//
// The infra confirmation valve acts on a provisional mark nobody confirmed,
// so that a reconciler that cannot read the cluster does not hold a task
// forever. On a node that stopped reporting (partitioned, hung, its kubelet
// gone) the reconciler can read perfectly well: it reads that the pod's
// task container has not terminated, and no teardown can make it so,
// since only that node's kubelet stops containers. Re-placing then would
// run the task a second time beside the first, which carries on the moment
// the node is back (proven on the real node: a partition past the valve
// ran both). So before the valve acts on a kube attempt the runner reads
// its pod and the pod's node, live, and holds the mark while:
//
//   - the pod (the one recorded on the attempt, by name and UID, carrying
//     its labels; see attemptPods) exists,
//     has not finished and was not force-deleted (grace 0: someone asserted
//     it is gone), and its task container has not terminated;
//   - it is bound to a node that exists and carries no out-of-service
//     taint (the operator's word that the machine is off), whose Ready
//     condition is not True, or turned True less than the pods'
//     termination grace plus two maintenance intervals ago: a node just
//     back is ending the pod the teardown stopped in place (its kubelet
//     acts on the lowered deadline, the old agent on should_terminate),
//     and a re-place before that ends would overlap it. Past that window a
//     container still running on a Ready node is what the valve is for.
//
// Anything it cannot read (the pod, the node) does not hold: the valve
// opens as it would without this. A held mark waits for the node to come
// back (the old agent is answered should_terminate and the kubelet ends
// the pod stopped in place; the sweep confirms), the node's deletion (Pod
// GC), an out-of-service taint or an operator's reaperctl mark.
//
// The valve on a teardown still owed.
//
// The sweep confirms a mark once nothing of its attempt runs on; on a Ready
// node it does so soon after the teardown stopped the pod in place or
// deleted it. When that teardown keeps failing (RBAC without patch or
// delete on pods, an admission webhook refusing them, an API server that
// errs) the host keeps it owed (owed_teardowns) and retries it with its
// backoff, and the mark stays unconfirmed because the pod still runs. The
// valve would re-place it all the same, and the successor would run beside
// the old container: an old agent that heartbeats is answered
// should_terminate and stops its task, but a silent or wedged one hears
// nothing, and its task runs on until the pod's own activeDeadlineSeconds.
// So when a teardown of the attempt is owed, the runner reads its pod, live
// (by the recorded name and only with the recorded UID, as above), and
// holds the mark while that pod may still run its task: it exists, has
// not finished, was not deleted with no grace left (the kubelet's last
// word once its containers stopped, Pod GC, or an operator's forced
// delete) and its task container has not terminated; unscheduled, too (it
// may yet be bound and start). Unlike the node hold, what it cannot read
// holds here: the owed row is the board's own positive word that a
// teardown it meant to make did not happen, so an unreadable pod is one
// that may well run, and the valve waits for a read instead of opening
// (an unreadable owed_teardowns holds likewise). The decision carries the
// owed teardown (its id, tries, last error and next try) and the pod.
//
// The owed teardown's own retries carry on meanwhile (host/cycle/owed.go,
// untouched): once one completes (the verbs granted back, the webhook
// fixed), the pod is stopped in place or deleted, its container ends and
// the hold lets go. Otherwise the backstop is the pod's own deadline: at
// startTime + activeDeadlineSeconds (the task's timeout plus headroom, or
// the credential ceiling) the kubelet fails the pod (DeadlineExceeded) and
// kills its containers, and the hold lets go on the next cycle. An operator
// can end it sooner: force-delete the pod (grace 0), or settle the task
// with reaperctl mark (no successor at all then).

// valveNoteEvery is how often a held mark's decision is recorded again
// (the runner asks every cycle).
const valveNoteEvery = time.Minute

// taintOutOfService is the taint an operator puts on a node whose machine
// is known to be off (non-graceful node shutdown).
const taintOutOfService = "node.kubernetes.io/out-of-service"

// valveHold is the kube runner's steps.Driver.ValveHold.
func (r *Runner) valveHold(ctx context.Context, ti board.TaskInstance, now time.Time) steps.ValveHold {
	a := ti.Attempt
	h := r.readValveHold(ctx, a, now)
	if !h.Hold {
		delete(r.valveNoted, a)
		return h
	}
	if last, ok := r.valveNoted[a]; !ok || now.Sub(last) >= valveNoteEvery {
		r.valveNoted[a] = now
		h.Note = true
	}
	return h
}

func (r *Runner) readValveHold(ctx context.Context, a sdk.Attempt, now time.Time) steps.ValveHold {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CreateTimeout)
	defer cancel()
	owed, isOwed, err := r.w.OwedTeardown(ctx, a)
	if err != nil {
		return steps.ValveHold{Hold: true,
			Detail:   fmt.Sprintf("the board could not say whether a teardown of the attempt is still owed (%v): a re-place could run the task beside a pod never stopped; asked again next cycle", err),
			Evidence: map[string]string{"owed_read_error": err.Error()}}
	}
	pods, err := r.attemptPods(ctx, a)
	if err != nil {
		if isOwed {
			return owedValveHold(owed, nil, err)
		}
		r.log.Warn("could not read the pod of an unconfirmed mark past the valve: the valve opens", "attempt", a.String(), "error", err)
		return steps.ValveHold{}
	}
	for i := range pods {
		p := &pods[i]
		if isOwed && ownPod(a, p) && !podEnded(p) {
			return owedValveHold(owed, p, nil)
		}
		if ownPod(a, p) && !podEnded(p) {
			if h := stoppingValveHold(p); h.Hold {
				return h
			}
		}
		if h := r.podValveHold(ctx, a, p, now); h.Hold {
			return h
		}
	}
	return steps.ValveHold{}
}

// owedValveHold is the hold of a mark whose teardown o is owed, for its pod
// p that may still run, or, p nil, for a pod that could not be read (err).
func owedValveHold(o board.OwedTeardown, p *corev1.Pod, err error) steps.ValveHold {
	ev := map[string]string{
		"owed_teardown": strconv.FormatInt(o.ID, 10), "owed_tries": strconv.Itoa(o.Tries),
		"owed_last_error": o.LastError, "owed_next_try_at": o.NextTryAt.UTC().Format(time.RFC3339),
		"owed_since": o.FirstFailedAt.UTC().Format(time.RFC3339),
	}
	if p == nil {
		ev["pod_read_error"] = err.Error()
		return steps.ValveHold{Hold: true,
			Detail: fmt.Sprintf("a teardown of the attempt is owed (%d tries failed, the next at %s) and its pod could not be read (%v): it may still run its task, and a re-place would run the task beside it",
				o.Tries, ev["owed_next_try_at"], err),
			Evidence: ev}
	}
	ev["pod"], ev["pod_phase"], ev["node"] = p.Name, string(p.Status.Phase), p.Spec.NodeName
	where := "on node " + p.Spec.NodeName
	if p.Spec.NodeName == "" {
		where = "not yet scheduled"
	}
	ends := "it has no deadline of its own"
	if end, ok := podDeadline(p); ok {
		ev["pod_deadline"] = end.UTC().Format(time.RFC3339)
		ends = "its own deadline ends it at " + ev["pod_deadline"] + " at the latest"
	}
	return steps.ValveHold{Hold: true,
		Detail: fmt.Sprintf("a teardown of the attempt is owed (%d tries failed, the next at %s) and its pod %s may still run its task (%s, %s): a re-place would run the task beside it; held until the pod is gone or its task ended (%s)",
			o.Tries, ev["owed_next_try_at"], p.Name, p.Status.Phase, where, ends),
		Evidence: ev}
}

// stoppingValveHold holds the mark of an attempt whose pod p was stopped
// and has not ended yet: a teardown stopped it in place (its
// activeDeadlineSeconds is kube.StopInPlaceDeadline) or its deletion was
// asked with a grace. The kubelet is ending it, within the pod's grace,
// and its task may run until then: an owed teardown that completes just
// before the valve acts leaves exactly this, and a re-place at once would
// run the task beside its last seconds. It holds until the pod has ended;
// a kubelet that never ends it is a node the node hold or an operator
// answers. Both signs are the pod's own, read without comparing clocks.
func stoppingValveHold(p *corev1.Pod) steps.ValveHold {
	ev := map[string]string{"pod": p.Name, "pod_phase": string(p.Status.Phase), "node": p.Spec.NodeName}
	var how string
	switch {
	case p.DeletionTimestamp != nil:
		ev["pod_deletion_due"] = p.DeletionTimestamp.UTC().Format(time.RFC3339)
		how = "deleted, its grace ending at " + ev["pod_deletion_due"]
	case p.Spec.ActiveDeadlineSeconds != nil && *p.Spec.ActiveDeadlineSeconds == kube.StopInPlaceDeadline:
		ev["pod_stopped_in_place"] = "true"
		how = "stopped in place"
	default:
		return steps.ValveHold{}
	}
	return steps.ValveHold{Hold: true,
		Detail: fmt.Sprintf("its pod %s was %s, and its task has not ended yet (%s, on node %s): a re-place would run the task beside it; held until it has ended",
			p.Name, how, p.Status.Phase, p.Spec.NodeName),
		Evidence: ev}
}

// podDeadline is when the kubelet fails p for its activeDeadlineSeconds,
// once it has started.
func podDeadline(p *corev1.Pod) (time.Time, bool) {
	if p.Spec.ActiveDeadlineSeconds == nil || p.Status.StartTime == nil {
		return time.Time{}, false
	}
	return p.Status.StartTime.Add(time.Duration(*p.Spec.ActiveDeadlineSeconds) * time.Second), true
}

// ownPod reports whether p, a pod read as attempt a's, names a itself (its
// labels and annotation).
func ownPod(a sdk.Attempt, p *corev1.Pod) bool {
	got, ok := kube.PodAttempt(p.Labels, p.Annotations)
	return ok && got == a
}

// podEnded reports whether nothing of p runs any more: it finished, it was
// deleted with no grace left (the kubelet's last word once its containers
// stopped, Pod GC, an operator's forced delete), or its task container
// terminated.
func podEnded(p *corev1.Pod) bool {
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed ||
		(p.DeletionTimestamp != nil && p.DeletionGracePeriodSeconds != nil && *p.DeletionGracePeriodSeconds == 0) {
		return true
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == kube.TaskContainer && cs.State.Terminated != nil {
			return true
		}
	}
	return false
}

// attemptPods reads, live, the pods that are attempt a's own: the pod
// recorded on it, by its recorded name and only with its recorded UID (a
// pod someone put under the name after the attempt's went is not the
// attempt's), or, named before a create whose answer was never recorded,
// only the pod that create made (MadeFor). An attempt with no name recorded (its pod recorded before
// names were, or a create whose answer never came) has the pods its labels
// and annotation name, kept to the recorded UID when there is one, all of
// them otherwise (the label rule, as the substrate's).
func (r *Runner) attemptPods(ctx context.Context, a sdk.Attempt) ([]corev1.Pod, error) {
	rec, err := r.w.RecordedPod(ctx, a)
	if err != nil {
		return nil, err
	}
	if rec.Name != "" {
		p, err := r.cfg.Client.CoreV1().Pods(r.cfg.Namespace).Get(ctx, rec.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil, nil
		case err != nil:
			return nil, fmt.Errorf("reading pod %s: %w", rec.Name, err)
		case rec.UID == "" && MadeFor(p, a, rec.Name):
			// Named before its create, whose answer was never recorded:
			// the dispatch value it carries proves it the attempt's.
		case string(p.UID) != rec.UID:
			return nil, nil
		}
		return []corev1.Pod{*p}, nil
	}
	lbls, _ := kube.AttemptLabels(a)
	list, err := r.cfg.Client.CoreV1().Pods(r.cfg.Namespace).List(ctx,
		metav1.ListOptions{LabelSelector: labels.SelectorFromSet(lbls).String()})
	if err != nil {
		return nil, fmt.Errorf("listing the pods of %s: %w", a, err)
	}
	var own []corev1.Pod
	for _, p := range list.Items {
		if rec.UID != "" && string(p.UID) != rec.UID {
			continue
		}
		own = append(own, p)
	}
	return own, nil
}

// podValveHold is the valve's answer for p, a pod of attempt a.
func (r *Runner) podValveHold(ctx context.Context, a sdk.Attempt, p *corev1.Pod, now time.Time) steps.ValveHold {
	if !ownPod(a, p) || podEnded(p) || p.Spec.NodeName == "" {
		return steps.ValveHold{}
	}
	node, err := r.cfg.Client.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
	if err != nil {
		if !apierrors.IsNotFound(err) {
			r.log.Warn("could not read the node of an unconfirmed mark's pod past the valve: the valve opens",
				"attempt", a.String(), "node", p.Spec.NodeName, "error", err)
		}
		return steps.ValveHold{}
	}
	for _, t := range node.Spec.Taints {
		if t.Key == taintOutOfService {
			return steps.ValveHold{}
		}
	}
	for _, c := range node.Status.Conditions {
		if c.Type != corev1.NodeReady {
			continue
		}
		since := c.LastTransitionTime.UTC().Format(time.RFC3339)
		if c.Status == corev1.ConditionTrue {
			back := r.cfg.TerminationGrace + 2*r.cfg.Ladder.MaintenanceInterval
			if now.Sub(c.LastTransitionTime.Time) >= back {
				return steps.ValveHold{}
			}
			return steps.ValveHold{Hold: true,
				Detail: fmt.Sprintf("node %s of pod %s is Ready again since %s, and its kubelet is ending the pod (for up to %s): a re-place now would overlap it",
					node.Name, p.Name, since, back),
				Evidence: map[string]string{"pod": p.Name, "node": node.Name, "node_ready": string(c.Status), "node_ready_since": since}}
		}
		return steps.ValveHold{Hold: true,
			Detail: fmt.Sprintf("pod %s may still run its task on node %s, Ready %s since %s (%s): no teardown reaches it, and a re-place would run the task beside it once the node is back",
				p.Name, node.Name, c.Status, since, c.Reason),
			Evidence: map[string]string{"pod": p.Name, "node": node.Name, "node_ready": string(c.Status), "node_ready_since": since}}
	}
	return steps.ValveHold{} // no Ready condition yet: no signal
}

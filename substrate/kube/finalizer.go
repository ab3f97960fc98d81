package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// The outcome record finalizer. A task pod the kube runner creates
// carries FinalizerOutcomeRecord, so that whoever deletes it (a user, Pod
// GC, an eviction) leaves its object, and its task container's outcome
// record, for the sweep: the sweep settles a pod held that way like any
// finished pod, then removes the finalizer. The finalizer is the sweep's
// alone to remove, and the sweep removes only it, with a JSON patch pinned
// to the pod's UID and resourceVersion (test operations), so another
// controller's finalizer is never touched and a pod that changed since
// the sweep read it is left for a later sweep.

// releaseAction is what the sweep does with one pod's outcome record
// finalizer.
type releaseAction int

const (
	// releaseHold: the record may still be read, or still decide.
	releaseHold releaseAction = iota
	// releaseDone: the record did its work (the attempt is settled, or
	// the row had moved on), or there is none (a pod being deleted that
	// never started).
	releaseDone
	// releaseLeak: the leak bound: the finalizer outlived its purpose; the
	// release is a decision (LabelReconcileFinalizerLeak).
	releaseLeak
)

// Why the leak bound released a finalizer: the decision's evidence "why".
const (
	// LeakAttemptSettled: the pod's attempt was settled (or had moved on)
	// and the pod finished more than CollectAfter ago: an earlier sweep
	// should have released it.
	LeakAttemptSettled = "attempt_settled"
	// LeakEndNeverWritten: the pod was deleted with no grace left, and no
	// kubelet wrote how it ended within the task termination grace and two
	// maintenance intervals: nothing will (its node is gone).
	LeakEndNeverWritten = "end_never_written"
	// LeakAgeLimit: the pod ended (finished, or its deletion began) more
	// than the substrate's finalizer_max_age ago.
	LeakAgeLimit = "age_limit"
)

// releaseFacts is what the sweep learned of the attempt of one pod.
type releaseFacts struct {
	// settled: the pod finished and its settlement applied in this sweep,
	// or found the row moved on (another try or epoch, another state) or
	// its run finished. A pod of no recorded attempt is never settled.
	settled bool
	// provisional: the attempt holds a provisional infra mark still inside
	// the infra confirmation valve, which its SUCCESS record could
	// override.
	provisional bool
}

// judgeRelease decides the outcome record finalizer of pod p (which
// carries it), at now. In order:
//
//   - a finished pod whose attempt is settled is released, unless its
//     attempt holds a provisional mark inside the valve while its task
//     container has not terminated (and the cluster has not let the pod
//     go): its record may still come and override the mark. Released
//     more than CollectAfter after the pod finished, it is a leak
//     (LeakAttemptSettled);
//   - a pod being deleted that never started is released: it has no
//     record to keep;
//   - a pod the cluster let go (deleted with no grace left) that has not
//     finished task termination grace + 2 maintenance intervals after its
//     deletion is a leak (LeakEndNeverWritten): no kubelet will write its
//     end, and the pod-lost reaper needs the object gone;
//   - a pod that ended (finished, or being deleted) more than maxAge ago
//     is a leak (LeakAgeLimit), whatever its attempt: the bound on a pod
//     of no recorded attempt, or of a record the board never took;
//   - anything else holds. A live pod holds for as long as it runs: its
//     finalizer blocks no deletion.
func judgeRelease(p *pod, f releaseFacts, now time.Time, l ladder.Ladder, maxAge time.Duration) (releaseAction, string, string) {
	done := finished(p.phase)
	if done && f.settled {
		task, ok := p.task()
		if f.provisional && (!ok || !task.terminated()) && !p.letGo() {
			return releaseHold, "", "its attempt holds a provisional infra mark and its task container has not terminated"
		}
		if age := now.Sub(p.finishedAt()); age >= CollectAfter {
			return releaseLeak, LeakAttemptSettled, fmt.Sprintf("its attempt was settled, and it finished %s ago",
				age.Round(time.Second))
		}
		return releaseDone, "", "its attempt is settled"
	}
	deleting := p.DeletionTimestamp != nil
	if deleting && !done && p.started.IsZero() {
		return releaseDone, "", "it is being deleted and never started: no record"
	}
	if p.letGo() && !done {
		wait := l.TaskTerminationGrace + 2*l.MaintenanceInterval
		if since := now.Sub(p.DeletionTimestamp.Time); since >= wait {
			return releaseLeak, LeakEndNeverWritten, fmt.Sprintf("deleted %s ago with no grace left, and no kubelet wrote its end within %s",
				since.Round(time.Second), wait)
		}
	}
	if done || deleting {
		var ended time.Time
		if deleting {
			ended = p.DeletionTimestamp.Time
		}
		if done && (ended.IsZero() || p.finishedAt().Before(ended)) {
			ended = p.finishedAt()
		}
		if age := now.Sub(ended); age >= maxAge {
			return releaseLeak, LeakAgeLimit, fmt.Sprintf("it ended %s ago, past finalizer_max_age (%s)", age.Round(time.Second), maxAge)
		}
	}
	return releaseHold, "", ""
}

// release removes the outcome record finalizer from p and nothing else,
// pinned to the UID and resourceVersion the sweep read: a JSON patch that
// tests both and the finalizer's place before removing it. A pod that
// changed since fails the test, and a later sweep, reading it afresh,
// tries again.
func (r *running) release(ctx context.Context, p *pod) error {
	i, ok := p.recordFinalizer()
	if !ok {
		return nil
	}
	at := fmt.Sprintf("/metadata/finalizers/%d", i)
	patch, err := json.Marshal([]map[string]any{
		{"op": "test", "path": "/metadata/uid", "value": string(p.UID)},
		{"op": "test", "path": "/metadata/resourceVersion", "value": p.ResourceVersion},
		{"op": "test", "path": at, "value": FinalizerOutcomeRecord},
		{"op": "remove", "path": at},
	})
	if err != nil {
		return fmt.Errorf("building the finalizer patch of %s: %w", p.ref(), err)
	}
	_, err = r.client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.JSONPatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("removing the outcome record finalizer of %s: %w", p.ref(), err)
	}
	return nil
}

// stale: the pod changed (or was replaced) since the sweep read it: the
// patch's tests failed (Invalid), or the server saw a conflict.
func stale(err error) bool { return apierrors.IsInvalid(err) || apierrors.IsConflict(err) }

// releaseStats counts one sweep's releases.
type releaseStats struct {
	done, leaked, stale, failed int
}

// finalizers releases the outcome record finalizer of every pod of the
// snapshot that carries it and whose record has done its work (or has
// none), and applies the leak bound to the others. It returns the UIDs
// released. settled is the settle step's answer per pod, provisional the
// attempts with a provisional mark inside the valve. A release that fails
// is logged and left to a later sweep; it never fails the sweep.
func (sw *sweep) finalizers(ctx context.Context, pods []*pod, settled map[*pod]bool) (map[types.UID]bool, error) {
	released := map[types.UID]bool{}
	var st releaseStats
	for _, p := range pods {
		if _, ok := p.recordFinalizer(); !ok || sw.foreign[p] {
			continue // a foreign pod is not reaperd's to release
		}
		a, named := p.labels.attempt()
		f := releaseFacts{settled: settled[p] && !sw.unrecorded[p], provisional: named && sw.provisional[a]}
		act, why, detail := judgeRelease(p, f, sw.req.Now, sw.req.Ladder, sw.r.cfg.FinalizerMaxAge)
		if act == releaseHold {
			continue
		}
		if err := ctx.Err(); err != nil {
			return released, fmt.Errorf("kube sweep: releasing outcome record finalizers: %w", err)
		}
		ev := map[string]string{"pod": p.Name, "uid": string(p.UID), "why": why}
		if sw.req.DryRun {
			if act == releaseLeak {
				sw.decide(sdk.LabelReconcileFinalizerLeak, a, false, "would release the outcome record finalizer of "+p.ref()+": "+detail, ev)
			}
			continue
		}
		if p.DeletionTimestamp != nil && act == releaseDone {
			// Its deletion completes with the release: settled (or with
			// nothing to settle), it needs no tombstone.
			sw.r.presence.tombs.collected(p.UID)
		}
		err := sw.r.release(ctx, p)
		switch {
		case err == nil:
			released[p.UID] = true
			if act == releaseLeak {
				st.leaked++
				sw.s.log.Warn("kube sweep: the leak bound released an outcome record finalizer", "pod", p.Name, "why", why, "detail", detail)
				sw.decide(sdk.LabelReconcileFinalizerLeak, a, true, "released the outcome record finalizer of "+p.ref()+": "+detail, ev)
			} else {
				st.done++
			}
		case apierrors.IsNotFound(err):
		case stale(err):
			st.stale++
			sw.s.log.Debug("kube sweep: a pod changed before its finalizer was released; a later sweep retries", "pod", p.Name, "error", err)
		default:
			st.failed++
			sw.s.log.Warn("kube sweep: releasing an outcome record finalizer failed; a later sweep retries", "pod", p.Name, "error", err)
		}
	}
	if st != (releaseStats{}) {
		sw.s.log.Info("kube sweep: released outcome record finalizers", "released", st.done, "leaked", st.leaked,
			"changed", st.stale, "failed", st.failed)
	}
	return released, nil
}

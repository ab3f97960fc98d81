package kuberunner

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube"
)

// A ghost is a pod of an attempt that the board does not know: after an
// asynchronous failover lost the attempt's queueing and its RUNNING report,
// the promoted board holds the attempt scheduled again, under the same try
// and epoch, while the pod the lost dispatch made still runs the task. Its
// agent is told to stop at its next heartbeat (the board holds another
// credential for the attempt, or none running), but until then a new pod
// would run the task beside it.
//
// So before a pod is created for a scheduled attempt, the runner looks for
// live pods carrying the attempt's labels. The board has the attempt
// scheduled: no pod is its execution, so every live one found is a ghost.
// The runner deletes it (the pod's own termination grace) and holds the
// dispatch, the attempt left scheduled, until no live pod of it remains:
// the new pod starts only once the ghost can no longer run.
//
// The look is one LIST per create, narrowed by the attempt's labels and
// served from the API server's watch cache (resourceVersion 0: no etcd
// read), on a client of its own (Config.LookClient), so that it does not
// halve the creates the runner's client rate allows. A ghost was made
// before the failover, long before the cache is read, so the cache's lag
// does not hide it. The API server filters the namespace's every pod for
// the labels, so a LIST costs it in proportion to the namespace, not to
// what it finds; so dispatches look only while a ghost can be alive.
//
// Only a failover loses a dispatch the board acknowledged, and PostgreSQL
// starts a new WAL timeline at every promotion. So each cycle first reads
// the board's timeline (lifecycle.Writer.Timeline, one cheap query), and
// dispatches look for ghosts for ghostWindow after the runner first reads
// it (it cannot know what happened before it led) and after every move.
// A ghost that can reach the attempt API is told to stop at its next
// heartbeat after the promotion (the promoted board holds its attempt
// scheduled, then under another credential), and a dispatch of its attempt
// in the meantime finds it; the window is the longest a live agent stays
// silent before it is presumed lost, with its heartbeat and its task's
// termination grace on top. A timeline that cannot be read opens the
// window too: unknown, the runner looks.

// ghostWindow is how long after a failover dispatches look for ghosts.
func (r *Runner) ghostWindow() time.Duration {
	l := r.cfg.Ladder
	return l.AgentLost + l.Heartbeat + l.TaskTerminationGrace
}

// watchTimeline reads the board's timeline and, on the first read, a move
// or a read that fails, opens the ghost window from now.
func (r *Runner) watchTimeline(ctx context.Context, now time.Time) {
	tl, err := r.w.Timeline(ctx)
	switch {
	case err != nil:
		r.log.Warn("could not read the board's timeline: dispatches look for pods of their attempts the board does "+
			"not know", "error", err, "for", r.ghostWindow())
	case r.timeline != 0 && tl != r.timeline:
		r.log.Warn("the board's database failed over (its WAL timeline moved): dispatches look for pods of their "+
			"attempts the board does not know", "timeline_was", r.timeline, "timeline", tl, "for", r.ghostWindow())
		r.timeline = tl
	case r.timeline == 0:
		r.timeline = tl
	default:
		return
	}
	r.lookUntil.Store(now.Add(r.ghostWindow()).UnixNano())
}

// ghosts lists the live pods of a (neither Succeeded nor Failed), the ones
// being deleted included: their containers may still run.
func (r *Runner) ghosts(ctx context.Context, a sdk.Attempt) ([]corev1.Pod, error) {
	set, _ := kube.AttemptLabels(a)
	cctx, cancel := context.WithTimeout(ctx, r.cfg.CreateTimeout)
	defer cancel()
	list, err := r.cfg.LookClient.CoreV1().Pods(r.cfg.Namespace).List(cctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(set).String(), ResourceVersion: "0"})
	if err != nil {
		return nil, fmt.Errorf("listing the pods of %s in %s: %w", a, r.cfg.Namespace, err)
	}
	var live []corev1.Pod
	for _, p := range list.Items {
		if got, ok := kube.PodAttempt(p.Labels, p.Annotations); !ok || got != a {
			continue // another task under the same lossy task label
		}
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		live = append(live, p)
	}
	return live, nil
}

// heldForGhost reports whether a's dispatch waits for a ghost: it deletes
// the live pods of a not yet being deleted and holds while any is live. A
// LIST that fails holds nothing, logged: when the API is unavailable the
// create meets the same outage and takes the dispatch-failure rail (a new
// epoch, whose pods no ghost carries); when the runner may not list pods
// (the chart's role lets it), dispatches go on as before the look. A ghost
// missed so is still fenced off the board at its next heartbeat.
//
// A pod is deleted only once the board says, read after the look, that
// this runner's term still leads and that the attempt is still scheduled
// under the same try and epoch with no pod recorded: a runner whose listing
// of scheduled attempts went stale (deposed while its cycle waited on the
// board, its successor dispatching the same attempts meanwhile) would
// otherwise find the successor's pods and take them for ghosts.
func (r *Runner) heldForGhost(ctx context.Context, w *lifecycle.Writer, a sdk.Attempt, now time.Time) (bool, error) {
	if now.UnixNano() >= r.lookUntil.Load() {
		return false, nil // no failover within the window: no ghost can run
	}
	live, err := r.ghosts(ctx, a)
	switch {
	case err != nil && ctx.Err() != nil:
		return false, fmt.Errorf("dispatching %s: %w", a, ctx.Err())
	case err != nil:
		r.log.Warn("could not look for a pod of the attempt the board does not know: dispatching without",
			"attempt", a.String(), "error", err)
		return false, nil
	case len(live) == 0:
		return false, nil
	}
	if err := w.Leads(ctx, now); err != nil {
		return false, fmt.Errorf("dispatching %s: %w", a, err)
	}
	if unknown, err := r.stillUnknown(ctx, w, a); err != nil || !unknown {
		// Dispatched meanwhile: the pods found are its own, and the
		// queueing's guard refuses this stale dispatch.
		return false, err
	}
	for _, p := range live {
		if p.DeletionTimestamp != nil {
			r.log.Info("the attempt's dispatch waits for a pod the board does not know to end", "attempt", a.String(),
				"pod", p.Name, "uid", p.UID, "phase", p.Status.Phase, "deletion_due", p.DeletionTimestamp.Time)
			continue
		}
		uid := p.UID
		cctx, cancel := context.WithTimeout(ctx, r.cfg.CreateTimeout)
		err := r.cfg.LookClient.CoreV1().Pods(r.cfg.Namespace).Delete(cctx, p.Name,
			metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		cancel()
		switch {
		case err == nil, apierrors.IsNotFound(err), apierrors.IsConflict(err):
			r.log.Warn("a pod of the attempt the board does not know runs (its dispatch was lost with the board's "+
				"last writes): deleted; the attempt's dispatch waits for it to end",
				"attempt", a.String(), "pod", p.Name, "uid", p.UID, "phase", p.Status.Phase)
		default:
			r.log.Warn("a pod of the attempt the board does not know runs and could not be deleted: the attempt's "+
				"dispatch waits for it to end", "attempt", a.String(), "pod", p.Name, "uid", p.UID, "error", err)
		}
	}
	return true, nil
}

// stillUnknown reports whether the board, read now, still holds a
// scheduled under the same try and epoch with no pod recorded: every pod of
// it is then one the board does not know.
func (r *Runner) stillUnknown(ctx context.Context, w *lifecycle.Writer, a sdk.Attempt) (bool, error) {
	ti, err := w.TaskInstance(ctx, a.RunID, a.TaskID)
	if err != nil {
		return false, fmt.Errorf("dispatching %s: reading it again before deleting a pod of it: %w", a, err)
	}
	if ti.Attempt != a || ti.State != sdk.StateScheduled {
		return false, nil
	}
	rec, err := w.RecordedPod(ctx, a)
	if err != nil {
		return false, fmt.Errorf("dispatching %s: reading its recorded pod: %w", a, err)
	}
	return rec.Name == "" && rec.UID == "", nil
}

package kuberunner

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/internal/steps"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// adoptUnrecorded records the pods whose create answered but whose UID was
// never recorded: the runner that created one was deposed, killed or cut
// off from the board between the create and the record. Each such attempt
// is queued with its pod's name recorded (QueuePod) and no UID; its pod's
// agent is refused its exchange (pod_not_recorded) and retries, and the
// dispatch-lost reaper, seeing the pod live, defers. This step reads the
// pod by the recorded name and records it when the dispatch value it
// carries made that name (MadeFor): the pod is the attempt's, and the
// agent's next exchange goes through. A pod not there is left to the
// dispatch-lost reaper (the create never made one, or it went); one under
// the name that the value did not make is nobody's to adopt and is left
// alone. Only attempts queued at least CreateTimeout ago are read: a
// younger one's create may still be under way (another replica's, deposed
// a moment ago).
func (r *Runner) adoptUnrecorded(ctx context.Context, d steps.Driver, now time.Time, res *Result) error {
	us, err := d.W.UnrecordedPods(ctx, d.Executor, now.Add(-r.cfg.CreateTimeout), ladder.PageSize)
	if err != nil {
		return err
	}
	for _, u := range us {
		cctx, cancel := context.WithTimeout(ctx, r.cfg.CreateTimeout)
		p, err := r.cfg.Client.CoreV1().Pods(r.cfg.Namespace).Get(cctx, u.PodName, metav1.GetOptions{})
		cancel()
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			if cerr := ctx.Err(); cerr != nil {
				return cerr
			}
			r.log.Warn("reading an unrecorded pod failed; the next cycle tries again", "attempt", u.Attempt.String(),
				"pod", u.PodName, "error", err)
			continue
		case !MadeFor(p, u.Attempt, u.PodName):
			r.log.Warn("a pod under an attempt's recorded pod name was not made by its dispatch: left alone",
				"attempt", u.Attempt.String(), "pod", p.Name, "uid", p.UID)
			continue
		}
		ok, err := d.W.RecordCreatedPod(ctx, u.Attempt, lifecycle.CreatedPod{Name: p.Name, UID: string(p.UID),
			Created: p.CreationTimestamp.Time}, now)
		if err != nil {
			return fmt.Errorf("recording the unrecorded pod of %s: %w", u.Attempt, err)
		}
		if ok {
			res.Adopted++
			r.log.Info("an attempt's pod whose create was never recorded: recorded now", "attempt", u.Attempt.String(),
				"pod", p.Name, "uid", p.UID, "queued_at", u.QueuedAt.UTC().Format(time.RFC3339))
		}
	}
	return nil
}

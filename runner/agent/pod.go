package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube/podrecord"
)

// Pod mode: the agent as the task container of a dedicated Kubernetes pod.
//
// It runs the attempt exactly as Run does, through the same Reporter (the
// control plane's line, whatever carries it), and in addition leaves the
// attempt's durable outcome record in the container's termination message,
// where the kube substrate's sweep reads it once the pod has finished:
//
//   - the outcome known (success, failure, reschedule): a SUCCESS, FAILED
//     or RESCHEDULE record with the task's exit code, written before the
//     outcome is reported, so a report lost to an outage is recovered from
//     the record;
//   - the RUNNING report unanswered for all of StartRetry (every failure
//     one the Unanswered classifier counts as an answer that never came):
//     the infra marker, with the agent's own reason and no exit code, and
//     nothing reported;
//   - the agent stopped from outside (SIGTERM: the pod deleted, evicted,
//     preempted, its node shut down or its deadline passed): the task's
//     group is stopped and a FAILED record written, but nothing is
//     reported (StopUnreported), so the attempt is settled by the pod's end
//     (a disruption on the infra rail, a vanished pod as pod_lost, a
//     deadline as the task's failure), not as a task failure of its own;
//   - RUNNING answered should_terminate (the attempt moved on), or the
//     agent stopped before RUNNING was answered, or a refusal: no record;
//     the pod then settles by what the cluster says.

// TerminationMessagePathDefault is where Kubernetes reads a container's
// termination message unless the pod says otherwise.
const TerminationMessagePathDefault = "/dev/termination-log"

// RunInPod is Run in pod mode: it writes the durable outcome record to
// messagePath (see the pod-mode notes above). It returns what Run returns;
// an error wrapping ErrStartUnanswered once the infra marker is written.
// A record that cannot be written is logged and joined to the error.
func RunInPod(ctx context.Context, cfg Config, rep Reporter, messagePath string) (Outcome, error) {
	if messagePath == "" {
		return Outcome{}, errors.New("agent config: pod mode needs a termination message path")
	}
	cfg.StopUnreported = true
	var recErr error
	next := cfg.OnOutcome
	cfg.OnOutcome = func(o Outcome) {
		recErr = WriteRecord(messagePath, OutcomeRecord(cfg.Attempt, o))
		if recErr != nil && cfg.Logger != nil {
			cfg.Logger.Error("could not write the durable outcome record", "path", messagePath, "error", recErr)
		}
		if next != nil {
			next(o)
		}
	}
	out, err := Run(ctx, cfg, rep)
	if errors.Is(err, ErrStartUnanswered) {
		rec := podrecord.For(cfg.Attempt, podrecord.Infra)
		rec.Reason = InfraReason(cfg.startRetry())
		if errors.Is(err, ErrAnswerLost) {
			rec.Reason = AnswerLostReason
		}
		if werr := WriteRecord(messagePath, rec); werr != nil {
			return out, errors.Join(err, werr)
		}
	}
	if recErr != nil {
		return out, errors.Join(err, recErr)
	}
	return out, err
}

// InfraReason is the agent's reason in the infra marker it writes after
// its pre-start calls went unanswered for d.
func InfraReason(d time.Duration) string {
	return fmt.Sprintf("the agent's pre-start calls went unanswered (the control plane down, unreachable, timing out or failing) for %s", d)
}

// AnswerLostReason is the agent's reason in the infra marker it writes
// when a pre-start call applied and its answer was lost for good
// (ErrAnswerLost): the control plane failed between its write and its
// answer, and the call cannot be made again.
const AnswerLostReason = "the control plane applied one of the agent's pre-start calls (the exchange of its single-use bootstrap token) but its answer was lost, and the call cannot be made again"

func (c Config) startRetry() time.Duration {
	if c.StartRetry > 0 {
		return c.StartRetry
	}
	return StartRetryDefault
}

// OutcomeRecord is the durable record of attempt a that ended with o.
func OutcomeRecord(a sdk.Attempt, o Outcome) podrecord.Record {
	var rec podrecord.Record
	switch o.State {
	case sdk.StateSuccess:
		rec = podrecord.For(a, podrecord.Success)
	case sdk.StateUpForReschedule:
		rec = podrecord.For(a, podrecord.Reschedule)
	default:
		rec = podrecord.For(a, podrecord.Failed)
		rec.Reason = o.Message
	}
	// A stopped agent's record never carries an exit code, whatever the
	// task did with the stop (a task that traps SIGTERM and exits 0): the
	// record says the agent was stopped, and the sweep reads that shape as
	// "stopped from outside", so the pod's end decides (a deletion's stop is
	// a disruption, not the task's failure).
	if o.ExitCode >= 0 && o.Reason != ReasonAgentStopped {
		code := int32(o.ExitCode)
		rec.ExitCode = &code
	}
	// The record must fit the termination message: the reason gives way.
	if max := podrecord.MaxBytes / 2; len(rec.Reason) > max {
		rec.Reason = rec.Reason[:max]
	}
	return rec
}

// WriteRecord writes rec as the termination message at path, replacing
// what was there. The file is written in place (it is usually a file the
// kubelet mounted into the container, which a rename cannot replace) and
// synced before it is closed.
func WriteRecord(path string, rec podrecord.Record) error {
	msg, err := rec.Encode()
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("writing the outcome record of %s: %w", rec.Attempt(), err)
	}
	_, werr := f.WriteString(msg)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		return fmt.Errorf("writing the outcome record of %s to %s: %w", rec.Attempt(), path, err)
	}
	return nil
}

package literunner

import (
	"errors"
	"syscall"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
)

// move is what the runner does with a task instance that waits for a
// decision (one ListReleasable returned).
type move int

const (
	// moveNone: nothing now (an unconfirmed infra mark inside its valve, or
	// a row nothing applies to).
	moveNone move = iota
	// moveRetry: the retry rail (try+1, one retry spent).
	moveRetry
	// moveRetriesSpent: parked up_for_retry with no retries left: failed for
	// good as a task failure.
	moveRetriesSpent
	// moveReschedule: the reschedule rail (epoch+1).
	moveReschedule
	// moveReplace: the infra re-place rail (epoch+1, infra budget spent by
	// one, retries untouched).
	moveReplace
	// moveBudgetSpent: an infra failure with its budget spent: failed for
	// good.
	moveBudgetSpent
)

// releaseVerdict is decideRelease's answer.
type releaseVerdict struct {
	move move
	// valveOpen: the infra mark is still unconfirmed and its confirmation
	// valve has passed, so it is acted on anyway.
	valveOpen bool
	// wait is how much longer an unconfirmed mark waits (moveNone).
	wait time.Duration
}

// decideRelease judges one task instance at now. The rules:
//
//   - a held attempt is never moved (the listing leaves it out already);
//   - up_for_reschedule: the reschedule rail;
//   - a task failure, or up_for_retry: the retry rail while retries are
//     left; up_for_retry without any is failed for good (a failed task
//     without any is settled and never listed);
//   - an infra failure with a terminal reason is settled: nothing;
//   - an infra failure is acted on once its mark is confirmed (Lite marks
//     are confirmed as made; a mark without a time counts as confirmed), or,
//     unconfirmed, once valve has passed since the mark: re-placed while
//     infra_used < infra_budget, else failed for good.
func decideRelease(ti board.TaskInstance, now time.Time, valve time.Duration) releaseVerdict {
	if !ti.HeldAt.IsZero() {
		return releaseVerdict{}
	}
	switch {
	case ti.State == sdk.StateUpForReschedule:
		return releaseVerdict{move: moveReschedule}
	case ti.State == sdk.StateUpForRetry ||
		(ti.State == sdk.StateFailed && (ti.LastFailureKind == sdk.FailureTask || ti.LastFailureKind == "")):
		if ti.Retries > 0 {
			return releaseVerdict{move: moveRetry}
		}
		if ti.State == sdk.StateUpForRetry {
			return releaseVerdict{move: moveRetriesSpent}
		}
		return releaseVerdict{}
	case ti.State == sdk.StateFailed && ti.LastFailureKind == sdk.FailureInfra:
		if lifecycle.IsTerminalFailure(ti.FailureReason) {
			return releaseVerdict{}
		}
		var v releaseVerdict
		if ti.InfraConfirmedAt.IsZero() && !ti.InfraMarkedAt.IsZero() {
			opens := ti.InfraMarkedAt.Add(valve)
			if now.Before(opens) {
				return releaseVerdict{wait: opens.Sub(now)}
			}
			v.valveOpen = true
		}
		if ti.InfraUsed < ti.InfraBudget {
			v.move = moveReplace
		} else {
			v.move = moveBudgetSpent
		}
		return v
	}
	return releaseVerdict{}
}

// spawnMove is what a failed spawn calls for.
type spawnMove int

const (
	// spawnFail: the error will not pass by itself (no agent binary, a
	// refused record directory, a bad invocation): dispatch_failed now.
	spawnFail spawnMove = iota
	// spawnOfferAgain: a passing shortage: the dispatch-failure backoff rail
	// (epoch+1, back to scheduled), offered again next cycle.
	spawnOfferAgain
	// spawnExhausted: a passing shortage that has lasted the whole window:
	// dispatch_failed.
	spawnExhausted
)

// passing reports whether err is one that a later attempt to start an
// agent may not meet: the host ran short of processes, memory, descriptors
// or disk, a call was interrupted, or the agent binary is being replaced at
// this moment.
func passing(err error) bool {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return false
	}
	switch errno {
	case syscall.EAGAIN, syscall.ENOMEM, syscall.EMFILE, syscall.ENFILE,
		syscall.ENOSPC, syscall.EDQUOT, syscall.EINTR, syscall.ETXTBSY:
		return true
	}
	return false
}

// decideSpawnFailure judges a failed spawn, in the spirit of the
// specification's pod create errors: an error that says "not now" is offered
// again under a new epoch, off the task's retries, for window from the
// task's first such failure (unavailableSince, zero before it), then fails
// as dispatch_failed; any other error fails as dispatch_failed at once. A
// dispatch_failed is terminal and spends no retry: clearing the task
// starts it over.
func decideSpawnFailure(err error, unavailableSince, now time.Time, window time.Duration) spawnMove {
	switch {
	case !passing(err):
		return spawnFail
	case !unavailableSince.IsZero() && now.Sub(unavailableSince) >= window:
		return spawnExhausted
	default:
		return spawnOfferAgain
	}
}

package steps

import (
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
)

// Move is what a runner does with a task instance that waits for a
// decision (one lifecycle.Writer.ListReleasable returned).
type Move int

const (
	// MoveNone: nothing now (an unconfirmed infra mark inside its valve, or
	// a row nothing applies to).
	MoveNone Move = iota
	// MoveRetry: the retry rail (try+1, one retry spent).
	MoveRetry
	// MoveRetriesSpent: parked up_for_retry with no retries left: failed for
	// good as a task failure.
	MoveRetriesSpent
	// MoveReschedule: the reschedule rail (epoch+1).
	MoveReschedule
	// MoveReplace: the infra re-place rail (epoch+1, infra budget spent by
	// one, retries untouched).
	MoveReplace
	// MoveBudgetSpent: an infra failure with its budget spent: failed for
	// good.
	MoveBudgetSpent
)

// ReleaseVerdict is DecideRelease's answer.
type ReleaseVerdict struct {
	Move Move
	// ValveOpen: the infra mark is still unconfirmed and its confirmation
	// valve has passed, so it is acted on anyway.
	ValveOpen bool
	// Wait is how much longer an unconfirmed mark waits (MoveNone).
	Wait time.Duration
}

// DecideRelease judges one task instance at now. The rules:
//
//   - a held attempt is never moved (the listing leaves it out already);
//   - up_for_reschedule: the reschedule rail;
//   - a task failure, or up_for_retry: the retry rail while retries are
//     left; up_for_retry without any is failed for good (a failed task
//     without any is settled and never listed);
//   - an infra failure with a terminal reason is settled: nothing;
//   - an infra failure is acted on once its mark is confirmed (a mark
//     without a time counts as confirmed), or, unconfirmed, once valve has
//     passed since the mark: re-placed while infra_used < infra_budget,
//     else failed for good.
func DecideRelease(ti board.TaskInstance, now time.Time, valve time.Duration) ReleaseVerdict {
	if !ti.HeldAt.IsZero() {
		return ReleaseVerdict{}
	}
	switch {
	case ti.State == sdk.StateUpForReschedule:
		return ReleaseVerdict{Move: MoveReschedule}
	case ti.State == sdk.StateUpForRetry ||
		(ti.State == sdk.StateFailed && (ti.LastFailureKind == sdk.FailureTask || ti.LastFailureKind == "")):
		if ti.Retries > 0 {
			return ReleaseVerdict{Move: MoveRetry}
		}
		if ti.State == sdk.StateUpForRetry {
			return ReleaseVerdict{Move: MoveRetriesSpent}
		}
		return ReleaseVerdict{}
	case ti.State == sdk.StateFailed && ti.LastFailureKind == sdk.FailureInfra:
		if lifecycle.IsTerminalFailure(ti.FailureReason) {
			return ReleaseVerdict{}
		}
		var v ReleaseVerdict
		if ti.InfraConfirmedAt.IsZero() && !ti.InfraMarkedAt.IsZero() {
			opens := ti.InfraMarkedAt.Add(valve)
			if now.Before(opens) {
				return ReleaseVerdict{Wait: opens.Sub(now)}
			}
			v.ValveOpen = true
		}
		if ti.InfraUsed < ti.InfraBudget {
			v.Move = MoveReplace
		} else {
			v.Move = MoveBudgetSpent
		}
		return v
	}
	return ReleaseVerdict{}
}

// DispatchMove is what a failed dispatch (an agent that could not be
// started, a pod create that failed) calls for.
type DispatchMove int

const (
	// DispatchFail: the error will not pass by itself: dispatch_failed now.
	DispatchFail DispatchMove = iota
	// DispatchOfferAgain: a passing failure: the dispatch-failure backoff
	// rail (epoch+1, back to scheduled), offered again next cycle.
	DispatchOfferAgain
	// DispatchExhausted: a passing failure that has lasted the whole window:
	// dispatch_failed.
	DispatchExhausted
)

// DecideDispatchFailure judges a failed dispatch, as the specification
// judges a pod create error: a passing error is offered again under a new
// epoch, off the task's retries, for window from the task's first such
// failure (unavailableSince, zero before it), then fails as dispatch_failed;
// any other error fails as dispatch_failed at once. A dispatch_failed is
// terminal and spends no retry: clearing the task starts it over.
func DecideDispatchFailure(passing bool, unavailableSince, now time.Time, window time.Duration) DispatchMove {
	switch {
	case !passing:
		return DispatchFail
	case !unavailableSince.IsZero() && now.Sub(unavailableSince) >= window:
		return DispatchExhausted
	default:
		return DispatchOfferAgain
	}
}

package steps

import (
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
)

func TestDecideRelease(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)
	valve := 2 * time.Minute
	infra := func(edit func(*board.TaskInstance)) board.TaskInstance {
		ti := board.TaskInstance{State: sdk.StateFailed, LastFailureKind: sdk.FailureInfra, FailureReason: sdk.LabelAgentLost,
			InfraMarkedAt: now.Add(-time.Minute), InfraConfirmedAt: now.Add(-time.Minute), InfraBudget: 3, Retries: 1}
		if edit != nil {
			edit(&ti)
		}
		return ti
	}
	cases := map[string]struct {
		ti   board.TaskInstance
		want ReleaseVerdict
	}{
		"ATaskFailureWithRetriesLeftIsRetried": {
			ti:   board.TaskInstance{State: sdk.StateFailed, LastFailureKind: sdk.FailureTask, Retries: 1},
			want: ReleaseVerdict{Move: MoveRetry},
		},
		"ATaskFailureWithoutRetriesIsSettled": {
			ti: board.TaskInstance{State: sdk.StateFailed, LastFailureKind: sdk.FailureTask},
		},
		"AnAttemptParkedForARetryIsRetried": {
			ti:   board.TaskInstance{State: sdk.StateUpForRetry, Retries: 2},
			want: ReleaseVerdict{Move: MoveRetry},
		},
		"AnAttemptParkedForARetryWithoutRetriesFailsForGood": {
			ti:   board.TaskInstance{State: sdk.StateUpForRetry},
			want: ReleaseVerdict{Move: MoveRetriesSpent},
		},
		"AnAttemptParkedForARescheduleIsRescheduled": {
			ti:   board.TaskInstance{State: sdk.StateUpForReschedule},
			want: ReleaseVerdict{Move: MoveReschedule},
		},
		"AConfirmedInfraMarkIsReplaced": {
			ti:   infra(nil),
			want: ReleaseVerdict{Move: MoveReplace},
		},
		"AConfirmedInfraMarkWithItsBudgetSpentFailsForGood": {
			ti:   infra(func(ti *board.TaskInstance) { ti.InfraUsed = 3 }),
			want: ReleaseVerdict{Move: MoveBudgetSpent},
		},
		"AnUnconfirmedMarkInsideTheValveWaits": {
			ti:   infra(func(ti *board.TaskInstance) { ti.InfraConfirmedAt = time.Time{} }),
			want: ReleaseVerdict{Wait: time.Minute},
		},
		"AnUnconfirmedMarkAtTheValveIsReplacedWithTheValveOpen": {
			ti: infra(func(ti *board.TaskInstance) {
				ti.InfraConfirmedAt, ti.InfraMarkedAt = time.Time{}, now.Add(-valve)
			}),
			want: ReleaseVerdict{Move: MoveReplace, ValveOpen: true},
		},
		"AnUnconfirmedMarkPastTheValveWithItsBudgetSpentFailsForGood": {
			ti: infra(func(ti *board.TaskInstance) {
				ti.InfraConfirmedAt, ti.InfraMarkedAt, ti.InfraBudget = time.Time{}, now.Add(-time.Hour), 0
			}),
			want: ReleaseVerdict{Move: MoveBudgetSpent, ValveOpen: true},
		},
		"AnInfraMarkWithoutATimeCountsAsConfirmed": {
			ti:   infra(func(ti *board.TaskInstance) { ti.InfraConfirmedAt, ti.InfraMarkedAt = time.Time{}, time.Time{} }),
			want: ReleaseVerdict{Move: MoveReplace},
		},
		"AHeldAttemptIsNeverMoved": {
			ti: infra(func(ti *board.TaskInstance) { ti.HeldAt = now.Add(-time.Hour) }),
		},
		"AHeldTaskFailureIsNeverRetried": {
			ti: board.TaskInstance{State: sdk.StateFailed, LastFailureKind: sdk.FailureTask, Retries: 1, HeldAt: now},
		},
		"ATerminalInfraFailureIsSettled": {
			ti: infra(func(ti *board.TaskInstance) { ti.FailureReason = sdk.LabelDispatchFailed }),
		},
		"ASuccessIsSettled": {
			ti: board.TaskInstance{State: sdk.StateSuccess},
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if got := DecideRelease(c.ti, now, valve); got != c.want {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

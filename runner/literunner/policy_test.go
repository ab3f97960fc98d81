package literunner

import (
	"fmt"
	"os"
	"syscall"
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
		want releaseVerdict
	}{
		"ATaskFailureWithRetriesLeftIsRetried": {
			ti:   board.TaskInstance{State: sdk.StateFailed, LastFailureKind: sdk.FailureTask, Retries: 1},
			want: releaseVerdict{move: moveRetry},
		},
		"ATaskFailureWithoutRetriesIsSettled": {
			ti: board.TaskInstance{State: sdk.StateFailed, LastFailureKind: sdk.FailureTask},
		},
		"AnAttemptParkedForARetryIsRetried": {
			ti:   board.TaskInstance{State: sdk.StateUpForRetry, Retries: 2},
			want: releaseVerdict{move: moveRetry},
		},
		"AnAttemptParkedForARetryWithoutRetriesFailsForGood": {
			ti:   board.TaskInstance{State: sdk.StateUpForRetry},
			want: releaseVerdict{move: moveRetriesSpent},
		},
		"AnAttemptParkedForARescheduleIsRescheduled": {
			ti:   board.TaskInstance{State: sdk.StateUpForReschedule},
			want: releaseVerdict{move: moveReschedule},
		},
		"AConfirmedInfraMarkIsReplaced": {
			ti:   infra(nil),
			want: releaseVerdict{move: moveReplace},
		},
		"AConfirmedInfraMarkWithItsBudgetSpentFailsForGood": {
			ti:   infra(func(ti *board.TaskInstance) { ti.InfraUsed = 3 }),
			want: releaseVerdict{move: moveBudgetSpent},
		},
		"AnUnconfirmedMarkInsideTheValveWaits": {
			ti:   infra(func(ti *board.TaskInstance) { ti.InfraConfirmedAt = time.Time{} }),
			want: releaseVerdict{wait: time.Minute},
		},
		"AnUnconfirmedMarkAtTheValveIsReplacedWithTheValveOpen": {
			ti: infra(func(ti *board.TaskInstance) {
				ti.InfraConfirmedAt, ti.InfraMarkedAt = time.Time{}, now.Add(-valve)
			}),
			want: releaseVerdict{move: moveReplace, valveOpen: true},
		},
		"AnUnconfirmedMarkPastTheValveWithItsBudgetSpentFailsForGood": {
			ti: infra(func(ti *board.TaskInstance) {
				ti.InfraConfirmedAt, ti.InfraMarkedAt, ti.InfraBudget = time.Time{}, now.Add(-time.Hour), 0
			}),
			want: releaseVerdict{move: moveBudgetSpent, valveOpen: true},
		},
		"AnInfraMarkWithoutATimeCountsAsConfirmed": {
			ti:   infra(func(ti *board.TaskInstance) { ti.InfraConfirmedAt, ti.InfraMarkedAt = time.Time{}, time.Time{} }),
			want: releaseVerdict{move: moveReplace},
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
			if got := decideRelease(c.ti, now, valve); got != c.want {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestDecideSpawnFailure(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)
	window := 15 * time.Minute
	missing := fmt.Errorf("spawning the agent: %w", &os.PathError{Op: "fork/exec", Path: "/x/reaper-agent", Err: syscall.ENOENT})
	short := fmt.Errorf("spawning the agent: %w", &os.PathError{Op: "fork/exec", Path: "/x/reaper-agent", Err: syscall.EAGAIN})
	full := fmt.Errorf("spawning the agent: recording the agent: %w", &os.PathError{Op: "write", Path: "/r/x.pid", Err: syscall.ENOSPC})
	cases := map[string]struct {
		err   error
		since time.Time
		want  spawnMove
	}{
		"AMissingBinaryFailsAtOnce":                   {err: missing, want: spawnFail},
		"AnErrorWithoutAnErrnoFailsAtOnce":            {err: fmt.Errorf("-command is required"), want: spawnFail},
		"AProcessShortageIsOfferedAgain":              {err: short, want: spawnOfferAgain},
		"AFullDiskIsOfferedAgain":                     {err: full, since: now.Add(-time.Minute), want: spawnOfferAgain},
		"AShortageThatLastedTheWindowFails":           {err: short, since: now.Add(-window), want: spawnExhausted},
		"AMissingBinaryFailsAtOnceEvenInsideAnOutage": {err: missing, since: now.Add(-time.Minute), want: spawnFail},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if got := decideSpawnFailure(c.err, c.since, now, window); got != c.want {
				t.Fatalf("got %v, want %v", got, c.want)
			}
		})
	}
}

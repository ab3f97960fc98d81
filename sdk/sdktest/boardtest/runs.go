package boardtest

import (
	"slices"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// orphanAfter is the orphan threshold of the cases: activity older than
// five minutes before T0.
func orphanAfter() time.Time { return at(-5 * time.Minute) }

// settledRun seeds a running run whose one task succeeded an hour ago: an
// orphan by every measure.
func settledRun(f Fixture, runID string) {
	f.Put(Row{Attempt: attempt(runID, "done"), State: sdk.StateSuccess, QueuedAt: at(-2 * time.Hour),
		RunningAt: at(-2 * time.Hour), EndedAt: at(-time.Hour)})
}

// valveCutoff is the infra confirmation valve's cutoff of the cases: a
// provisional mark made two minutes or more before T0 is past the valve.
func valveCutoff() time.Time { return at(-2 * time.Minute) }

func orphans(t *testing.T, f Fixture) []string {
	t.Helper()
	return orphansPast(t, f, time.Time{})
}

// orphansPast lists the orphans with the valve's cutoff provisionalAfter.
func orphansPast(t *testing.T, f Fixture, provisionalAfter time.Time) []string {
	t.Helper()
	page, err := f.Board().ListOrphanRuns(t.Context(), sdk.RunQuery{OlderThan: orphanAfter(),
		ProvisionalAfter: provisionalAfter})
	if err != nil {
		t.Fatal(err)
	}
	return runKeys(page.Runs)
}

// reapPast reaps the run with the valve's cutoff provisionalAfter.
func reapPast(t *testing.T, f Fixture, runID string, provisionalAfter time.Time) sdk.RunReapResult {
	t.Helper()
	res, err := f.Board().ReapRun(t.Context(), sdk.RunReap{RunID: runID, OlderThan: orphanAfter(),
		ProvisionalAfter: provisionalAfter, Term: f.Term(), At: at(0), Message: "orphaned"})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// lostDispatch seeds an attempt queued at queuedAt whose dispatch a reaper
// marked lost at markedAt (ended and infra-marked then), confirmed at once
// when confirmed (Lite), with budget and used as its infra re-places.
func lostDispatch(f Fixture, runID, taskID string, queuedAt, markedAt time.Time, confirmed bool, budget, used int32) sdk.Attempt {
	a := attempt(runID, taskID)
	r := Row{Attempt: a, State: sdk.StateFailed, QueuedAt: queuedAt, EndedAt: markedAt,
		LastFailureKind: sdk.FailureInfra, FailureReason: sdk.LabelDispatchLost, InfraMarkedAt: markedAt,
		ErrorMessage: sdk.LabelDispatchLost, InfraBudget: budget, InfraUsed: used}
	if confirmed {
		r.InfraConfirmedAt = markedAt
	}
	f.Put(r)
	return a
}

func reap(t *testing.T, f Fixture, runID string) sdk.RunReapResult {
	t.Helper()
	return reapAs(t, f, runID, f.Term())
}

// reapAs reaps the run under term.
func reapAs(t *testing.T, f Fixture, runID string, term int64) sdk.RunReapResult {
	t.Helper()
	res, err := f.Board().ReapRun(t.Context(), sdk.RunReap{RunID: runID, OlderThan: orphanAfter(), Term: term,
		At: at(0), Message: "orphaned"})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func orphanCases() map[string]func(t *testing.T, f Fixture) {
	cases := map[string]func(t *testing.T, f Fixture){
		"RunWithNothingLiveIsListedOldestActivityFirst": func(t *testing.T, f Fixture) {
			settledRun(f, "b")
			settledRun(f, "a")
			f.Put(Row{Attempt: attempt("c", "t"), State: sdk.StateFailed, LastFailureKind: sdk.FailureTask,
				EndedAt: at(-2 * time.Hour)})
			if got := orphans(t, f); !slices.Equal(got, []string{"c", "a", "b"}) {
				t.Fatalf("orphans %v", got)
			}
		},
		"ConfirmedInfraMarkDoesNotKeepTheRunAlive": func(t *testing.T, f Fixture) {
			a := provisional(f, "run", "t", sdk.LabelPodLost, at(-time.Hour))
			r := row(t, f, a)
			r.InfraConfirmedAt = at(-59 * time.Minute)
			f.Put(r)
			if got := orphans(t, f); !slices.Equal(got, []string{"run"}) {
				t.Fatalf("orphans %v", got)
			}
		},
		// A dispatch-lost mark made a minute ago on an attempt queued six
		// minutes ago: the mark is the reaper's, not the run's activity,
		// so the run is measured from the queueing and is an orphan now.
		"InfraMarkIsNotRunActivity": func(t *testing.T, f Fixture) {
			lostDispatch(f, "run", "t", at(-6*time.Minute), at(-time.Minute), true, 1, 1)
			if got := orphans(t, f); !slices.Equal(got, []string{"run"}) {
				t.Fatalf("orphans %v", got)
			}
			if res := reap(t, f, "run"); !res.Applied {
				t.Fatalf("reap %+v", res)
			}
		},
		"EndOfAnAttemptIsRunActivity": func(t *testing.T, f Fixture) {
			f.Put(Row{Attempt: attempt("run", "t"), State: sdk.StateFailed, LastFailureKind: sdk.FailureTask,
				QueuedAt: at(-time.Hour), EndedAt: at(-time.Minute)})
			if got := orphans(t, f); len(got) != 0 {
				t.Fatalf("orphans %v", got)
			}
			noopReap(t, f, "run", sdk.NoopActive)
		},
		"InfraMarkWithTheBudgetSpentDoesNotKeepTheRunAlive": func(t *testing.T, f Fixture) {
			lostDispatch(f, "run", "t", at(-time.Hour), at(-50*time.Minute), true, 3, 3)
			if got := orphansPast(t, f, valveCutoff()); !slices.Equal(got, []string{"run"}) {
				t.Fatalf("orphans %v", got)
			}
			if res := reapPast(t, f, "run", valveCutoff()); !res.Applied {
				t.Fatalf("reap %+v", res)
			}
		},
		// The valve bounds a provisional mark: inside it the mark holds
		// the run; past it (budget spent) it does not; with no cutoff it
		// holds the run as before.
		"ProvisionalMarkInsideTheValveKeepsTheRunAlive": func(t *testing.T, f Fixture) {
			lostDispatch(f, "run", "t", at(-time.Hour), at(-time.Minute), false, 0, 0)
			if got := orphansPast(t, f, valveCutoff()); len(got) != 0 {
				t.Fatalf("orphans %v", got)
			}
			if res := reapPast(t, f, "run", valveCutoff()); res.Applied || res.NoopReason != sdk.NoopActive {
				t.Fatalf("reap %+v, want a no-op for %s", res, sdk.NoopActive)
			}
		},
		"ProvisionalMarkPastTheValveDoesNotKeepTheRunAlive": func(t *testing.T, f Fixture) {
			lostDispatch(f, "run", "t", at(-time.Hour), at(-2*time.Minute), false, 0, 0)
			if got := orphans(t, f); len(got) != 0 {
				t.Fatalf("no cutoff: orphans %v", got)
			}
			if got := orphansPast(t, f, valveCutoff()); !slices.Equal(got, []string{"run"}) {
				t.Fatalf("orphans %v", got)
			}
			if res := reapPast(t, f, "run", valveCutoff()); !res.Applied {
				t.Fatalf("reap %+v", res)
			}
		},
		"RecentActivityKeepsTheRunAlive": func(t *testing.T, f Fixture) {
			settledRun(f, "run")
			f.Put(Row{Attempt: attempt("run", "released"), State: sdk.StateNone, ReleasedAt: at(-time.Minute)})
			if got := orphans(t, f); len(got) != 0 {
				t.Fatalf("orphans %v", got)
			}
			noopReap(t, f, "run", sdk.NoopActive)
		},
		"FinishedRunIsNotAnOrphan": func(t *testing.T, f Fixture) {
			f.PutRun(RunRow{RunID: "run", State: sdk.RunFailed, StartedAt: at(-24 * time.Hour)})
			settledRun(f, "run")
			if got := orphans(t, f); len(got) != 0 {
				t.Fatalf("orphans %v", got)
			}
			noopReap(t, f, "run", sdk.NoopMovedOn)
		},
		"ReapFailsTheRunAndNamesTheAttached": func(t *testing.T, f Fixture) {
			settledRun(f, "run")
			f.Put(Row{Attempt: attempt("run", "lost"), State: sdk.StateFailed, LastFailureKind: sdk.FailureTask,
				QueuedAt: at(-3 * time.Hour), EndedAt: at(-2 * time.Hour)})
			res := reap(t, f, "run")
			if !res.Applied || len(res.Attached) != 1 || res.Attached[0] != attempt("run", "lost") {
				t.Fatalf("reap %+v", res)
			}
			if st := f.RunState("run"); st != sdk.RunFailed {
				t.Fatalf("run %s after its reap", st)
			}
		},
		"ReapOfALockedRunIsANoop": func(t *testing.T, f Fixture) {
			settledRun(f, "run")
			f.LockRun("run")
			noopReap(t, f, "run", sdk.NoopLocked)
		},
		"ReapUnderADeposedTermIsANoop": func(t *testing.T, f Fixture) {
			settledRun(f, "run")
			term := f.Term()
			f.Depose()
			if res := reapAs(t, f, "run", term); res.Applied || res.NoopReason != sdk.NoopDeposed {
				t.Fatalf("reap %+v, want a no-op for deposed", res)
			}
			if st := f.RunState("run"); st != sdk.RunRunning {
				t.Fatalf("a deposed reap moved the run to %s", st)
			}
		},
		"ReapUnderAnExpiredLeaseIsANoop": func(t *testing.T, f Fixture) {
			settledRun(f, "run")
			f.ExpireLease(at(0))
			noopReap(t, f, "run", sdk.NoopDeposed)
		},
		"ReapOfAMissingRunIsNotFound": func(t *testing.T, f Fixture) {
			noopReap(t, f, "ghost", sdk.NoopNotFound)
		},
	}
	// Each live row keeps its run alive, on the listing and on the atomic
	// re-check of the reap (both with the valve's cutoff): a row that moved
	// there after the listing makes the reap a no-op.
	live := map[string]Row{
		"Held": {State: sdk.StateFailed, LastFailureKind: sdk.FailureInfra, InfraMarkedAt: at(-time.Hour),
			InfraConfirmedAt: at(-time.Hour), EndedAt: at(-time.Hour), Held: true},
		"ProvisionalInfraMarkInsideTheValve": {State: sdk.StateFailed, LastFailureKind: sdk.FailureInfra,
			InfraMarkedAt: at(-time.Minute), EndedAt: at(-time.Minute)},
		// An infra failure with budget left is re-placed by the planner:
		// it waits like a parked up_for_retry, confirmed or not, past
		// the valve or not.
		"ReplaceableInfraMark/Confirmed": {State: sdk.StateFailed, LastFailureKind: sdk.FailureInfra,
			InfraMarkedAt: at(-time.Hour), InfraConfirmedAt: at(-time.Hour), EndedAt: at(-time.Hour),
			InfraBudget: 3, InfraUsed: 2},
		"ReplaceableInfraMark/Provisional": {State: sdk.StateFailed, LastFailureKind: sdk.FailureInfra,
			InfraMarkedAt: at(-time.Hour), EndedAt: at(-time.Hour), InfraBudget: 1},
	}
	for _, st := range sdk.LiveStates() {
		live["State_"+st] = Row{State: st, EndedAt: at(-time.Hour)}
	}
	for name, r := range live {
		cases["LiveRowKeepsTheRunAlive/"+name] = func(t *testing.T, f Fixture) {
			settledRun(f, "run")
			if got := orphans(t, f); !slices.Equal(got, []string{"run"}) {
				t.Fatalf("before: orphans %v", got)
			}
			r.Attempt = attempt("run", "live")
			f.Put(r) // moved after the listing
			if got := orphansPast(t, f, valveCutoff()); len(got) != 0 {
				t.Fatalf("orphans %v", got)
			}
			if res := reapPast(t, f, "run", valveCutoff()); res.Applied || res.NoopReason != sdk.NoopActive {
				t.Fatalf("reap %+v, want a no-op for %s", res, sdk.NoopActive)
			}
		}
	}
	return cases
}

// noopReap asserts that a reap of the run is a no-op for reason and left
// the run as it was.
func noopReap(t *testing.T, f Fixture, runID, reason string) {
	t.Helper()
	before := f.RunState(runID)
	if res := reap(t, f, runID); res.Applied || res.NoopReason != reason {
		t.Fatalf("reap %+v, want a no-op for %q", res, reason)
	}
	if after := f.RunState(runID); after != before {
		t.Fatalf("a no-op reap moved the run from %q to %q", before, after)
	}
}

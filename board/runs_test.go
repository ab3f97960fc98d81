package board_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
)

func TestOrphanRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	orphanAfter := 5 * time.Minute
	threshold := base.Add(-orphanAfter)

	// quietRun makes a running run whose only task succeeded (and so went
	// quiet) at endedAt.
	quietRun := func(t *testing.T, b *bundle, runID string, endedAt time.Time) sdk.Attempt {
		t.Helper()
		b.run(t, runID, "task")
		a := first(runID, "task")
		b.running(t, a, endedAt.Add(-time.Minute), endedAt.Add(-30*time.Second))
		if stop, err := b.w.Report(ctx, a, lifecycleSuccess, endedAt); err != nil || stop {
			t.Fatal(stop, err)
		}
		return a
	}
	list := func(t *testing.T, b *bundle) []string {
		t.Helper()
		p, err := b.store.ListOrphanRuns(ctx, sdk.RunQuery{OlderThan: threshold})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range p.Runs {
			ids = append(ids, r.RunID)
		}
		return ids
	}
	reap := func(t *testing.T, b *bundle, runID string) sdk.RunReapResult {
		t.Helper()
		res, err := b.store.ReapRun(ctx, sdk.RunReap{RunID: runID, OlderThan: threshold, Term: b.term, At: base,
			Message: "orphan_run: nothing live for 5m"})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	assertNoop := func(t *testing.T, b *bundle, runID, reason string) {
		t.Helper()
		res := reap(t, b, runID)
		if res.Applied || res.NoopReason != reason {
			t.Fatalf("reap = %+v, want a no-op for %q", res, reason)
		}
		r, err := b.store.Run(ctx, runID)
		if err != nil {
			t.Fatal(err)
		}
		if r.State != sdk.RunRunning {
			t.Fatalf("a no-op reap wrote the run: %+v", r)
		}
	}

	t.Run("ReapsAQuietRunWithNothingLive", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		quietRun(t, b, "run", base.Add(-10*time.Minute))
		if got := list(t, b); len(got) != 1 || got[0] != "run" {
			t.Fatalf("listed %v, want [run]", got)
		}
		res := reap(t, b, "run")
		if !res.Applied || len(res.Attached) != 0 {
			t.Fatalf("reap = %+v, want applied with nothing attached", res)
		}
		r, err := b.store.Run(ctx, "run")
		if err != nil {
			t.Fatal(err)
		}
		if r.State != sdk.RunFailed || !r.EndedAt.Equal(base) || r.ErrorMessage == "" {
			t.Fatalf("run after the reap: %+v", r)
		}
		if got := list(t, b); len(got) != 0 {
			t.Fatalf("a failed run is still listed: %v", got)
		}
	})

	t.Run("ReturnsTheAttemptsStillAttached", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, "run", "lost", "done", "never")
		b.spendInfraBudget(t, "run")
		lost := first("run", "lost")
		b.running(t, lost, base.Add(-20*time.Minute), base.Add(-19*time.Minute))
		if _, err := b.store.Mark(ctx, []sdk.Mark{{Attempt: lost, FromStates: []string{sdk.StateRunning},
			Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost, Confirm: true, Term: b.term, At: base.Add(-10 * time.Minute)}}); err != nil {
			t.Fatal(err)
		}
		b.running(t, first("run", "done"), base.Add(-20*time.Minute), time.Time{})
		if stop, err := b.w.Report(ctx, first("run", "done"), lifecycleSuccess, base.Add(-15*time.Minute)); err != nil || stop {
			t.Fatal(stop, err)
		}
		res := reap(t, b, "run")
		if !res.Applied || len(res.Attached) != 1 || res.Attached[0] != lost {
			t.Fatalf("reap = %+v, want applied with %s attached", res, lost)
		}
	})

	t.Run("OldestActivityFirstWithKeysetPaging", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		quietRun(t, b, "c", base.Add(-30*time.Minute))
		quietRun(t, b, "a", base.Add(-10*time.Minute))
		quietRun(t, b, "b", base.Add(-20*time.Minute))
		quietRun(t, b, "fresh", base.Add(-time.Minute))
		p1, err := b.store.ListOrphanRuns(ctx, sdk.RunQuery{OlderThan: threshold, Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		if len(p1.Runs) != 2 || p1.Runs[0].RunID != "c" || p1.Runs[1].RunID != "b" || p1.Next == nil {
			t.Fatalf("first page %+v", p1)
		}
		if !p1.Runs[0].LastActivity.Equal(base.Add(-30 * time.Minute)) {
			t.Fatalf("last activity of c = %v, want its task's end", p1.Runs[0].LastActivity)
		}
		p2, err := b.store.ListOrphanRuns(ctx, sdk.RunQuery{OlderThan: threshold, Limit: 2, After: p1.Next})
		if err != nil {
			t.Fatal(err)
		}
		if len(p2.Runs) != 1 || p2.Runs[0].RunID != "a" || p2.Next != nil {
			t.Fatalf("second page %+v, want only a and no cursor", p2)
		}
	})

	// What keeps a run alive: each case leaves the run's one task instance in
	// a state that must hold the reaper off, with all activity long past.
	keepsAlive := map[string]func(t *testing.T, b *bundle, a sdk.Attempt){
		"UpForRetry": func(t *testing.T, b *bundle, a sdk.Attempt) {
			b.running(t, a, base.Add(-time.Hour), time.Time{})
			report(t, b, a, lifecycle.TerminalReport{State: sdk.StateUpForRetry, Message: "exit 1"}, base.Add(-50*time.Minute))
		},
		"UpForReschedule": func(t *testing.T, b *bundle, a sdk.Attempt) {
			b.sensor(t, a)
			b.running(t, a, base.Add(-time.Hour), time.Time{})
			report(t, b, a, lifecycle.TerminalReport{State: sdk.StateUpForReschedule}, base.Add(-50*time.Minute))
		},
		"Deferred": func(t *testing.T, b *bundle, a sdk.Attempt) {
			b.exec(t, "UPDATE task_instances SET state = 'deferred' WHERE run_id = $1", a.RunID)
		},
		"Scheduled": func(t *testing.T, b *bundle, a sdk.Attempt) {
			if ok, err := b.w.Enqueue(ctx, a, base.Add(-time.Hour)); err != nil || !ok {
				t.Fatal(ok, err)
			}
		},
		"ProvisionalInfraMark": func(t *testing.T, b *bundle, a sdk.Attempt) {
			b.running(t, a, base.Add(-time.Hour), base.Add(-59*time.Minute))
			mark(t, b, sdk.Mark{Attempt: a, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
				Reason: sdk.LabelPodLost, Term: b.term, At: base.Add(-50 * time.Minute)})
		},
		"HeldAttempt": func(t *testing.T, b *bundle, a sdk.Attempt) {
			b.running(t, a, base.Add(-time.Hour), base.Add(-59*time.Minute))
			mark(t, b, sdk.Mark{Attempt: a, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
				Reason: sdk.LabelAgentLost, Confirm: true, Hold: true, Term: b.term, At: base.Add(-50 * time.Minute)})
		},
	}
	for name, leave := range keepsAlive {
		t.Run(name+"KeepsTheRunAlive", func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.run(t, "run", "task")
			leave(t, b, first("run", "task"))
			if got := list(t, b); len(got) != 0 {
				t.Fatalf("listed %v: the run looked orphaned", got)
			}
			assertNoop(t, b, "run", sdk.NoopActive)
		})
	}

	// A dispatch that failed for good is a terminal infra failure: it spends
	// the infra budget, so nothing will re-place it and the run is an
	// orphan once quiet, whatever budget the task was given.
	t.Run("TerminalInfraFailureSpendsTheBudgetAndDoesNotKeepTheRunAlive", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, "run", "task")
		a := first("run", "task")
		b.queued(t, a, base.Add(-time.Hour))
		if ok, err := b.w.Fail(ctx, a, []string{sdk.StateQueued}, lifecycle.Failure{Kind: sdk.MarkInfra,
			Reason: sdk.LabelDispatchFailed, Message: "dispatch_failed: no record", Terminal: true, Confirm: true},
			base.Add(-50*time.Minute)); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if got := list(t, b); len(got) != 1 {
			t.Fatalf("listed %v, want the run", got)
		}
		if res := reap(t, b, "run"); !res.Applied {
			t.Fatalf("reap = %+v", res)
		}
	})

	t.Run("ConfirmedInfraMarkWithTheBudgetSpentAndNoneDoNotKeepTheRunAlive", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, "run", "marked", "waiting")
		b.spendInfraBudget(t, "run")
		a := first("run", "marked")
		b.running(t, a, base.Add(-time.Hour), base.Add(-59*time.Minute))
		mark(t, b, sdk.Mark{Attempt: a, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
			Reason: sdk.LabelAgentLost, Confirm: true, Term: b.term, At: base.Add(-50 * time.Minute)})
		if got := list(t, b); len(got) != 1 {
			t.Fatalf("listed %v, want the run", got)
		}
		if res := reap(t, b, "run"); !res.Applied {
			t.Fatalf("reap = %+v", res)
		}
	})

	t.Run("ReleaseCountsAsActivity", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, "run", "task")
		a := first("run", "task")
		b.running(t, a, base.Add(-time.Hour), time.Time{})
		report(t, b, a, lifecycle.TerminalReport{State: sdk.StateUpForRetry}, base.Add(-50*time.Minute))
		// Released back to none a minute ago: not live, but fresh.
		if rel, err := b.w.Retry(ctx, a, base.Add(-time.Minute)); err != nil || !rel.Applied {
			t.Fatal(rel, err)
		}
		if got := list(t, b); len(got) != 0 {
			t.Fatalf("listed %v right after a release", got)
		}
		assertNoop(t, b, "run", sdk.NoopActive)
	})

	t.Run("TaskMovingToUpForRetryAfterTheListingMakesTheReapANoop", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, "run", "task")
		a := first("run", "task")
		b.running(t, a, base.Add(-time.Hour), time.Time{})
		report(t, b, a, lifecycle.TerminalReport{State: sdk.StateFailed, Message: "exit 1"}, base.Add(-50*time.Minute))
		if got := list(t, b); len(got) != 1 {
			t.Fatalf("listed %v, want the run", got)
		}
		// The scheduler's failure handling parks the task for its retry.
		b.exec(t, "UPDATE task_instances SET state = 'up_for_retry' WHERE run_id = 'run'")
		assertNoop(t, b, "run", sdk.NoopActive)
	})

	t.Run("FreshHeartbeatAfterTheListingMakesTheReapANoop", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, "run", "done", "next")
		b.running(t, first("run", "done"), base.Add(-time.Hour), time.Time{})
		report(t, b, first("run", "done"), lifecycleSuccess, base.Add(-50*time.Minute))
		if got := list(t, b); len(got) != 1 {
			t.Fatalf("listed %v, want the run", got)
		}
		// The next task is dispatched, starts and heartbeats meanwhile.
		b.running(t, first("run", "next"), base.Add(-20*time.Second), base.Add(-10*time.Second))
		assertNoop(t, b, "run", sdk.NoopActive)
	})

	t.Run("FreshActivityOnASettledTaskMakesTheReapANoop", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		quietRun(t, b, "run", base.Add(-time.Hour))
		if got := list(t, b); len(got) != 1 {
			t.Fatalf("listed %v, want the run", got)
		}
		b.exec(t, "UPDATE task_instances SET last_heartbeat_at = $1 WHERE run_id = 'run'", base.Add(-time.Second))
		assertNoop(t, b, "run", sdk.NoopActive)
	})

	t.Run("LockedTaskInstanceMakesTheReapANoopWithoutWaiting", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		quietRun(t, b, "run", base.Add(-time.Hour))
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		if _, err := tx.Exec(ctx, "UPDATE task_instances SET updated_at = updated_at WHERE run_id = 'run'"); err != nil {
			t.Fatal(err)
		}
		// A reap that waited for the lock would hit this deadline.
		short, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		res, err := b.store.ReapRun(short, sdk.RunReap{RunID: "run", OlderThan: threshold, Term: b.term, At: base})
		if err != nil {
			t.Fatal(err)
		}
		if res.Applied || res.NoopReason != sdk.NoopLocked {
			t.Fatalf("reap = %+v, want a no-op for a locked row", res)
		}
	})

	t.Run("LockedRunMakesTheReapANoopWithoutWaiting", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		quietRun(t, b, "run", base.Add(-time.Hour))
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		if _, err := tx.Exec(ctx, "SELECT 1 FROM runs WHERE run_id = 'run' FOR UPDATE"); err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		res, err := b.store.ReapRun(short, sdk.RunReap{RunID: "run", OlderThan: threshold, Term: b.term, At: base})
		if err != nil {
			t.Fatal(err)
		}
		if res.Applied || res.NoopReason != sdk.NoopLocked {
			t.Fatalf("reap = %+v, want a no-op for a locked row", res)
		}
	})

	t.Run("DeposedTermMakesTheReapANoop", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		quietRun(t, b, "run", base.Add(-time.Hour))
		if ok, err := b.store.Resign(ctx, b.term, "test-leader"); err != nil || !ok {
			t.Fatal(ok, err)
		}
		assertNoop(t, b, "run", sdk.NoopDeposed)
	})

	t.Run("FinishedOrUnknownRunIsANoop", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		quietRun(t, b, "run", base.Add(-time.Hour))
		if ok, err := b.w.FinishRun(ctx, "run", sdk.RunSuccess, "", base.Add(-time.Minute)); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if res := reap(t, b, "run"); res.Applied || res.NoopReason != sdk.NoopMovedOn {
			t.Fatalf("reap of a finished run = %+v", res)
		}
		if res := reap(t, b, "nope"); res.Applied || res.NoopReason != sdk.NoopNotFound {
			t.Fatalf("reap of an unknown run = %+v", res)
		}
	})

	t.Run("RecentlyStartedRunIsNotOrphaned", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if err := b.w.CreateRun(ctx, lifecycle.NewRun{RunID: "run", DagID: "dag",
			Tasks: []lifecycle.NewTask{{TaskID: "t", Executor: sdk.ExecutorLite}}}, base.Add(-time.Minute)); err != nil {
			t.Fatal(err)
		}
		if got := list(t, b); len(got) != 0 {
			t.Fatalf("listed %v one minute after its start", got)
		}
		assertNoop(t, b, "run", sdk.NoopActive)
	})
}

func report(t *testing.T, b *bundle, a sdk.Attempt, o lifecycle.TerminalReport, at time.Time) {
	t.Helper()
	if stop, err := b.w.Report(context.Background(), a, o, at); err != nil || stop {
		t.Fatalf("report %s %s: stop=%v err=%v", a, o.State, stop, err)
	}
}

func mark(t *testing.T, b *bundle, m sdk.Mark) {
	t.Helper()
	res, err := b.store.Mark(context.Background(), []sdk.Mark{m})
	if err != nil || !res[0].Applied {
		t.Fatalf("mark %s: %+v %v", m.Attempt, res, err)
	}
}

// The orphan-run listing starts from the not-live task instances of
// unfinished runs (migration 002); finishing a run closes its rows in the
// same statement, and a healthy population never enters the listing's index.
func TestOrphanCandidatesIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	closed := func(t *testing.T, b *bundle, runID string) (open, all int) {
		t.Helper()
		if err := b.store.Pool().QueryRow(ctx, `SELECT count(*) FILTER (WHERE NOT run_closed), count(*)
            FROM task_instances WHERE run_id = $1`, runID).Scan(&open, &all); err != nil {
			t.Fatal(err)
		}
		return open, all
	}

	t.Run("FinishingARunClosesItsTaskInstances", func(t *testing.T) {
		b := setup(t)
		b.run(t, "fin", "a", "b")
		if open, all := closed(t, b, "fin"); open != 2 || all != 2 {
			t.Fatalf("open %d of %d before the finish", open, all)
		}
		if ok, err := b.w.FinishRun(ctx, "fin", sdk.RunFailed, "stopped", base); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if open, _ := closed(t, b, "fin"); open != 0 {
			t.Fatalf("%d rows still open after the run finished", open)
		}
		if ok, err := b.w.FinishRun(ctx, "fin", sdk.RunFailed, "again", base); err != nil || ok {
			t.Fatalf("finishing a finished run: %v %v", ok, err)
		}
	})

	t.Run("ReapingARunClosesItsTaskInstances", func(t *testing.T) {
		b := setup(t)
		b.run(t, "quiet", "task")
		a := first("quiet", "task")
		b.running(t, a, base.Add(-time.Hour), base.Add(-time.Hour))
		if stop, err := b.w.Report(ctx, a, lifecycleSuccess, base.Add(-50*time.Minute)); err != nil || stop {
			t.Fatal(stop, err)
		}
		res, err := b.store.ReapRun(ctx, sdk.RunReap{RunID: "quiet", OlderThan: base.Add(-5 * time.Minute),
			Term: b.term, At: base, Message: "orphan_run"})
		if err != nil || !res.Applied {
			t.Fatalf("reap = %+v, %v", res, err)
		}
		if open, _ := closed(t, b, "quiet"); open != 0 {
			t.Fatalf("%d rows still open after the reap", open)
		}
	})

	t.Run("HealthyRunsNeverEnterTheIndex", func(t *testing.T) {
		b := setup(t)
		for i := 0; i < 50; i++ {
			runID := id("healthy", i)
			b.run(t, runID, "task")
			b.running(t, first(runID, "task"), base.Add(-time.Hour), base.Add(-10*time.Second))
		}
		var n int
		if err := b.store.Pool().QueryRow(ctx, `SELECT count(*) FROM task_instances ti WHERE NOT ti.run_closed
            AND ti.state IN ('none', 'success', 'failed', 'skipped', 'upstream_failed') AND ti.held_at IS NULL`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatalf("%d healthy rows would be orphan candidates", n)
		}
		p, err := b.store.ListOrphanRuns(ctx, sdk.RunQuery{OlderThan: base.Add(-5 * time.Minute)})
		if err != nil || len(p.Runs) != 0 {
			t.Fatalf("listed %+v, %v", p.Runs, err)
		}
	})
}

// The orphan-run listing starts from task_instances_open_settled_idx, with
// the valve's cutoff as with none: over many healthy running runs and a few
// settled ones, the plan reads the index, never the whole table.
func TestOrphanListingUsesTheOpenSettledIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for _, s := range []string{
		`INSERT INTO runs (run_id, dag_id, state, started_at, updated_at)
         SELECT 'run' || lpad(r::text, 6, '0'), 'dag', 'running', $1::timestamptz - interval '1 day', $1
         FROM generate_series(0, 999) r`,
		`INSERT INTO task_instances (run_id, task_id, executor, state, queued_at, running_at, last_heartbeat_at,
             ended_at, last_failure_kind, infra_marked_at, updated_at)
         SELECT 'run' || lpad((i / 100)::text, 6, '0'), 'task' || lpad((i % 100)::text, 3, '0'), 'lite',
             CASE WHEN i < 50 THEN 'failed' ELSE 'running' END, $1::timestamptz - interval '1 hour',
             $1::timestamptz - interval '59 minutes', $1::timestamptz - interval '58 minutes',
             CASE WHEN i < 50 THEN $1::timestamptz - interval '50 minutes' END,
             CASE WHEN i < 50 THEN 'infra' END, CASE WHEN i < 50 THEN $1::timestamptz - interval '50 minutes' END, $1
         FROM generate_series(0, 99999) i`,
	} {
		if _, err := b.pool.Exec(ctx, s, base); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.pool.Exec(ctx, "ANALYZE"); err != nil {
		t.Fatal(err)
	}
	for name, cutoff := range map[string]time.Time{"NoCutoff": {}, "ValveCutoff": base.Add(-2 * time.Minute)} {
		t.Run(name, func(t *testing.T) {
			sql, args := board.OrphanRunsSQL(sdk.RunQuery{OlderThan: base.Add(-5 * time.Minute), ProvisionalAfter: cutoff})
			var plan string
			if err := b.pool.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+sql, args...).Scan(&plan); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(plan, `"task_instances_open_settled_idx"`) {
				t.Fatalf("the listing does not read task_instances_open_settled_idx:\n%s", plan)
			}
			for _, n := range planNodes(plan) {
				if n["Node Type"] == "Seq Scan" && n["Relation Name"] == "task_instances" {
					t.Fatalf("the listing scans task_instances:\n%s", plan)
				}
			}
		})
	}
}

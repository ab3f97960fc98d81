package board_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
)

var owedBackoff = board.TeardownBackoff{Base: 30 * time.Second, Cap: 5 * time.Minute}

func TestTeardownBackoff(t *testing.T) {
	t.Parallel()
	want := []time.Duration{30 * time.Second, time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute, 5 * time.Minute}
	for i, w := range want {
		if got := owedBackoff.After(i + 1); got != w {
			t.Errorf("DoublesFromOneBaseUpToTheCap: after try %d: %s, want %s", i+1, got, w)
		}
	}
	if got := owedBackoff.After(1000); got != owedBackoff.Cap {
		t.Errorf("ManyTriesStayAtTheCap: %s", got)
	}
}

func TestOwedTeardowns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	failure := func(b *bundle, a sdk.Attempt, at time.Time, why string) board.TeardownFailure {
		return board.TeardownFailure{RunID: a.RunID, Attempt: &a, Reaper: "agentlost", Label: sdk.LabelAgentLostPodDeleteErr,
			Reason: sdk.LabelAgentLost, Error: why, At: at, Term: b.term}
	}

	t.Run("FirstFailure_DueOneBaseLaterWithThePodUID", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.runWith(t, "r1", sdk.ExecutorKube, "t")
		a := first("r1", "t")
		b.exec(t, "UPDATE task_instances SET pod_uid = 'uid-1' WHERE run_id = 'r1'")
		o, err := b.store.OweTeardown(ctx, failure(b, a, base, "forbidden"), owedBackoff)
		if err != nil {
			t.Fatal(err)
		}
		if o.Attempt == nil || *o.Attempt != a || o.PodUID != "uid-1" || o.Tries != 1 || o.LastError != "forbidden" ||
			!o.NextTryAt.Equal(base.Add(30*time.Second)) || !o.FirstFailedAt.Equal(base) || o.Term != b.term {
			t.Fatalf("row %+v", o)
		}
		if due, err := b.store.DueTeardowns(ctx, b.term, base.Add(29*time.Second), 10); err != nil || len(due) != 0 {
			t.Fatalf("NotDueBeforeTheBackoff: %+v, %v", due, err)
		}
		due, err := b.store.DueTeardowns(ctx, b.term, base.Add(30*time.Second), 10)
		if err != nil || len(due) != 1 || due[0].ID != o.ID {
			t.Fatalf("DueOnceTheBackoffPassed: %+v, %v", due, err)
		}
		if n, err := b.store.OwedTeardownCount(ctx); err != nil || n != 1 {
			t.Fatalf("count %d, %v", n, err)
		}
	})
	t.Run("FailedAgain_TriesCountAndTheWaitDoublesUpToTheCap", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := first("r1", "t")
		o, err := b.store.OweTeardown(ctx, failure(b, a, base, "timeout"), owedBackoff)
		if err != nil {
			t.Fatal(err)
		}
		at := base
		for try := 2; try <= 7; try++ {
			at = at.Add(time.Minute)
			if o, err = b.store.TeardownFailed(ctx, o.ID, b.term, at, "still forbidden", owedBackoff); err != nil {
				t.Fatal(err)
			}
			if o.Tries != try || o.LastError != "still forbidden" || !o.NextTryAt.Equal(at.Add(owedBackoff.After(try))) {
				t.Fatalf("after try %d: %+v, want next at %s", try, o, at.Add(owedBackoff.After(try)))
			}
		}
	})
	t.Run("ReaperFailsItAgain_OneRowMoreTries", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := first("r1", "t")
		if _, err := b.store.OweTeardown(ctx, failure(b, a, base, "one"), owedBackoff); err != nil {
			t.Fatal(err)
		}
		o, err := b.store.OweTeardown(ctx, failure(b, a, base.Add(time.Second), "two"), owedBackoff)
		if err != nil {
			t.Fatal(err)
		}
		if o.Tries != 2 || o.LastError != "two" || !o.FirstFailedAt.Equal(base) || !o.NextTryAt.Equal(base.Add(time.Second+time.Minute)) {
			t.Fatalf("row %+v", o)
		}
		other := a
		other.Epoch = 1 // another attempt of the task is owed apart
		if _, err := b.store.OweTeardown(ctx, failure(b, other, base, "x"), owedBackoff); err != nil {
			t.Fatal(err)
		}
		run := board.TeardownFailure{RunID: "r1", Reaper: "orphanrun", Label: sdk.LabelOrphanRunPodDeleteErr,
			Reason: sdk.LabelOrphanRun, Error: "x", At: base, Term: b.term}
		for range 2 {
			if _, err := b.store.OweTeardown(ctx, run, owedBackoff); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := b.store.OwedTeardownCount(ctx); err != nil || n != 3 {
			t.Fatalf("RunTeardownOneRowPerRun: count %d, %v", n, err)
		}
		rows, err := b.store.OwedTeardownsFor(ctx, "r1", "t")
		if err != nil || len(rows) != 3 || rows[2].Attempt != nil || rows[2].Tries != 2 || rows[2].Subject() != "run r1" {
			t.Fatalf("ForTaskListsItsAttemptsAndItsRun: %+v, %v", rows, err)
		}
		if req := rows[2].Request(9); req.RunID != "r1" || req.Attempt != nil || req.Term != 9 || req.Reason != sdk.LabelOrphanRun {
			t.Fatalf("the run's request %+v", req)
		}
		if rows, err := b.store.OwedTeardownsFor(ctx, "r1", "other"); err != nil || len(rows) != 1 {
			t.Fatalf("AnotherTaskSeesOnlyTheRunsRow: %+v, %v", rows, err)
		}
	})
	t.Run("Done_RemovesTheRow", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		o, err := b.store.OweTeardown(ctx, failure(b, first("r1", "t"), base, "x"), owedBackoff)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := b.store.TeardownDone(ctx, o.ID, b.term, base.Add(time.Minute)); err != nil || !ok {
			t.Fatalf("done: %v, %v", ok, err)
		}
		if ok, err := b.store.TeardownDone(ctx, o.ID, b.term, base.Add(time.Minute)); err != nil || ok {
			t.Fatalf("done twice: %v, %v", ok, err)
		}
		if _, err := b.store.TeardownFailed(ctx, o.ID, b.term, base, "x", owedBackoff); !errors.Is(err, board.ErrNotFound) {
			t.Fatalf("a failure of a removed row: %v", err)
		}
	})
	t.Run("DeposedTerm_ReadsAndWritesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		o, err := b.store.OweTeardown(ctx, failure(b, first("r1", "t"), base, "x"), owedBackoff)
		if err != nil {
			t.Fatal(err)
		}
		later := base.Add(time.Hour)
		if _, err := b.store.DueTeardowns(ctx, b.term+1, later, 10); !errors.Is(err, board.ErrDeposed) {
			t.Fatalf("due for another term: %v", err)
		}
		// The lease ran out (base + an hour - a minute): the term leads no more.
		if _, err := b.store.DueTeardowns(ctx, b.term, later, 10); !errors.Is(err, board.ErrDeposed) {
			t.Fatalf("due past the lease: %v", err)
		}
		if ok, err := b.store.TeardownDone(ctx, o.ID, b.term, later); !errors.Is(err, board.ErrDeposed) || ok {
			t.Fatalf("done past the lease: %v, %v", ok, err)
		}
		if _, err := b.store.TeardownFailed(ctx, o.ID, b.term+1, base, "x", owedBackoff); !errors.Is(err, board.ErrDeposed) {
			t.Fatalf("failed for another term: %v", err)
		}
		rows, err := b.store.OwedTeardownsFor(ctx, "r1", "t")
		if err != nil || len(rows) != 1 || rows[0].Tries != 1 {
			t.Fatalf("the row changed: %+v, %v", rows, err)
		}
	})
	t.Run("LiveAttemptOrRun_DueButFlaggedLive", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.runWith(t, "r1", sdk.ExecutorKube, "t", "u")
		a, u := first("r1", "t"), first("r1", "u")
		b.running(t, a, base.Add(-10*time.Minute), base.Add(-5*time.Minute))
		b.running(t, u, base.Add(-10*time.Minute), base.Add(-5*time.Minute))
		older := a
		older.Epoch = 7 // not the current attempt
		for _, x := range []sdk.Attempt{a, older} {
			if _, err := b.store.OweTeardown(ctx, failure(b, x, base, "x"), owedBackoff); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := b.store.OweTeardown(ctx, board.TeardownFailure{RunID: "r1", Reaper: "orphanrun",
			Label: sdk.LabelOrphanRunPodDeleteErr, Reason: sdk.LabelOrphanRun, Error: "x", At: base, Term: b.term}, owedBackoff); err != nil {
			t.Fatal(err)
		}
		due, err := b.store.DueTeardowns(ctx, b.term, base.Add(time.Minute), 10)
		if err != nil || len(due) != 3 {
			t.Fatalf("due %+v, %v", due, err)
		}
		live := map[string]bool{}
		for _, o := range due {
			live[o.Subject()] = o.Live
		}
		if !live[a.String()] || live[older.String()] || !live["run r1"] {
			t.Fatalf("TheCurrentRunningAttemptAndTheRunningRunAreLive, an older epoch is not: %v", live)
		}
	})
	t.Run("OversizedError_Clipped", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		o, err := b.store.OweTeardown(ctx, failure(b, first("r1", "t"), base, strings.Repeat("e", 100_000)), owedBackoff)
		if err != nil || len(o.LastError) != board.MaxTeardownError {
			t.Fatalf("%d bytes kept, %v", len(o.LastError), err)
		}
	})
	t.Run("OfAnAttempt_ItsOwnRowOnly", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := first("r1", "t")
		other := a
		other.Epoch = 1
		if _, err := b.store.OweTeardown(ctx, failure(b, a, base, "forbidden"), owedBackoff); err != nil {
			t.Fatal(err)
		}
		o2, err := b.store.OweTeardown(ctx, failure(b, other, base, "webhook"), owedBackoff)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.store.OweTeardown(ctx, board.TeardownFailure{RunID: "r1", Reaper: "orphanrun",
			Label: sdk.LabelOrphanRunPodDeleteErr, Reason: sdk.LabelOrphanRun, Error: "x", At: base, Term: b.term}, owedBackoff); err != nil {
			t.Fatal(err)
		}
		o, ok, err := b.store.OwedTeardownOf(ctx, other)
		if err != nil || !ok || o.ID != o2.ID || o.Attempt == nil || *o.Attempt != other || o.LastError != "webhook" {
			t.Fatalf("TheAttemptsRow: %+v, %v, %v", o, ok, err)
		}
		// Through the runners' writer too.
		if o, ok, err := b.w.OwedTeardown(ctx, a); err != nil || !ok || o.LastError != "forbidden" || *o.Attempt != a {
			t.Fatalf("ThroughTheWriter: %+v, %v, %v", o, ok, err)
		}
		// Another try, another task, or only the run's teardown: none.
		for _, x := range []sdk.Attempt{{RunID: "r1", TaskID: "t", Try: 2, Epoch: 0}, first("r1", "u"), first("r2", "t")} {
			if o, ok, err := b.store.OwedTeardownOf(ctx, x); err != nil || ok {
				t.Fatalf("NoneFor %s: %+v, %v, %v", x, o, ok, err)
			}
		}
	})
	t.Run("OfAnAttempt_ReadByItsIndex", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.exec(t, `INSERT INTO owed_teardowns (run_id, task_id, try_number, attempt_epoch, reaper, label, reason,
            first_failed_at, last_tried_at, last_error, next_try_at, term)
            SELECT 'run' || (i / 10), 'task' || (i % 10), 1, 0, 'agentlost', 'agent_lost_pod_delete_error', 'agent_lost',
                $1, $1, 'forbidden', $1, 1
            FROM generate_series(0, 19999) i`, base)
		b.exec(t, `ANALYZE owed_teardowns`)
		conn, err := b.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		for _, s := range []string{"SET LOCAL plan_cache_mode = force_generic_plan",
			"PREPARE owed_of (text, text, integer, integer) AS " + board.OwedOfSQL} {
			if _, err := tx.Exec(ctx, s); err != nil {
				t.Fatalf("%s: %v", s, err)
			}
		}
		var plan string
		if err := tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) EXECUTE owed_of ('run7', 'task3', 1, 0)").Scan(&plan); err != nil {
			t.Fatal(err)
		}
		assertIndexed(t, "generic plan", plan)
		if !strings.Contains(plan, "owed_teardowns_attempt_idx") {
			t.Fatalf("not read by the attempt's index:\n%s", plan)
		}
	})
	t.Run("BadRequests_Refused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for name, f := range map[string]board.TeardownFailure{
			"NoRun":            {Reaper: "x", Label: "y", At: base},
			"AttemptOfAnother": {RunID: "r2", Attempt: &sdk.Attempt{RunID: "r1", TaskID: "t"}, Reaper: "x", Label: "y", At: base},
			"NoLabel":          {RunID: "r1", Reaper: "x", At: base},
		} {
			if _, err := b.store.OweTeardown(ctx, f, owedBackoff); err == nil {
				t.Errorf("%s: accepted", name)
			}
		}
	})
}

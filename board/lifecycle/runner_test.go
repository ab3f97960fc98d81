package lifecycle_test

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/eventually"
)

// lite is a Lite task of the runner tests.
func lite(id string, retries int32) lifecycle.NewTask {
	return lifecycle.NewTask{TaskID: id, Executor: sdk.ExecutorLite, Retries: retries, Command: "true"}
}

// mkRun creates a run in state (running or queued) with tasks and returns
// the first attempt of each, by task id.
func (b *bundle) mkRun(t *testing.T, runID, state string, tasks ...lifecycle.NewTask) map[string]sdk.Attempt {
	t.Helper()
	err := b.w.CreateRun(context.Background(), lifecycle.NewRun{RunID: runID, DagID: "dag", State: state, Tasks: tasks},
		base.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	as := map[string]sdk.Attempt{}
	for _, task := range tasks {
		as[task.TaskID] = sdk.Attempt{RunID: runID, TaskID: task.TaskID, Try: 1}
	}
	return as
}

func keys(tis []board.TaskInstance) []string {
	out := []string{}
	for _, ti := range tis {
		out = append(out, ti.RunID+"/"+ti.TaskID)
	}
	return out
}

func attemptKeys(as []sdk.Attempt) []string {
	out := []string{}
	for _, a := range as {
		out = append(out, a.RunID+"/"+a.TaskID)
	}
	return out
}

func TestEnqueueNew(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("SchedulesNoneTasksOfRunningRunsOfTheExecutorInKeyOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.mkRun(t, "r1", sdk.RunRunning, lite("b", 0), lite("a", 0),
			lifecycle.NewTask{TaskID: "k", Executor: sdk.ExecutorKube})
		b.mkRun(t, "r2", sdk.RunQueued, lite("a", 0))
		r3 := b.mkRun(t, "r3", sdk.RunRunning, lite("a", 0), lite("b", 0))
		b.to(t, r3["a"], sdk.StateScheduled, base)

		got, err := b.w.EnqueueNew(ctx, sdk.ExecutorLite, 2, base)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"r1/a", "r1/b"}; !reflect.DeepEqual(attemptKeys(got), want) {
			t.Fatalf("first page %v, want %v", attemptKeys(got), want)
		}
		if got[0].Try != 1 || got[0].Epoch != 0 {
			t.Fatalf("attempt %v", got[0])
		}
		got, err = b.w.EnqueueNew(ctx, sdk.ExecutorLite, 0, base)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"r3/b"}; !reflect.DeepEqual(attemptKeys(got), want) {
			t.Fatalf("second page %v, want %v", attemptKeys(got), want)
		}
		for runID, taskID := range map[string]string{"r1": "k", "r2": "a"} {
			ti, err := b.w.TaskInstance(ctx, runID, taskID)
			if err != nil {
				t.Fatal(err)
			}
			if ti.State != sdk.StateNone {
				t.Fatalf("%s/%s moved to %s", runID, taskID, ti.State)
			}
		}
		ti, err := b.w.TaskInstance(ctx, "r1", "a")
		if err != nil || ti.State != sdk.StateScheduled || !ti.UpdatedAt.Equal(base) {
			t.Fatalf("r1/a %+v %v", ti, err)
		}
	})

	t.Run("RefusesAnUnknownExecutor", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if _, err := b.w.EnqueueNew(ctx, "batch", 0, base); err == nil {
			t.Fatal("no error")
		}
	})
}

func TestListScheduled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("PagesScheduledTasksOfRunningRunsByKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r1 := b.mkRun(t, "r1", sdk.RunRunning, lite("a", 0), lite("b", 0), lite("c", 0), lite("d", 0),
			lifecycle.NewTask{TaskID: "k", Executor: sdk.ExecutorKube})
		r2 := b.mkRun(t, "r2", sdk.RunRunning, lite("a", 0))
		for _, id := range []string{"a", "b", "c", "k"} {
			b.to(t, r1[id], sdk.StateScheduled, base)
		}
		b.to(t, r1["d"], sdk.StateQueued, base)
		b.to(t, r2["a"], sdk.StateScheduled, base)
		if ok, err := b.w.FinishRun(ctx, "r2", sdk.RunFailed, "stopped", base); err != nil || !ok {
			t.Fatal(ok, err)
		}

		page, err := b.w.ListScheduled(ctx, sdk.ExecutorLite, nil, 2)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"r1/a", "r1/b"}; !reflect.DeepEqual(keys(page), want) {
			t.Fatalf("first page %v, want %v", keys(page), want)
		}
		if page[0].Command != "true" || page[0].State != sdk.StateScheduled {
			t.Fatalf("row %+v", page[0])
		}
		page, err = b.w.ListScheduled(ctx, sdk.ExecutorLite, &lifecycle.Key{RunID: "r1", TaskID: "b"}, 2)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"r1/c"}; !reflect.DeepEqual(keys(page), want) {
			t.Fatalf("second page %v, want %v", keys(page), want)
		}
	})
}

func TestCountActive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("CountsQueuedAndRunningOfRunningRunsOfTheExecutor", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r1 := b.mkRun(t, "r1", sdk.RunRunning, lite("q", 0), lite("r", 0), lite("s", 0), lite("done", 0),
			lifecycle.NewTask{TaskID: "k", Executor: sdk.ExecutorKube})
		r2 := b.mkRun(t, "r2", sdk.RunRunning, lite("q", 0))
		b.to(t, r1["q"], sdk.StateQueued, base)
		b.to(t, r1["r"], sdk.StateRunning, base)
		b.to(t, r1["s"], sdk.StateScheduled, base)
		b.to(t, r1["done"], sdk.StateSuccess, base)
		b.to(t, r1["k"], sdk.StateRunning, base)
		b.to(t, r2["q"], sdk.StateQueued, base)

		n, err := b.w.CountActive(ctx, sdk.ExecutorLite)
		if err != nil || n != 3 {
			t.Fatalf("count %d %v, want 3", n, err)
		}
		if ok, err := b.w.FinishRun(ctx, "r2", sdk.RunFailed, "stopped", base); err != nil || !ok {
			t.Fatal(ok, err)
		}
		n, err = b.w.CountActive(ctx, sdk.ExecutorLite)
		if err != nil || n != 2 {
			t.Fatalf("count after r2 finished %d %v, want 2", n, err)
		}
	})
}

// settleCases leaves one task instance of run runID in each of the shapes the
// runner tells apart, and returns the tasks ListReleasable must list.
func (b *bundle) settleCases(t *testing.T, runID string) []string {
	t.Helper()
	ctx := context.Background()
	at := base.Add(-10 * time.Minute)
	as := b.mkRun(t, runID, sdk.RunRunning,
		lite("retry", 1), lite("noretries", 0), lite("parked", 1), lite("poke", 0),
		lite("infra", 0), lite("held", 0), lite("spent", 0), lite("ok", 0), lite("live", 0))
	b.to(t, as["retry"], sdk.StateFailed, at)
	b.to(t, as["noretries"], sdk.StateFailed, at)
	b.to(t, as["parked"], sdk.StateUpForRetry, at)
	b.to(t, as["poke"], sdk.StateUpForReschedule, at)
	b.to(t, as["infra"], "infra", at)
	b.to(t, as["spent"], "infra", at)
	b.to(t, as["ok"], sdk.StateSuccess, at)
	b.to(t, as["live"], sdk.StateRunning, at)

	b.to(t, as["held"], sdk.StateRunning, at)
	res, err := b.store.Mark(ctx, []sdk.Mark{{Attempt: as["held"], FromStates: []string{sdk.StateRunning},
		Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost, Confirm: true, Hold: true, Term: b.term, At: at}})
	if err != nil || !res[0].Applied {
		t.Fatal(res, err)
	}
	ok, err := b.w.Fail(ctx, as["spent"], []string{sdk.StateFailed}, lifecycle.Failure{Kind: sdk.MarkInfra,
		Reason: sdk.LabelInfraBudgetSpent, Terminal: true, Confirm: true}, at)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	return []string{"infra", "parked", "poke", "retry"}
}

func TestListReleasable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ListsWhatARailOrATerminalFailureAwaitsAndNeverAHeldAttempt", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		want := b.settleCases(t, "r1")
		var got []string
		var after *lifecycle.Key
		for {
			page, err := b.w.ListReleasable(ctx, sdk.ExecutorLite, after, 3)
			if err != nil {
				t.Fatal(err)
			}
			for _, ti := range page {
				got = append(got, ti.TaskID)
			}
			if len(page) < 3 {
				break
			}
			after = &lifecycle.Key{RunID: page[len(page)-1].RunID, TaskID: page[len(page)-1].TaskID}
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("listed %v, want %v", got, want)
		}
	})

	t.Run("IgnoresRunsThatAreNotRunning", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.settleCases(t, "r1")
		if ok, err := b.w.FinishRun(ctx, "r1", sdk.RunFailed, "stopped", base); err != nil || !ok {
			t.Fatal(ok, err)
		}
		page, err := b.w.ListReleasable(ctx, sdk.ExecutorLite, nil, 0)
		if err != nil || len(page) != 0 {
			t.Fatalf("listed %v %v", keys(page), err)
		}
	})
}

func TestFinishSettledRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	at := base.Add(-10 * time.Minute)

	t.Run("FinishesOnlyRunsWithEveryTaskSettled", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ok := b.mkRun(t, "ok", sdk.RunRunning, lite("a", 0), lite("b", 0))
		b.to(t, ok["a"], sdk.StateSuccess, at)
		b.to(t, ok["b"], sdk.StateSkipped, at)
		bad := b.mkRun(t, "bad", sdk.RunRunning, lite("a", 0), lite("b", 0), lite("c", 2))
		b.to(t, bad["a"], sdk.StateSuccess, at)
		b.to(t, bad["b"], sdk.StateFailed, at)
		b.to(t, bad["c"], "infra", at)
		if ok, err := b.w.Fail(ctx, bad["c"], []string{sdk.StateFailed}, lifecycle.Failure{Kind: sdk.MarkInfra,
			Reason: sdk.LabelDispatchFailed, Terminal: true, Confirm: true}, at); err != nil || !ok {
			t.Fatal(ok, err)
		}
		b.mkRun(t, "empty", sdk.RunRunning)
		// Not settled: something ahead of one task instance.
		b.settleCases(t, "busy")
		retrying := b.mkRun(t, "retrying", sdk.RunRunning, lite("a", 1))
		b.to(t, retrying["a"], sdk.StateFailed, at)
		replaceable := b.mkRun(t, "replaceable", sdk.RunRunning, lite("a", 0))
		b.to(t, replaceable["a"], "infra", at)
		noReason := b.mkRun(t, "noreason", sdk.RunRunning, lite("a", 0))
		b.to(t, noReason["a"], sdk.StateRunning, at)
		if ok, err := b.w.Fail(ctx, noReason["a"], []string{sdk.StateRunning}, lifecycle.Failure{Kind: sdk.MarkInfra,
			Confirm: true}, at); err != nil || !ok {
			t.Fatal(ok, err)
		}
		waiting := b.mkRun(t, "waiting", sdk.RunRunning, lite("a", 0), lite("b", 0))
		b.to(t, waiting["a"], sdk.StateSuccess, at)
		held := b.mkRun(t, "held", sdk.RunRunning, lite("a", 0))
		b.to(t, held["a"], sdk.StateRunning, at)
		res, err := b.store.Mark(ctx, []sdk.Mark{{Attempt: held["a"], FromStates: []string{sdk.StateRunning},
			Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost, Confirm: true, Hold: true, Term: b.term, At: at}})
		if err != nil || !res[0].Applied {
			t.Fatal(res, err)
		}
		if ok, err := b.w.Fail(ctx, held["a"], []string{sdk.StateFailed}, lifecycle.Failure{Kind: sdk.MarkInfra,
			Reason: sdk.LabelInfraBudgetSpent, Terminal: true, Confirm: true}, at); err != nil || !ok {
			t.Fatal(ok, err)
		}

		got, err := b.w.FinishSettledRuns(ctx, 0, base)
		if err != nil {
			t.Fatal(err)
		}
		// SettledAt: the last task end, from which the finalization's
		// latency is measured (none for a run without task instances).
		want := []lifecycle.FinishedRun{
			{RunID: "bad", State: sdk.RunFailed, Unsuccessful: []string{"b", "c"}, SettledAt: at},
			{RunID: "empty", State: sdk.RunSuccess, Unsuccessful: []string{}},
			{RunID: "ok", State: sdk.RunSuccess, Unsuccessful: []string{}, SettledAt: at},
		}
		for i := range got {
			got[i].SettledAt = got[i].SettledAt.UTC()
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("finished %+v, want %+v", got, want)
		}
		run, err := b.w.Run(ctx, "bad")
		if err != nil || run.State != sdk.RunFailed || !run.EndedAt.Equal(base) || !strings.Contains(run.ErrorMessage, "b, c") {
			t.Fatalf("bad run %+v %v", run, err)
		}
		run, err = b.w.Run(ctx, "ok")
		if err != nil || run.State != sdk.RunSuccess || run.ErrorMessage != "" {
			t.Fatalf("ok run %+v %v", run, err)
		}
		for _, id := range []string{"busy", "retrying", "replaceable", "noreason", "waiting", "held"} {
			run, err := b.w.Run(ctx, id)
			if err != nil || run.State != sdk.RunRunning {
				t.Fatalf("run %s %+v %v", id, run, err)
			}
		}
		if got, err := b.w.FinishSettledRuns(ctx, 0, base); err != nil || len(got) != 0 {
			t.Fatalf("second pass %+v %v", got, err)
		}
	})

	t.Run("PagesByLimit", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.mkRun(t, "a", sdk.RunRunning)
		b.mkRun(t, "b", sdk.RunRunning)
		got, err := b.w.FinishSettledRuns(ctx, 1, base)
		if err != nil || len(got) != 1 || got[0].RunID != "a" {
			t.Fatalf("first %+v %v", got, err)
		}
		got, err = b.w.FinishSettledRuns(ctx, 1, base)
		if err != nil || len(got) != 1 || got[0].RunID != "b" {
			t.Fatalf("second %+v %v", got, err)
		}
	})
}

func TestIsTerminalFailure(t *testing.T) {
	t.Parallel()
	for reason, want := range map[string]bool{
		sdk.LabelDispatchFailed: true, sdk.LabelInfraBudgetSpent: true,
		sdk.LabelAgentLost: false, sdk.LabelDispatchLost: false, "": false,
	} {
		if got := lifecycle.IsTerminalFailure(reason); got != want {
			t.Errorf("IsTerminalFailure(%q) = %v, want %v", reason, got, want)
		}
	}
}

// The automatic rails start nothing in a run that is not running; the
// operator's clear reopens a finished run.
func TestRailsCheckTheRunsState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	at := base.Add(-10 * time.Minute)

	t.Run("AutomaticRailsRefuseAFinishedRun", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		as := b.mkRun(t, "r", sdk.RunRunning, lite("retry", 2), lite("infra", 0), lite("poke", 0))
		b.to(t, as["retry"], sdk.StateFailed, at)
		b.to(t, as["infra"], "infra", at)
		b.to(t, as["poke"], sdk.StateUpForReschedule, at)
		if ok, err := b.w.FinishRun(ctx, "r", sdk.RunFailed, "failed by hand", at); err != nil || !ok {
			t.Fatal(ok, err)
		}
		for name, rail := range map[string]func(context.Context, sdk.Attempt, time.Time) (lifecycle.Release, error){
			"retry": b.w.Retry, "infra": b.w.Replace, "poke": b.w.Reschedule,
		} {
			rel, err := rail(ctx, as[name], at)
			if err != nil || rel.Applied || rel.Reason != lifecycle.ReasonRunNotRunning {
				t.Errorf("%s on a failed run: %+v, %v", name, rel, err)
			}
		}
	})

	t.Run("ClearReopensAFinishedRun", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		as := b.mkRun(t, "r", sdk.RunRunning, lite("a", 0))
		b.to(t, as["a"], sdk.StateFailed, at)
		if done, err := b.w.FinishSettledRuns(ctx, 0, at); err != nil || len(done) != 1 {
			t.Fatal(done, err)
		}
		rel, err := b.w.Clear(ctx, as["a"], at.Add(time.Minute))
		if err != nil || !rel.Applied {
			t.Fatal(rel, err)
		}
		run, err := b.w.Run(ctx, "r")
		if err != nil || run.State != sdk.RunRunning || !run.EndedAt.IsZero() {
			t.Fatalf("run after the clear: %+v, %v", run, err)
		}
		// The reopened run is an orphan-run candidate again once quiet.
		var closed bool
		if err := b.store.Pool().QueryRow(ctx, `SELECT run_closed FROM task_instances WHERE run_id = 'r'`).Scan(&closed); err != nil || closed {
			t.Fatalf("run_closed %v, %v", closed, err)
		}
	})

	// A clear that commits while the runner is finishing the run (the runner
	// read every task settled before the clear) is not lost: the runner
	// leaves the run to its next tick.
	t.Run("ClearRacingTheFinish_NeverLost", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		as := b.mkRun(t, "r", sdk.RunRunning, lite("a", 0))
		b.to(t, as["a"], sdk.StateFailed, at)
		pool := b.store.Pool()

		// The clear, held open: the run's row taken and touched, the task
		// back to none.
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `UPDATE runs SET updated_at = $2 WHERE run_id = $1`, "r", at); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `UPDATE task_instances SET state = 'none', try_number = try_number + 1 WHERE run_id = 'r'`); err != nil {
			t.Fatal(err)
		}
		type result struct {
			done []lifecycle.FinishedRun
			err  error
		}
		finished := make(chan result, 1)
		go func() {
			done, err := b.w.FinishSettledRuns(ctx, 0, at)
			finished <- result{done, err}
		}()
		// The runner has read the run as settled and waits on its row.
		eventually.True(t, 20*time.Second, "the runner's finish to wait on the run's row", func() bool {
			var waiting int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
                WHERE wait_event_type = 'Lock' AND query LIKE '%WITH done AS%'`).Scan(&waiting); err != nil {
				t.Fatal(err)
			}
			return waiting > 0
		})
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		res := <-finished
		if res.err != nil || len(res.done) != 0 {
			t.Fatalf("finish behind a clear: %+v, %v", res.done, res.err)
		}
		if run, err := b.w.Run(ctx, "r"); err != nil || run.State != sdk.RunRunning {
			t.Fatalf("run %+v, %v", run, err)
		}
	})
}

// The run start cap: N queued runs with a cap of M start M at a time,
// oldest first; a finished run makes room for the next oldest.
func TestStartQueuedRunsUnderTheCap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	for i, id := range []string{"r3", "r1", "r5", "r2", "r4"} {
		// Created a minute apart, in this order: r3 is the oldest.
		err := b.w.CreateRun(ctx, lifecycle.NewRun{RunID: id, DagID: "dag", State: sdk.RunQueued,
			Tasks: []lifecycle.NewTask{lite("a", 0)}}, base.Add(time.Duration(i)*time.Minute))
		if err != nil {
			t.Fatal(err)
		}
	}
	at := base.Add(time.Hour)
	started, waiting, err := b.w.StartQueuedRuns(ctx, 2, 0, at)
	if err != nil || !slices.Equal(started, []string{"r1", "r3"}) || waiting != 3 {
		t.Fatalf("first tick: started %v, waiting %d, %v; want r3 and r1 (the oldest), 3 waiting", started, waiting, err)
	}
	if started, waiting, err := b.w.StartQueuedRuns(ctx, 2, 0, at); err != nil || len(started) != 0 || waiting != 3 {
		t.Fatalf("at the cap: started %v, waiting %d, %v", started, waiting, err)
	}
	if ok, err := b.w.FinishRun(ctx, "r3", sdk.RunSuccess, "", at); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if started, waiting, err := b.w.StartQueuedRuns(ctx, 2, 0, at); err != nil || !slices.Equal(started, []string{"r5"}) || waiting != 2 {
		t.Fatalf("after a finish: started %v, waiting %d, %v; want r5, the next oldest", started, waiting, err)
	}
	if started, waiting, err := b.w.StartQueuedRuns(ctx, 0, 0, at); err != nil || len(started) != 2 || waiting != 0 {
		t.Fatalf("no cap: started %v, waiting %d, %v; want the rest", started, waiting, err)
	}
	run, err := b.w.Run(ctx, "r5")
	if err != nil || run.State != sdk.RunRunning || !run.StartedAt.Equal(at) {
		t.Fatalf("a started run: %+v, %v", run, err)
	}
}

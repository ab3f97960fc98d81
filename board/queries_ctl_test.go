package board_test

import (
	"context"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
)

func TestOperatorReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// succeed drives a fresh attempt through queued (wait before running)
	// and running to success at endedAt after running for ran.
	succeed := func(t *testing.T, b *bundle, a sdk.Attempt, wait, ran time.Duration, endedAt time.Time) {
		t.Helper()
		runningAt := endedAt.Add(-ran)
		b.queued(t, a, runningAt.Add(-wait))
		if stop, err := b.w.Running(ctx, a, runningAt); err != nil || stop {
			t.Fatalf("running %s: stop=%v err=%v", a, stop, err)
		}
		if stop, err := b.w.Report(ctx, a, lifecycleSuccess, endedAt); err != nil || stop {
			t.Fatalf("report %s: stop=%v err=%v", a, stop, err)
		}
	}
	hold := func(t *testing.T, b *bundle, a sdk.Attempt, at time.Time) {
		t.Helper()
		res, err := b.store.Mark(ctx, []sdk.Mark{{Attempt: a, FromStates: []string{sdk.StateRunning},
			Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost, Message: "agent_lost: silent", Confirm: true, Hold: true,
			Term: b.term, At: at}})
		if err != nil || !res[0].Applied {
			t.Fatalf("hold %s: %+v %v", a, res, err)
		}
	}

	t.Run("ListRunsNewestFirstWithTaskCounts", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, "r-old", "a", "b", "c") // started an hour before base
		b.running(t, first("r-old", "a"), base.Add(-50*time.Minute), base.Add(-time.Minute))
		hold(t, b, first("r-old", "a"), base.Add(-30*time.Second))
		succeed(t, b, first("r-old", "b"), time.Second, time.Minute, base.Add(-40*time.Minute))
		if err := b.w.CreateRun(ctx, ctlRun("r-new", "x"), base.Add(-time.Minute)); err != nil {
			t.Fatal(err)
		}
		if err := b.w.CreateRun(ctx, ctlRun("r-empty"), base.Add(-2*time.Hour)); err != nil {
			t.Fatal(err)
		}

		p, err := b.store.ListRuns(ctx, board.RunListQuery{})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Runs) != 3 || p.Next != nil {
			t.Fatalf("runs %+v next %v, want three on one page", p.Runs, p.Next)
		}
		if p.Runs[0].RunID != "r-new" || p.Runs[1].RunID != "r-old" || p.Runs[2].RunID != "r-empty" {
			t.Fatalf("order %s %s %s, want newest first", p.Runs[0].RunID, p.Runs[1].RunID, p.Runs[2].RunID)
		}
		old := p.Runs[1]
		if old.Tasks[sdk.StateFailed] != 1 || old.Tasks[sdk.StateSuccess] != 1 || old.Tasks[sdk.StateNone] != 1 ||
			len(old.Tasks) != 3 || old.Held != 1 {
			t.Fatalf("r-old counts %v held %d", old.Tasks, old.Held)
		}
		if len(p.Runs[2].Tasks) != 0 || p.Runs[2].Held != 0 {
			t.Fatalf("a run without tasks counted %v", p.Runs[2].Tasks)
		}
	})

	t.Run("ListRunsPagesWithTheCursorAndFiltersByState", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for i := 0; i < 5; i++ {
			if err := b.w.CreateRun(ctx, ctlRun(id("r", i), "t"), base.Add(time.Duration(i)*time.Minute)); err != nil {
				t.Fatal(err)
			}
		}
		if ok, err := b.w.FinishRun(ctx, id("r", 4), sdk.RunSuccess, "", base.Add(time.Hour)); err != nil || !ok {
			t.Fatal(ok, err)
		}
		var got []string
		q := board.RunListQuery{States: []string{sdk.RunRunning}, Limit: 2}
		for pages := 0; ; pages++ {
			if pages > 3 {
				t.Fatal("paging does not end")
			}
			p, err := b.store.ListRuns(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range p.Runs {
				got = append(got, r.RunID)
			}
			if p.Next == nil {
				break
			}
			q.After = p.Next
		}
		want := []string{id("r", 3), id("r", 2), id("r", 1), id("r", 0)}
		if len(got) != len(want) {
			t.Fatalf("paged %v, want %v", got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("paged %v, want %v", got, want)
			}
		}
		if _, err := b.store.ListRuns(ctx, board.RunListQuery{States: []string{"lost"}}); err == nil {
			t.Fatal("an unknown run state was accepted")
		}
	})

	t.Run("ListHeldOldestHoldFirst", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, "r", "a", "b", "c")
		for i, task := range []string{"b", "a"} {
			a := first("r", task)
			b.running(t, a, base.Add(-time.Hour), base.Add(-30*time.Minute))
			hold(t, b, a, base.Add(time.Duration(i-10)*time.Minute))
		}
		b.running(t, first("r", "c"), base.Add(-time.Hour), base.Add(-30*time.Minute))

		p, err := b.store.ListHeld(ctx, board.HeldQuery{Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Attempts) != 1 || p.Attempts[0].TaskID != "b" || p.Next == nil {
			t.Fatalf("first page %+v next %v", p.Attempts, p.Next)
		}
		if p.Attempts[0].FailureReason != sdk.LabelAgentLost || p.Attempts[0].HeldAt.IsZero() {
			t.Fatalf("held row %+v", p.Attempts[0])
		}
		p, err = b.store.ListHeld(ctx, board.HeldQuery{After: p.Next, Limit: 1})
		if err != nil || len(p.Attempts) != 1 || p.Attempts[0].TaskID != "a" {
			t.Fatalf("second page %+v %v", p.Attempts, err)
		}
		p, err = b.store.ListHeld(ctx, board.HeldQuery{After: p.Next, Limit: 1})
		if err != nil || len(p.Attempts) != 0 || p.Next != nil {
			t.Fatalf("third page %+v %v", p, err)
		}
	})

	t.Run("SuccessTimingsNewestFirstWithinTheWindow", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, "r", "a", "b", "c", "d")
		succeed(t, b, first("r", "a"), 2*time.Second, 10*time.Second, base.Add(-3*time.Hour))
		succeed(t, b, first("r", "b"), 3*time.Second, 20*time.Second, base.Add(-2*time.Minute))
		succeed(t, b, first("r", "c"), 4*time.Second, 30*time.Second, base.Add(-time.Minute))
		b.running(t, first("r", "d"), base.Add(-time.Hour), base) // not finished: no sample

		all, err := b.store.SuccessTimings(ctx, board.TimingQuery{})
		if err != nil {
			t.Fatal(err)
		}
		if len(all) != 3 || all[0].TaskID != "c" || all[2].TaskID != "a" {
			t.Fatalf("timings %+v", all)
		}
		if d := all[0].Duration(); d != 30*time.Second {
			t.Fatalf("duration %v, want 30s", d)
		}
		if w, ok := all[0].QueueWait(); !ok || w != 4*time.Second {
			t.Fatalf("queue wait %v %v, want 4s", w, ok)
		}
		recent, err := b.store.SuccessTimings(ctx, board.TimingQuery{EndedAfter: base.Add(-time.Hour), Limit: 1})
		if err != nil || len(recent) != 1 || recent[0].TaskID != "c" {
			t.Fatalf("windowed timings %+v %v", recent, err)
		}
	})

	t.Run("RunSettleTimingsOfSuccessfulRunsOnly", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, "ok", "a")
		succeed(t, b, first("ok", "a"), time.Second, time.Minute, base.Add(-10*time.Minute))
		if done, err := b.w.FinishRun(ctx, "ok", sdk.RunSuccess, "", base.Add(-10*time.Minute+7*time.Second)); err != nil || !done {
			t.Fatal(done, err)
		}
		b.run(t, "reaped", "a")
		succeed(t, b, first("reaped", "a"), time.Second, time.Minute, base.Add(-20*time.Minute))
		if done, err := b.w.FinishRun(ctx, "reaped", sdk.RunFailed, "orphan_run", base); err != nil || !done {
			t.Fatal(done, err)
		}
		ts, err := b.store.RunSettleTimings(ctx, board.TimingQuery{})
		if err != nil {
			t.Fatal(err)
		}
		if len(ts) != 1 || ts[0].RunID != "ok" || ts[0].Lag() != 7*time.Second {
			t.Fatalf("settle timings %+v", ts)
		}
	})
}

// ctlRun is a running run of lite task instances, all in none.
func ctlRun(runID string, taskIDs ...string) lifecycle.NewRun {
	r := lifecycle.NewRun{RunID: runID, DagID: "dag"}
	for _, t := range taskIDs {
		r.Tasks = append(r.Tasks, lifecycle.NewTask{TaskID: t, Executor: sdk.ExecutorLite})
	}
	return r
}

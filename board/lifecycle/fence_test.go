package lifecycle_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
)

// fencedWrite is one runner write, from the state of "run/task" in which
// it applies.
type fencedWrite struct {
	name string
	// from is the state b.to drives the task to first ("" leaves it in
	// none; "queued run" leaves it in none in a queued run).
	from  string
	write func(ctx context.Context, w *lifecycle.Writer, a sdk.Attempt, now time.Time) (bool, error)
}

var queuedRun = "queued run"

func runnerWrites() []fencedWrite {
	release := func(rel lifecycle.Release, err error) (bool, error) { return rel.Applied, err }
	return []fencedWrite{
		{"EnqueueNew", "", func(ctx context.Context, w *lifecycle.Writer, _ sdk.Attempt, now time.Time) (bool, error) {
			as, err := w.EnqueueNew(ctx, sdk.ExecutorLite, 0, now)
			return len(as) > 0, err
		}},
		{"StartQueuedRuns", queuedRun, func(ctx context.Context, w *lifecycle.Writer, _ sdk.Attempt, now time.Time) (bool, error) {
			started, _, err := w.StartQueuedRuns(ctx, 0, 0, now)
			return len(started) > 0, err
		}},
		{"Queue", sdk.StateScheduled, func(ctx context.Context, w *lifecycle.Writer, a sdk.Attempt, now time.Time) (bool, error) {
			return w.Queue(ctx, a, now)
		}},
		{"RecordMint", sdk.StateQueued, func(ctx context.Context, w *lifecycle.Writer, a sdk.Attempt, now time.Time) (bool, error) {
			return w.RecordMint(ctx, a, now)
		}},
		{"RecordPod", sdk.StateQueued, func(ctx context.Context, w *lifecycle.Writer, a sdk.Attempt, now time.Time) (bool, error) {
			return w.RecordPod(ctx, a, "pod-uid", time.Time{}, now)
		}},
		{"FailDispatch", sdk.StateQueued, func(ctx context.Context, w *lifecycle.Writer, a sdk.Attempt, now time.Time) (bool, error) {
			return w.Fail(ctx, a, []string{sdk.StateQueued}, lifecycle.Failure{Kind: sdk.MarkInfra,
				Reason: sdk.LabelDispatchFailed, Message: "dispatch_failed: refused", Terminal: true, Confirm: true}, now)
		}},
		{"DispatchBackoff", sdk.StateQueued, func(ctx context.Context, w *lifecycle.Writer, a sdk.Attempt, now time.Time) (bool, error) {
			return release(w.DispatchBackoff(ctx, a, now))
		}},
		{"Retry", sdk.StateFailed, func(ctx context.Context, w *lifecycle.Writer, a sdk.Attempt, now time.Time) (bool, error) {
			return release(w.Retry(ctx, a, now))
		}},
		{"Replace", "infra", func(ctx context.Context, w *lifecycle.Writer, a sdk.Attempt, now time.Time) (bool, error) {
			return release(w.Replace(ctx, a, now))
		}},
		{"RecordWarmWorkerPod", "", func(ctx context.Context, w *lifecycle.Writer, _ sdk.Attempt, now time.Time) (bool, error) {
			if err := w.RecordWarmWorkerPod(ctx, "worker-1", "pod-uid", time.Hour, now); err != nil {
				return false, err
			}
			uid, err := w.WarmWorkerPodUID(ctx, "worker-1")
			return uid == "pod-uid", err
		}},
		{"FinishSettledRuns", sdk.StateSuccess, func(ctx context.Context, w *lifecycle.Writer, _ sdk.Attempt, now time.Time) (bool, error) {
			runs, err := w.FinishSettledRuns(ctx, 0, now)
			return len(runs) > 0, err
		}},
	}
}

// ready puts run/task where fw applies (the last step at base) and
// returns its attempt.
func (b *bundle) ready(t *testing.T, fw fencedWrite) sdk.Attempt {
	t.Helper()
	if fw.from == queuedRun {
		err := b.w.CreateRun(context.Background(), lifecycle.NewRun{RunID: "run", DagID: "dag", State: sdk.RunQueued,
			Tasks: []lifecycle.NewTask{lite("task", 0)}}, base.Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		return sdk.Attempt{RunID: "run", TaskID: "task", Try: 1}
	}
	a := b.task(t)
	if fw.from != "" {
		b.to(t, a, fw.from, base)
	}
	return a
}

// TestRunnerWritesFencedByTerm proves that a runner's board writes are
// fenced by its leadership term the way the reapers' marks are: a deposed
// leader's runner (another replica took the lead, or its own lease ran
// out) applies nothing and is told so, while the current term's writes
// apply and a write its own guard refuses is not mistaken for a deposal.
func TestRunnerWritesFencedByTerm(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// The setup's lease runs from a minute before base for an hour; the
	// takeover comes once it has run out.
	takeover, later := base.Add(time.Hour), base.Add(time.Hour+time.Minute)

	for _, fw := range runnerWrites() {
		t.Run("StaleTerm_WriteRefusedNothingWritten/"+fw.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			a := b.ready(t, fw)
			if _, ok, err := b.store.TryAcquire(ctx, "other", time.Hour, takeover); err != nil || !ok {
				t.Fatalf("the takeover: %v, %v", ok, err)
			}
			before, run := b.ti(t), b.run(t)
			applied, err := fw.write(ctx, b.w.Fenced(b.term), a, later)
			if applied || !errors.Is(err, lifecycle.ErrDeposed) {
				t.Fatalf("a write of the deposed term %d: applied %v, error %v; want refused as deposed", b.term, applied, err)
			}
			unchanged(t, before, b.ti(t))
			if after := b.run(t); after.State != run.State || !after.UpdatedAt.Equal(run.UpdatedAt) {
				t.Fatalf("a refused write changed the run: %+v, then %+v", run, after)
			}
		})
		t.Run("CurrentTerm_WriteApplies/"+fw.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			a := b.ready(t, fw)
			applied, err := fw.write(ctx, b.w.Fenced(b.term), a, base.Add(time.Minute))
			if !applied || err != nil {
				t.Fatalf("a write of the leading term: applied %v, error %v", applied, err)
			}
		})
	}

	t.Run("LeaseRunOut_WriteRefusedAsDeposed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.task(t)
		b.to(t, a, sdk.StateScheduled, base)
		before := b.ti(t)
		ok, err := b.w.Fenced(b.term).Queue(ctx, a, takeover)
		if ok || !errors.Is(err, lifecycle.ErrDeposed) {
			t.Fatalf("a write past the term's lease: applied %v, error %v; want refused as deposed", ok, err)
		}
		unchanged(t, before, b.ti(t))
	})

	t.Run("OwnGuardRefusal_NotDeposed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.task(t)
		b.to(t, a, sdk.StateQueued, base)
		ok, err := b.w.Fenced(b.term).Queue(ctx, a, base.Add(time.Minute))
		if ok || err != nil {
			t.Fatalf("queueing a queued attempt under the leading term: applied %v, error %v; want a plain no-op", ok, err)
		}
		rel, err := b.w.Fenced(b.term).Replace(ctx, a, base.Add(time.Minute))
		if rel.Applied || err != nil || rel.Reason != lifecycle.ReasonMovedOn {
			t.Fatalf("re-placing a queued attempt under the leading term: %+v, %v; want moved on", rel, err)
		}
	})

	t.Run("AgentReports_NotFenced", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.task(t)
		b.to(t, a, sdk.StateQueued, base)
		if _, ok, err := b.store.TryAcquire(ctx, "other", time.Hour, takeover); err != nil || !ok {
			t.Fatalf("the takeover: %v, %v", ok, err)
		}
		stop, err := b.w.Fenced(b.term).Running(ctx, a, later)
		if stop || err != nil {
			t.Fatalf("an agent's running report through a deposed writer: stop %v, error %v; want accepted", stop, err)
		}
	})
}

func (b *bundle) run(t *testing.T) board.Run {
	t.Helper()
	r, err := b.w.Run(context.Background(), "run")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

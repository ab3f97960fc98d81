package audit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/host/audit"
	"github.com/dexaflow/reaper/internal/pgtest"
	"github.com/dexaflow/reaper/sdk"
)

// cancelling is a board whose Mark cancels the caller's context once the
// store applied the marks: the pass's share ran out while its write was on
// the wire.
type cancelling struct {
	*board.Store
	cancel context.CancelFunc
}

func (c cancelling) Mark(ctx context.Context, ms []sdk.Mark) ([]sdk.MarkResult, error) {
	res, err := c.Store.Mark(ctx, ms)
	c.cancel()
	if err == nil {
		err = ctx.Err() // nil when the ledger detached the write
	}
	return res, err
}

func TestLedger(t *testing.T) {
	t.Parallel()
	setup := func(t *testing.T) (*board.Store, int64, []sdk.Attempt) {
		t.Helper()
		ctx := context.Background()
		pool := pgtest.NewDB(t)
		store := board.New(pool, board.Options{})
		lease, ok, err := store.TryAcquire(ctx, "test", time.Hour, t0.Add(-time.Minute))
		if err != nil || !ok {
			t.Fatalf("acquire: %v %v", ok, err)
		}
		w := lifecycle.New(pool, lifecycle.Options{})
		if err := w.CreateRun(ctx, lifecycle.NewRun{RunID: "run", DagID: "dag", State: sdk.RunRunning,
			Tasks: []lifecycle.NewTask{{TaskID: "a", Executor: sdk.ExecutorLite}, {TaskID: "b", Executor: sdk.ExecutorLite}}},
			t0.Add(-time.Hour)); err != nil {
			t.Fatal(err)
		}
		var as []sdk.Attempt
		for _, id := range []string{"a", "b"} {
			a := sdk.Attempt{RunID: "run", TaskID: id, Try: 1}
			ok1, err1 := w.Enqueue(ctx, a, t0.Add(-time.Hour))
			ok2, err2 := w.Queue(ctx, a, t0.Add(-time.Hour))
			stop, err3 := w.Running(ctx, a, t0.Add(-time.Hour))
			if !ok1 || !ok2 || stop || errors.Join(err1, err2, err3) != nil {
				t.Fatalf("running %s: %v", a, errors.Join(err1, err2, err3))
			}
			as = append(as, a)
		}
		return store, lease.Term, as
	}
	mark := func(a sdk.Attempt, term int64) sdk.Mark {
		return sdk.Mark{Attempt: a, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
			Reason: sdk.LabelAgentLost, Message: "agent_lost: silent", Term: term, At: t0}
	}

	t.Run("AWriteWhoseCallerGaveUpIsStillKnownAndAudited", func(t *testing.T) {
		t.Parallel()
		store, term, as := setup(t)
		ctx, cancel := context.WithCancel(context.Background())
		l := audit.NewLedger(cancelling{store, cancel})
		res, err := l.Mark(ctx, []sdk.Mark{mark(as[0], term), mark(as[1], term)})
		if err != nil || !res[0].Applied || !res[1].Applied {
			t.Fatalf("mark: %+v, %v", res, err)
		}
		l.Close()
		// The pass delivered the decision of one mark only.
		got := l.Unaudited("agentlost", []sdk.Decision{{Label: sdk.LabelAgentLost, Attempt: as[0], Applied: true}}, "cut")
		if len(got) != 1 || got[0].Attempt != as[1] || !got[0].Applied || got[0].Label != sdk.LabelAgentLost ||
			got[0].Reaper != "agentlost" || got[0].Evidence[audit.EvRecovered] != "host" {
			t.Fatalf("unaudited %+v, want the decision of the second mark", got)
		}
	})

	t.Run("ADeferralDoesNotCoverAnAppliedMark", func(t *testing.T) {
		t.Parallel()
		store, term, as := setup(t)
		l := audit.NewLedger(store)
		if _, err := l.Mark(context.Background(), []sdk.Mark{mark(as[0], term)}); err != nil {
			t.Fatal(err)
		}
		l.Close()
		got := l.Unaudited("agentlost", []sdk.Decision{{Label: sdk.LabelAgentLostProcessAlive, Attempt: as[0]}}, "cut")
		if len(got) != 1 {
			t.Fatalf("unaudited %+v, want the mark's decision", got)
		}
	})

	t.Run("NoopMarksOweNothing", func(t *testing.T) {
		t.Parallel()
		store, term, as := setup(t)
		l := audit.NewLedger(store)
		if _, err := l.Mark(context.Background(), []sdk.Mark{mark(as[0], term+1)}); err != nil { // deposed: a no-op
			t.Fatal(err)
		}
		l.Close()
		if got := l.Unaudited("agentlost", nil, "cut"); len(got) != 0 {
			t.Fatalf("unaudited %+v for a no-op", got)
		}
	})

	t.Run("AWriteAfterThePassIsRefused", func(t *testing.T) {
		t.Parallel()
		store, term, as := setup(t)
		l := audit.NewLedger(store)
		l.Close()
		_, err := l.Mark(context.Background(), []sdk.Mark{mark(as[0], term)})
		if !errors.Is(err, audit.ErrPassOver) {
			t.Fatalf("err = %v, want the pass over", err)
		}
		ti, err := store.TaskInstance(context.Background(), "run", "a")
		if err != nil || ti.State != sdk.StateRunning {
			t.Fatalf("a write after the pass reached the board: %s, %v", ti.State, err)
		}
		if _, err := l.ReapRun(context.Background(), sdk.RunReap{RunID: "run", Term: term, At: t0}); !errors.Is(err, audit.ErrPassOver) {
			t.Fatalf("reap run after the pass: %v", err)
		}
	})
}

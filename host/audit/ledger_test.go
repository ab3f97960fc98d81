package audit_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/host/audit"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/sdktest"
	"github.com/dexaflow/reaper/testkit/pgtest"
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

	// A settlement read from a pod without the exact task id names only
	// the lossy label; the board resolves it by the recorded pod UID. The
	// ledger keeps it under the attempt the board settled, so the sweep's
	// decision (which names that attempt) covers it.
	t.Run("ALossySettlementIsKeptUnderTheAttemptTheBoardSettled", func(t *testing.T) {
		t.Parallel()
		store, term, as := setup(t)
		w := lifecycle.New(store.Pool(), lifecycle.Options{})
		if ok, err := w.RecordPod(context.Background(), as[0], "uid-a", time.Time{}, t0.Add(-time.Hour)); err != nil || !ok {
			t.Fatalf("recording the pod: %v, %v", ok, err)
		}
		l := audit.NewLedger(store)
		lossy := sdk.Settlement{Attempt: sdk.Attempt{RunID: "run", TaskID: "A", Try: 1}, Outcome: sdk.OutcomeSuccess,
			FromStates: []string{sdk.StateRunning}, PodUID: "uid-a", LossyPod: true, Term: term, At: t0}
		res, err := l.Settle(context.Background(), []sdk.Settlement{lossy})
		if err != nil || len(res) != 1 || !res[0].Applied || res[0].Attempt != as[0] {
			t.Fatalf("settle: %+v, %v; want %s settled", res, err, as[0])
		}
		l.Close()
		covered := []sdk.Decision{{Label: sdk.LabelReconcileSettled, Attempt: as[0], Applied: true}}
		if got := l.Unaudited("substrate", covered, "cut"); len(got) != 0 {
			t.Fatalf("unaudited %+v: the decision of the settled attempt covers it", got)
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
		if _, err := l.RecordPodSightings(context.Background(), []sdk.PodSighting{{Attempt: as[0], PodUID: "uid",
			SeenAt: t0, Term: term, At: t0}}); !errors.Is(err, audit.ErrPassOver) {
			t.Fatalf("pod sightings after the pass: %v", err)
		}
	})

	// The host, not the plugin, says when a write is fenced and whether a
	// mark is confirmed: a mark dated outside its pass, or asking to be
	// confirmed, is refused whole and noted as a refusal; the one the host
	// admits is fenced at the host's clock, whatever At it carried.
	t.Run("TheHostFencesAtItsClockAndRefusesAPluginsTimeOrConfirmation", func(t *testing.T) {
		t.Parallel()
		store, term, as := setup(t)
		clk := clock.NewFake(t0.Add(30 * time.Second)) // the pass began at t0
		l := audit.NewLedger(store)
		l.OnRefusal("agentlost", nil)
		l.Guard(clk, t0, true, nil)
		backdated, ahead, confirmed := mark(as[0], term), mark(as[0], term), mark(as[1], term)
		backdated.At = t0.Add(-sdk.AtTolerance - time.Nanosecond)
		ahead.At = clk.Now().Add(sdk.AtTolerance + time.Nanosecond)
		confirmed.Confirm = true
		res, err := l.Mark(context.Background(), []sdk.Mark{backdated, ahead, confirmed})
		if err != nil {
			t.Fatal(err)
		}
		want := []string{sdk.NoopTimeRefused, sdk.NoopTimeRefused, sdk.NoopConfirmRefused}
		for i, r := range res {
			if r.Applied || r.NoopReason != want[i] {
				t.Fatalf("result %d: %+v, want refused %s", i, r, want[i])
			}
		}
		for _, a := range as {
			if ti, err := store.TaskInstance(context.Background(), a.RunID, a.TaskID); err != nil || ti.State != sdk.StateRunning {
				t.Fatalf("a refused mark reached the board: %s, %v", ti.State, err)
			}
		}
		l.Close()
		refused := l.Refusals()
		labels := []string{sdk.LabelBoardRefusedFenceTime, sdk.LabelBoardRefusedFenceTime, sdk.LabelBoardRefusedConfirm}
		if len(refused) != 3 {
			t.Fatalf("refusals %+v, want 3", refused)
		}
		for i, d := range refused {
			if d.Label != labels[i] || d.Applied || d.Reaper != "agentlost" || d.Evidence[audit.EvRefusal] != want[i] {
				t.Fatalf("refusal %d: %+v", i, d)
			}
		}

		// The pass's own time (or none) is taken, and fenced at the call.
		l = audit.NewLedger(store)
		l.Guard(clk, t0, true, nil)
		withNone := mark(as[1], term)
		withNone.At = time.Time{}
		res, err = l.Mark(context.Background(), []sdk.Mark{mark(as[0], term), withNone})
		if err != nil || !res[0].Applied || !res[1].Applied {
			t.Fatalf("the pass's own marks: %+v, %v", res, err)
		}
		for _, a := range as {
			ti, err := store.TaskInstance(context.Background(), a.RunID, a.TaskID)
			if err != nil || !ti.InfraMarkedAt.Equal(clk.Now()) || !ti.InfraConfirmedAt.IsZero() {
				t.Fatalf("%s marked at %v (confirmed %v), want at the host's %v, provisional (%v)",
					a, ti.InfraMarkedAt, ti.InfraConfirmedAt, clk.Now(), err)
			}
		}
		l.Close()
	})

	// On Lite the host confirms an infra mark as it writes it, on the
	// substrate's word read at the call: dead confirms, alive or unknown
	// leaves it provisional (the valve applies).
	t.Run("OnLiteTheHostConfirmsOnTheSubstratesWordOnly", func(t *testing.T) {
		t.Parallel()
		store, term, as := setup(t)
		exec := sdktest.NewExecutions()
		exec.Dead(as[0])
		exec.Alive(as[1])
		l := audit.NewLedger(store)
		l.Guard(clock.NewFake(t0), t0, true, nil)
		l.ConfirmDead(exec)
		res, err := l.Mark(context.Background(), []sdk.Mark{mark(as[0], term), mark(as[1], term)})
		if err != nil || !res[0].Applied || !res[1].Applied {
			t.Fatalf("mark: %+v, %v", res, err)
		}
		l.Close()
		for i, a := range as {
			ti, err := store.TaskInstance(context.Background(), a.RunID, a.TaskID)
			if err != nil || ti.InfraConfirmedAt.IsZero() != (i == 1) {
				t.Fatalf("%s confirmed at %v, want confirmed only when it reads dead (%v)", a, ti.InfraConfirmedAt, err)
			}
		}
	})
}

// appliesAll is a board on which every mark applies: the ledger's
// bookkeeping, not the board's guards, is under test.
type appliesAll struct{ sdk.Board }

func (appliesAll) Mark(_ context.Context, ms []sdk.Mark) ([]sdk.MarkResult, error) {
	out := make([]sdk.MarkResult, len(ms))
	for i := range out {
		out[i].Applied = true
	}
	return out, nil
}

// Decisions that stream in while the pass goes on (Cover) cover their
// writes as the pass's own decisions do: over a pass of many pages, with
// the ledger compacting what is covered along the way, Unaudited names
// exactly the writes no applied decision came for, a second write on a
// covered attempt included as covered.
func TestLedger_CoverAsDecisionsStreamIn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := audit.NewLedger(appliesAll{})
	attempt := func(i int) sdk.Attempt {
		return sdk.Attempt{RunID: fmt.Sprintf("run%04d", i/100), TaskID: fmt.Sprintf("task%02d", i%100), Try: 1}
	}
	const pages, perPage = 50, 100
	missing := map[sdk.Attempt]bool{}
	for p := range pages {
		marks := make([]sdk.Mark, perPage)
		ds := make([]sdk.Decision, 0, perPage)
		for i := range marks {
			a := attempt(p*perPage + i)
			marks[i] = sdk.Mark{Attempt: a, Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost, Term: 1}
			switch {
			case i == 7: // its decision never arrives
				missing[a] = true
			case i == 8: // a decision that says it did not apply covers nothing
				missing[a] = true
				ds = append(ds, sdk.Decision{Label: sdk.LabelAgentLost, Attempt: a, Applied: false})
			default:
				ds = append(ds, sdk.Decision{Label: sdk.LabelAgentLost, Attempt: a, Applied: true})
			}
		}
		if _, err := l.Mark(ctx, marks); err != nil {
			t.Fatal(err)
		}
		l.Cover(ds)
	}
	// A second write about an attempt covered long ago.
	if _, err := l.Mark(ctx, []sdk.Mark{{Attempt: attempt(3), Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost, Term: 1}}); err != nil {
		t.Fatal(err)
	}
	l.Close()
	lost := l.Unaudited("agentlost", nil, "test")
	if len(lost) != len(missing) {
		t.Fatalf("%d writes found unaudited, want %d", len(lost), len(missing))
	}
	for _, d := range lost {
		if !missing[d.Attempt] || !d.Applied || d.Label != sdk.LabelAgentLost {
			t.Fatalf("unexpected unaudited decision %+v", d)
		}
	}
}

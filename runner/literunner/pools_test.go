package literunner_test

import (
	"context"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/eventually"
)

// TestPoolsAndSlots: a pool's slots bound its queued and running attempts,
// a run's max_active_tasks its own; a task of a pool nobody configured
// waits; and an attempt that holds a slot keeps it, silent, until a
// reaper's mark settles it: the mark gives the slot back and the next
// cycle starts the task that waited for it.
func TestPoolsAndSlots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	inPool := func(nt lifecycle.NewTask, pool string, slots int32) lifecycle.NewTask {
		nt.Pool, nt.PoolSlots = pool, slots
		return nt
	}

	t.Run("APoolsSlotsAndARunsBound", func(t *testing.T) {
		t.Parallel()
		b := setup(t, opts{pools: map[string]int{"db": 3}})
		b.mkRun(t, "run", inPool(task("big", "sleep 4", 0), "db", 2), inPool(task("small", "true", 0), "db", 2),
			inPool(task("stray", "true", 0), "nowhere", 1), task("free", "true", 0))
		err := b.w.CreateRun(ctx, lifecycle.NewRun{RunID: "bounded", DagID: "dag", MaxActiveTasks: 1,
			Tasks: []lifecycle.NewTask{task("a", "sleep 4", 0), task("b", "true", 0)}}, b.clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		res := b.cycle(t)
		// big takes 2 of db's 3 slots; small (2) does not fit; free is in
		// the unbounded default pool; bounded runs one task at a time.
		if res.Dispatched != 3 {
			t.Fatalf("dispatched %d, want big, free and bounded/a", res.Dispatched)
		}
		for _, c := range []struct{ run, task, state string }{
			{"run", "big", sdk.StateQueued}, {"run", "small", sdk.StateScheduled}, {"run", "stray", sdk.StateScheduled},
			{"bounded", "a", sdk.StateQueued}, {"bounded", "b", sdk.StateScheduled},
		} {
			if ti := b.ti(t, c.run, c.task); ti.State != c.state && !(c.state == sdk.StateQueued && ti.State == sdk.StateRunning) {
				t.Errorf("%s/%s is %s, want %s", c.run, c.task, ti.State, c.state)
			}
		}
		var db lifecycle.PoolUse
		for _, u := range res.Pools {
			if u.Pool == "db" {
				db = u
			}
		}
		if db.Taken() != 2 || db.Waiting != 1 {
			t.Fatalf("db's use %+v, want 2 slots taken, 1 waiting", db)
		}
		b.clk.Advance(time.Second)
		if res := b.cycle(t); res.Dispatched != 0 {
			t.Fatalf("a second cycle dispatched %d with no slot open", res.Dispatched)
		}
	})

	t.Run("ALostAttemptHoldsItsSlotUntilAReaperSettlesIt", func(t *testing.T) {
		t.Parallel()
		b := setup(t, opts{pools: map[string]int{"one": 1}})
		b.mkRun(t, "run", inPool(task("first", "sleep 4", 0), "one", 1), inPool(task("second", "true", 0), "one", 1))
		if res := b.cycle(t); res.Dispatched != 1 {
			t.Fatalf("dispatched %d into one slot", res.Dispatched)
		}
		if !eventually.Until(20*time.Second, func() bool { return b.ti(t, "run", "first").State == sdk.StateRunning }) {
			t.Fatal("the first attempt never reported running")
		}
		// The first attempt goes silent (its heartbeats stop reaching the
		// board): its slot stays taken, counted silent.
		b.clk.Advance(10 * time.Minute)
		res := b.cycle(t)
		if res.Dispatched != 0 {
			t.Fatalf("dispatched %d while the silent attempt holds the slot", res.Dispatched)
		}
		var one lifecycle.PoolUse
		for _, u := range res.Pools {
			if u.Pool == "one" {
				one = u
			}
		}
		if one.Taken() != 1 || one.Silent != 1 || one.Waiting != 1 {
			t.Fatalf("pool one %+v, want its slot taken by a silent attempt and one task waiting", one)
		}
		// A reaper settles it: the mark gives the slot back, and the
		// next cycle starts a task of the pool into it.
		first := b.ti(t, "run", "first")
		mr, err := b.store.Mark(ctx, []sdk.Mark{{Attempt: first.Attempt, FromStates: []string{first.State},
			Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost, Message: "agent_lost: silent", Confirm: true,
			Term: b.term, At: b.clk.Now()}})
		if err != nil || !mr[0].Applied {
			t.Fatal(mr, err)
		}
		b.clk.Advance(time.Second)
		res = b.cycle(t)
		if res.Dispatched != 1 {
			t.Fatalf("dispatched %d after the mark gave the slot back", res.Dispatched)
		}
		// One of the two holds the slot now (the re-placed attempt comes
		// first in the runner's order), never both.
		active := 0
		for _, id := range []string{"first", "second"} {
			if st := b.ti(t, "run", id).State; st == sdk.StateQueued || st == sdk.StateRunning {
				active++
			}
		}
		if active != 1 {
			t.Fatalf("%d attempts of pool one active after the slot was given back, want 1", active)
		}
	})
}

// TestRecoveryBudget: after a loss, re-placed attempts reach the executor
// at the recovery budget's rate and no faster, whatever slots are open;
// first attempts of live work spend nothing and start at once beside them.
func TestRecoveryBudget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, opts{recovery: lifecycle.RecoveryBudget{Default: lifecycle.RecoveryLimit{Rate: 1, Burst: 2}}})
	var tasks []lifecycle.NewTask
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		tasks = append(tasks, task(id, "sleep 5", 0))
	}
	b.mkRun(t, "lost", tasks...)
	if res := b.cycle(t); res.Dispatched != 5 {
		t.Fatalf("dispatched %d first attempts, want 5: first attempts spend no budget", res.Dispatched)
	}
	// All five are lost at once and a reaper marks them (confirmed).
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		ti := b.ti(t, "lost", id)
		mr, err := b.store.Mark(ctx, []sdk.Mark{{Attempt: ti.Attempt, FromStates: []string{sdk.StateQueued, sdk.StateRunning},
			Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost, Message: "agent_lost: gone", Confirm: true,
			Term: b.term, At: b.clk.Now()}})
		if err != nil || !mr[0].Applied {
			t.Fatal(mr, err)
		}
	}
	b.mkRun(t, "live", task("x", "true", 0))
	b.clk.Advance(time.Second)
	res := b.cycle(t)
	// All five re-placed (scheduled, so their run stays alive), two
	// admitted by the burst; the live task starts beside them.
	if res.Replaced != 5 || res.Dispatched != 3 {
		t.Fatalf("replaced %d, dispatched %d: want 5 re-placed, the burst of 2 and the live task started", res.Replaced, res.Dispatched)
	}
	if c := res.Recovery[lifecycle.DefaultPool]; c == nil || c.Admitted != 2 {
		t.Fatalf("recovery counts %+v", c)
	}
	if st := b.ti(t, "live", "x").State; st == sdk.StateScheduled || st == sdk.StateNone {
		t.Fatalf("the live task is %s behind the recovery", st)
	}
	use, err := b.w.PoolUsage(ctx, b.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	var waiting int
	for _, u := range use {
		waiting += u.RecoveryWaiting
	}
	if waiting != 3 {
		t.Fatalf("%d re-places waiting, want 3", waiting)
	}
	// One more a second: 1.5 s refill 1.2 to 1.8 tokens (±20% jitter).
	b.clk.Advance(1500 * time.Millisecond)
	if res := b.cycle(t); res.Dispatched != 1 {
		t.Fatalf("dispatched %d 1.5 s later at 1/s", res.Dispatched)
	}
}

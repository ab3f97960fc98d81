package board_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
)

// TestFenceChecksTheHolderAsWellAsTheTerm: a term number handed out twice
// (a failover to a standby that missed the write that gave it out: the row
// comes back holding the number under another replica) lets through only
// the replica the board names. The replica that held it first is deposed
// on every fenced path: the guarded batches (a mark), the try log, an owed
// teardown's retry and the runner's fenced writes. A store or writer built
// without a holder (tools, tests) is fenced by the term alone.
func TestFenceChecksTheHolderAsWellAsTheTerm(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	// Replica A takes the lease; then the board, as a failover would
	// leave it, names replica C under the same term number.
	a := board.New(b.pool, board.Options{Holder: "replica-a"})
	c := board.New(b.pool, board.Options{Holder: "replica-c"})
	if _, err := a.Resign(ctx, 0, "test-leader"); err != nil {
		t.Fatal(err)
	}
	lease, ok, err := a.TryAcquire(ctx, "replica-a", leaseTTL, base.Add(-time.Minute))
	if err != nil || !ok {
		t.Fatalf("replica A acquires: ok=%v err=%v", ok, err)
	}
	term := lease.Term
	b.run(t, "run", "t1", "t2", "t3")
	for _, id := range []string{"t1", "t2", "t3"} {
		b.running(t, first("run", id), base.Add(-20*time.Minute), base.Add(-10*time.Minute))
	}
	markOf := func(task string) sdk.Mark {
		return sdk.Mark{Attempt: first("run", task), FromStates: []string{sdk.StateRunning},
			HeartbeatBefore: base.Add(-90 * time.Second), Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost,
			Message: "agent_lost: test", Term: term, At: base}
	}
	// While the board names A, A's mark applies and C's is deposed.
	if res, err := c.Mark(ctx, []sdk.Mark{markOf("t1")}); err != nil || res[0].Applied || res[0].NoopReason != sdk.NoopDeposed {
		t.Fatalf("replica C's mark under A's term: %+v %v, want deposed", res, err)
	}
	if res, err := a.Mark(ctx, []sdk.Mark{markOf("t1")}); err != nil || !res[0].Applied {
		t.Fatalf("replica A's mark: %+v %v, want applied", res, err)
	}
	b.exec(t, `UPDATE leader SET holder = 'replica-c'`)

	if res, err := a.Mark(ctx, []sdk.Mark{markOf("t2")}); err != nil || res[0].Applied || res[0].NoopReason != sdk.NoopDeposed {
		t.Errorf("replica A's mark once the board names C under the same term: %+v %v, want deposed", res, err)
	}
	if got := b.ti(t, "run", "t2"); got.State != sdk.StateRunning {
		t.Errorf("the deposed mark wrote: t2 is %s", got.State)
	}
	line := []sdk.LogLine{{Attempt: first("run", "t3"), At: base, Line: "a line"}}
	if err := a.AppendLog(ctx, term, line); !errors.Is(err, board.ErrDeposed) {
		t.Errorf("replica A's try log line: %v, want ErrDeposed", err)
	}
	if err := c.AppendLog(ctx, term, line); err != nil {
		t.Errorf("replica C's try log line: %v", err)
	}
	t1 := first("run", "t1")
	owed, err := c.OweTeardown(ctx, board.TeardownFailure{RunID: "run", Attempt: &t1, Reaper: "agentlost",
		Label: sdk.LabelAgentLost, Term: term, At: base, Error: "refused"}, board.TeardownBackoff{Base: time.Second, Cap: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.TeardownDone(ctx, owed.ID, term, base); !errors.Is(err, board.ErrDeposed) {
		t.Errorf("replica A's owed teardown done: %v, want ErrDeposed", err)
	}
	if done, err := c.TeardownDone(ctx, owed.ID, term, base); err != nil || !done {
		t.Errorf("replica C's owed teardown done: %v %v", done, err)
	}

	// The runner's writes: A's writer is deposed and says why; C's and a
	// writer with no holder write.
	wa := lifecycle.New(b.pool, lifecycle.Options{Holder: "replica-a"}).Fenced(term)
	_, err = wa.Enqueue(ctx, first("run", "t9"), base)
	if !errors.Is(err, lifecycle.ErrDeposed) || !strings.Contains(err.Error(), "held by replica-c") {
		t.Errorf("replica A's runner write: %v, want ErrDeposed naming replica C", err)
	}
	b.run(t, "run2", "t1")
	if ok, err := lifecycle.New(b.pool, lifecycle.Options{Holder: "replica-c"}).Fenced(term).Enqueue(ctx, first("run2", "t1"), base); err != nil || !ok {
		t.Errorf("replica C's runner write: %v %v", ok, err)
	}
	if res, err := b.store.Mark(ctx, []sdk.Mark{markOf("t2")}); err != nil || !res[0].Applied {
		t.Errorf("a store without a holder, the term current: %+v %v, want applied", res, err)
	}
}

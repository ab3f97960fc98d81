package reap

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/sdktest"
)

// backlogBoard is a board of n running attempts, silent since an hour
// before t0, and the planned agent_lost marks of each, guarded on that
// silence.
func backlogBoard(n int) (*sdktest.Board, []Planned) {
	b := sdktest.NewBoard()
	planned := make([]Planned, n)
	for i := range planned {
		a := b.PutRunning("run", fmt.Sprintf("task%05d", i), t0.Add(-2*time.Hour), t0.Add(-time.Hour))
		planned[i] = Planned{Label: sdk.LabelAgentLost, Detail: "dead", Evidence: Evidence{}, Mark: sdk.Mark{
			Attempt: a, FromStates: []string{sdk.StateRunning}, HeartbeatBefore: t0.Add(-5 * time.Minute),
			Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost, Message: "agent_lost: dead", Term: b.Term(), At: t0}}
	}
	return b, planned
}

func TestBacklog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("MarksOfManyPagesSettleInWritesOfMarkBatch", func(t *testing.T) {
		t.Parallel()
		board, planned := backlogBoard(2*MarkBatch + 500)
		var sink sdk.Collector
		rec := NewRecorder("test", sdk.Pass{Now: t0}, &sink)
		bl := NewBacklog(board, rec, nil)
		for start := 0; start < len(planned); start += 100 { // a page at a time
			if err := bl.Add(ctx, planned[start:start+100]...); err != nil {
				t.Fatal(err)
			}
		}
		if err := bl.Settle(ctx); err != nil {
			t.Fatal(err)
		}
		rec.Close(ctx)
		if board.Writes() != 3 || len(sink.Decisions()) != len(planned) || rec.Count(sdk.LabelAgentLost) != len(planned) {
			t.Fatalf("%d writes, %d decisions (%d agent_lost), want 3 writes and one applied decision per mark",
				board.Writes(), len(sink.Decisions()), rec.Count(sdk.LabelAgentLost))
		}
		for _, d := range sink.Decisions() {
			if !d.Applied || board.Row(d.Attempt).State != sdk.StateFailed {
				t.Fatalf("decision %+v, row %+v", d, board.Row(d.Attempt))
			}
		}
	})

	t.Run("AFullBatchIsWrittenWhileTheDrainGoesOn", func(t *testing.T) {
		t.Parallel()
		board, planned := backlogBoard(2 * MarkBatch)
		gate := &gatedMarks{Board: board, started: make(chan int, 2), proceed: make(chan struct{})}
		var sink sdk.Collector
		rec := NewRecorder("test", sdk.Pass{Now: t0}, &sink)
		bl := NewBacklog(gate, rec, nil)
		if err := bl.Add(ctx, planned[:MarkBatch]...); err != nil {
			t.Fatal(err)
		}
		// Add returned; the write is under way, held by the board.
		if n := <-gate.started; n != MarkBatch {
			t.Fatalf("a write of %d marks, want %d", n, MarkBatch)
		}
		if rec.Count(sdk.LabelAgentLost) != 0 {
			t.Fatal("decisions recorded before their write ended")
		}
		if err := bl.Add(ctx, planned[MarkBatch:MarkBatch+100]...); err != nil {
			t.Fatal(err)
		}
		close(gate.proceed)
		if err := bl.Settle(ctx); err != nil {
			t.Fatal(err)
		}
		rec.Close(ctx)
		if board.Writes() != 2 || rec.Count(sdk.LabelAgentLost) != MarkBatch+100 || len(sink.Decisions()) != MarkBatch+100 {
			t.Fatalf("%d writes, %d decisions", board.Writes(), len(sink.Decisions()))
		}
		for i, d := range sink.Decisions() {
			if d.Attempt != planned[i].Mark.Attempt || !d.Applied {
				t.Fatalf("decision %d %+v, want the applied mark of %s", i, d, planned[i].Mark.Attempt)
			}
		}
	})

	t.Run("ABoardErrorOfAWriteBesideTheDrainEndsTheDrain", func(t *testing.T) {
		t.Parallel()
		board, planned := backlogBoard(4 * MarkBatch)
		failing := &gatedMarks{Board: board, started: make(chan int, 4), proceed: make(chan struct{}), err: errors.New("board gone")}
		close(failing.proceed)
		var sink sdk.Collector
		rec := NewRecorder("test", sdk.Pass{Now: t0}, &sink)
		bl := NewBacklog(failing, rec, nil)
		// inFlight writes start without waiting for one another.
		for k := range inFlight {
			if err := bl.Add(ctx, planned[k*MarkBatch:(k+1)*MarkBatch]...); err != nil {
				t.Fatal(err)
			}
		}
		// The next batch needs a write slot: the oldest write's failure is
		// seen, and nothing more is written.
		err := bl.Add(ctx, planned[inFlight*MarkBatch:]...)
		if err == nil || !strings.Contains(err.Error(), "board gone") {
			t.Fatalf("Add: %v, want the write's error", err)
		}
		// Settle waits for the write still under way (it failed too).
		if err := bl.Settle(ctx); err == nil || !strings.Contains(err.Error(), "board gone") {
			t.Fatalf("Settle: %v, want the failure of the write it waited for", err)
		}
		if len(failing.started) != inFlight || len(sink.Decisions()) != 0 || board.Row(planned[0].Mark.Attempt).State != sdk.StateRunning {
			t.Fatalf("%d writes, %d decisions", len(failing.started), len(sink.Decisions()))
		}
	})

	// Every write under way is recorded, even after an earlier one failed:
	// what it applied reaches the sink.
	t.Run("AWriteThatAppliedAfterAFailedOneIsRecorded", func(t *testing.T) {
		t.Parallel()
		board, planned := backlogBoard(2 * MarkBatch)
		first := &failFirst{Board: board, first: planned[0].Mark.Attempt}
		var sink sdk.Collector
		rec := NewRecorder("test", sdk.Pass{Now: t0}, &sink)
		bl := NewBacklog(first, rec, nil)
		for k := range 2 {
			if err := bl.Add(ctx, planned[k*MarkBatch:(k+1)*MarkBatch]...); err != nil {
				t.Fatal(err)
			}
		}
		if err := bl.Settle(ctx); err == nil || !strings.Contains(err.Error(), "first write lost") {
			t.Fatalf("Settle: %v, want the first write's failure", err)
		}
		rec.Close(ctx)
		if n := rec.Count(sdk.LabelAgentLost); n != MarkBatch || len(sink.Decisions()) != MarkBatch {
			t.Fatalf("%d applied, %d decisions: want the second write's %d", n, len(sink.Decisions()), MarkBatch)
		}
		if d := sink.Decisions()[0]; d.Attempt != planned[MarkBatch].Mark.Attempt || !d.Applied {
			t.Fatalf("first decision %+v, want the second batch's first mark, applied", d)
		}
	})

	t.Run("AMarkThatWaitedIsANoopWhenItsAttemptHeartbeatedMeanwhile", func(t *testing.T) {
		t.Parallel()
		board, planned := backlogBoard(3)
		var sink sdk.Collector
		rec := NewRecorder("test", sdk.Pass{Now: t0}, &sink)
		bl := NewBacklog(board, rec, nil)
		if err := bl.Add(ctx, planned...); err != nil {
			t.Fatal(err)
		}
		board.Heartbeat("run", planned[1].Mark.Attempt.TaskID, t0.Add(-time.Second)) // back while it waited
		if err := bl.Settle(ctx); err != nil {
			t.Fatal(err)
		}
		rec.Close(ctx)
		ds := sink.Decisions()
		if len(ds) != 3 || ds[1].Label != sdk.LabelMarkNoop || ds[1].Evidence[EvNoopReason] != sdk.NoopHeartbeated ||
			board.Row(planned[1].Mark.Attempt).State != sdk.StateRunning || !ds[0].Applied || !ds[2].Applied {
			t.Fatalf("decisions %+v", ds)
		}
	})

	t.Run("RunSettlesTheBacklogWhenTheDrainFails", func(t *testing.T) {
		t.Parallel()
		board, planned := backlogBoard(150)
		var sink sdk.Collector
		rec := NewRecorder("test", sdk.Pass{Now: t0}, &sink)
		bl := NewBacklog(board, rec, nil)
		pages, finished := 0, false
		boom := errors.New("listing broke")
		listing := Listing{Name: "l", Page: func(ctx context.Context, after *Cursor) (*Cursor, error) {
			pages++
			if pages == 1 {
				return &Cursor{At: t0, RunID: "100"}, bl.Add(ctx, planned[:100]...)
			}
			return nil, boom
		}}
		_, err := Run(ctx, sdk.Pass{Now: t0, Deadline: t0.Add(30 * time.Second)}, rec, Spec{Name: "test",
			Stopwatch: clock.NewFake(t0), Listings: []Listing{listing}, Backlog: bl,
			Finish: func(context.Context, DrainStats) error { finished = true; return nil }})
		if err == nil || !strings.Contains(err.Error(), boom.Error()) || finished {
			t.Fatalf("err %v, finished %v: want the listing's error and no finish", err, finished)
		}
		if n := rec.Count(sdk.LabelAgentLost); n != 100 || len(sink.Decisions()) != 100 {
			t.Fatalf("%d marks applied, %d decisions recorded: want the first page's 100", n, len(sink.Decisions()))
		}
	})
}

// gatedMarks holds each write of marks until proceed is closed, then fails
// it with err or hands it to the board.
type gatedMarks struct {
	*sdktest.Board
	started chan int
	proceed chan struct{}
	err     error
}

func (g *gatedMarks) Mark(ctx context.Context, marks []sdk.Mark) ([]sdk.MarkResult, error) {
	g.started <- len(marks)
	<-g.proceed
	if g.err != nil {
		return nil, g.err
	}
	return g.Board.Mark(ctx, marks)
}

// failFirst fails the write of the batch that begins with first and hands
// the others to the board.
type failFirst struct {
	*sdktest.Board
	first sdk.Attempt
}

func (f *failFirst) Mark(ctx context.Context, marks []sdk.Mark) ([]sdk.MarkResult, error) {
	if len(marks) > 0 && marks[0].Attempt == f.first {
		return nil, errors.New("first write lost")
	}
	return f.Board.Mark(ctx, marks)
}

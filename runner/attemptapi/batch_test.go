package attemptapi

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// Heartbeats that arrive while a batch is being written are written together
// in the next batch, on a real board; each caller is answered its own row's
// result: the superseded attempt is told to terminate while the others renew.
func TestHeartbeatBatchAnswersEachCallerItsOwnResult(t *testing.T) {
	ctx := context.Background()
	w := lifecycle.New(pgtest.NewDB(t), lifecycle.Options{})
	now := time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)
	var tasks []lifecycle.NewTask
	for _, id := range []string{"first", "renews", "superseded"} {
		tasks = append(tasks, lifecycle.NewTask{TaskID: id, Executor: sdk.ExecutorLite, Command: "true"})
	}
	if err := w.CreateRun(ctx, lifecycle.NewRun{RunID: "run", DagID: "dag", Tasks: tasks}, now); err != nil {
		t.Fatal(err)
	}
	attempt := func(id string) sdk.Attempt { return sdk.Attempt{RunID: "run", TaskID: id, Try: 1} }
	for _, tk := range tasks {
		a := attempt(tk.TaskID)
		for _, step := range []func(context.Context, sdk.Attempt, time.Time) (bool, error){w.Enqueue, w.Queue} {
			if ok, err := step(ctx, a, now); err != nil || !ok {
				t.Fatal(ok, err)
			}
		}
		if term, err := w.Running(ctx, a, now); err != nil || term {
			t.Fatal(term, err)
		}
	}

	var (
		mu      sync.Mutex
		batches [][]sdk.Attempt
	)
	gate := make(chan struct{})
	writing := make(chan struct{}) // closed once the first batch is in write
	write := func(ctx context.Context, calls []lifecycle.HeartbeatCall) ([]bool, error) {
		mu.Lock()
		var as []sdk.Attempt
		for _, c := range calls {
			as = append(as, c.Attempt)
		}
		batches = append(batches, as)
		firstBatch := len(batches) == 1
		mu.Unlock()
		if firstBatch {
			close(writing)
			<-gate // the others arrive while this batch is written
		}
		return w.HeartbeatCredentials(ctx, calls)
	}
	hb := newHeartbeatBatcher(write, clock.Real{}, 0, 1, 100)
	hb.testSignals.joined.Init(t)

	type answer struct {
		term bool
		err  error
	}
	answers := make(map[string]chan answer)
	call := func(a sdk.Attempt) {
		ch := make(chan answer, 1)
		answers[a.TaskID] = ch
		go func() {
			term, err := hb.heartbeat(ctx, lifecycle.HeartbeatCall{Attempt: a, Renewal: lifecycle.Renewed, At: now.Add(time.Minute)})
			ch <- answer{term, err}
		}()
	}
	// wantPending checks, once the batcher has said so, that n heartbeats
	// wait behind the first batch.
	wantPending := func(n int) {
		t.Helper()
		got := hb.pending()
		mu.Lock()
		flushing := len(batches)
		mu.Unlock()
		if got != n || flushing != 1 {
			t.Fatalf("%d heartbeats pending, %d batches, want %d pending behind the first batch", got, flushing, n)
		}
	}
	call(attempt("first"))
	hb.testSignals.joined.WaitOrTimeout()
	select {
	case <-writing:
	case <-time.After(10 * time.Second):
		t.Fatal("the first batch was never written")
	}
	wantPending(0)
	superseded := attempt("superseded")
	superseded.Epoch = 3 // the row holds epoch 0
	call(attempt("renews"))
	call(superseded)
	hb.testSignals.joined.WaitOrTimeout()
	hb.testSignals.joined.WaitOrTimeout()
	wantPending(2)
	close(gate)

	for id, want := range map[string]bool{"first": false, "renews": false, "superseded": true} {
		if got := <-answers[id]; got.err != nil || got.term != want {
			t.Fatalf("%s: shouldTerminate %v err %v, want %v", id, got.term, got.err, want)
		}
	}
	if len(batches) != 2 || len(batches[1]) != 2 || !slices.Contains(batches[1], superseded) {
		t.Fatalf("batches %v, want the first alone then the two that waited together", batches)
	}
	for id, beat := range map[string]bool{"first": true, "renews": true, "superseded": false} {
		ti, err := w.TaskInstance(ctx, "run", id)
		if err != nil {
			t.Fatal(err)
		}
		if got := ti.LastHeartbeatAt.Equal(now.Add(time.Minute)); got != beat {
			t.Fatalf("%s: heartbeat recorded %v (at %v), want %v", id, got, ti.LastHeartbeatAt, beat)
		}
	}
}

// A window's batch whose write fails answers each of its heartbeats with
// the error, none acknowledged; heartbeats that join while the batch waits
// out its window share its one write.
func TestHeartbeatWindowFailureFailsEveryHeartbeatOfTheBatch(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.DSN(pgtest.NewDB(t)))
	if err != nil {
		t.Fatal(err)
	}
	w := lifecycle.New(pool, lifecycle.Options{})
	var writes int
	write := func(ctx context.Context, calls []lifecycle.HeartbeatCall) ([]bool, error) {
		writes++
		return w.HeartbeatCredentials(ctx, calls)
	}
	wclk := clock.NewFake(time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC))
	hb := newHeartbeatBatcher(write, wclk, time.Second, 1, 100)
	hb.testSignals.joined.Init(t)
	errs := make(chan error, 2)
	for _, id := range []string{"a", "b"} {
		go func() {
			_, err := hb.heartbeat(ctx, lifecycle.HeartbeatCall{Attempt: sdk.Attempt{RunID: "run", TaskID: id, Try: 1},
				Renewal: lifecycle.Renewed, At: wclk.Now()})
			errs <- err
		}()
		hb.testSignals.joined.WaitOrTimeout()
	}
	if got := hb.pending(); got != 2 {
		t.Fatalf("%d heartbeats in the open batch, want 2", got)
	}
	pool.Close() // the board is gone when the window ends
	wclk.Advance(time.Second)
	for range 2 {
		if err := <-errs; err == nil {
			t.Fatal("a heartbeat whose batch was not written was acknowledged")
		}
	}
	if writes != 1 {
		t.Fatalf("%d writes, want the batch's one", writes)
	}
}

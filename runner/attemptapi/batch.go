package attemptapi

import (
	"context"
	"sync"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/internal/testsignal"
	"github.com/dexaflow/reaper/sdk/clock"
)

// heartbeatBatcher writes heartbeats in batches, the way a database groups
// commits, each batch waiting at most one window for company:
//
//   - A heartbeat joins the open batch; the first to join it opens it and
//     leads it.
//   - The leader waits until the window has passed since it opened the
//     batch (not at all when the window is zero) or the batch is full, then
//     for one of the write slots (at most flushers batches are written at
//     once). Heartbeats keep joining meanwhile.
//   - Then it closes the batch (the next heartbeat opens another) and
//     writes it in one statement and one commit, and answers each heartbeat
//     from its own row's guard.
//
// No heartbeat is answered before the board has judged it: what a
// heartbeat may wait for is the window, a write slot and its batch's
// write. What the window delays is the write of last_heartbeat_at (the
// time written is the heartbeat's arrival) and the answer, should_terminate
// included; a batch whose write fails answers each of its heartbeats with
// the error, so none is acknowledged unwritten.
type heartbeatBatcher struct {
	write  func(ctx context.Context, calls []lifecycle.HeartbeatCall) ([]bool, error)
	clock  clock.Clock
	window time.Duration // how long a batch waits for company; 0: none
	max    int           // most heartbeats in one batch
	slots  chan struct{} // one per batch being written

	mu   sync.Mutex
	open *heartbeatBatch // the batch heartbeats join; nil: none open

	// testSignals are the points tests wait for; no-ops unless a test
	// initialised them.
	testSignals batcherTestSignals
}

// batcherTestSignals are the points of the batcher a test can wait for.
type batcherTestSignals struct {
	// joined: a heartbeat joined a batch.
	joined testsignal.TestSignal[lifecycle.HeartbeatCall]
}

// heartbeatBatch is one batch: its heartbeats, and whether it is being
// written (then none joins or leaves it).
type heartbeatBatch struct {
	calls   []*pendingHeartbeat
	full    chan struct{} // closed when the batch reaches max
	writing bool
}

type pendingHeartbeat struct {
	call lifecycle.HeartbeatCall
	done chan heartbeatResult // buffered: the writer never blocks on it
}

type heartbeatResult struct {
	shouldTerminate bool
	err             error
}

func newHeartbeatBatcher(write func(context.Context, []lifecycle.HeartbeatCall) ([]bool, error), clk clock.Clock,
	window time.Duration, flushers, max int) *heartbeatBatcher {
	return &heartbeatBatcher{write: write, clock: clk, window: window, max: max, slots: make(chan struct{}, flushers)}
}

// heartbeat records c in a batch and answers its shouldTerminate. A caller
// whose ctx ends while its batch is still open takes its heartbeat back;
// once its batch is being written, it is written, and the caller is told
// ctx's error. A leader's heartbeat is written with its batch even when
// its caller has gone: the others wait on it.
func (b *heartbeatBatcher) heartbeat(ctx context.Context, c lifecycle.HeartbeatCall) (bool, error) {
	p := &pendingHeartbeat{call: c, done: make(chan heartbeatResult, 1)}
	b.mu.Lock()
	bt := b.open
	lead := bt == nil
	if lead {
		bt = &heartbeatBatch{full: make(chan struct{})}
		b.open = bt
	}
	bt.calls = append(bt.calls, p)
	if len(bt.calls) == b.max {
		close(bt.full)
		b.open = nil
	}
	b.mu.Unlock()
	b.testSignals.joined.Signal(c)
	if lead {
		b.lead(context.WithoutCancel(ctx), bt)
	}
	select {
	case r := <-p.done:
		return r.shouldTerminate, r.err
	case <-ctx.Done():
		if b.withdraw(bt, p) {
			return false, ctx.Err()
		}
		select {
		case r := <-p.done:
			return r.shouldTerminate, r.err
		default:
			return false, ctx.Err()
		}
	}
}

// lead waits out bt's window (or until it is full) and a write slot, then
// writes bt and answers each of its heartbeats.
func (b *heartbeatBatcher) lead(ctx context.Context, bt *heartbeatBatch) {
	if b.window > 0 {
		select {
		case <-b.clock.After(b.window):
		case <-bt.full:
		}
	}
	b.slots <- struct{}{}
	defer func() { <-b.slots }()
	b.mu.Lock()
	if b.open == bt {
		b.open = nil
	}
	bt.writing = true
	batch := bt.calls
	b.mu.Unlock()
	calls := make([]lifecycle.HeartbeatCall, len(batch))
	for i, p := range batch {
		calls[i] = p.call
	}
	term, err := b.write(ctx, calls)
	for i, p := range batch {
		r := heartbeatResult{err: err}
		if err == nil {
			r.shouldTerminate = term[i]
		}
		p.done <- r
	}
}

// withdraw takes p back from bt while bt is not being written; false once
// it is.
func (b *heartbeatBatcher) withdraw(bt *heartbeatBatch, p *pendingHeartbeat) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if bt.writing {
		return false
	}
	for i, q := range bt.calls {
		if q == p {
			bt.calls = append(bt.calls[:i], bt.calls[i+1:]...)
			return true
		}
	}
	return false
}

// pending is how many heartbeats wait in the open batch.
func (b *heartbeatBatcher) pending() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open == nil {
		return 0
	}
	return len(b.open.calls)
}

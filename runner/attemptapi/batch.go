package attemptapi

import (
	"context"
	"sync"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/internal/testsignal"
)

// heartbeatBatcher coalesces concurrent heartbeats into batched writes, the
// way a database groups commits: a heartbeat joins the pending list; while
// fewer than flushers batches are being written, the caller takes a flush
// slot and writes everything pending (its own and whatever arrived while the
// previous batch was in flight) in one statement and one commit. No timer:
// a lone heartbeat is written at once, and batches grow only when writes
// queue behind each other. Each caller is answered its own row's result.
type heartbeatBatcher struct {
	write func(ctx context.Context, calls []lifecycle.HeartbeatCall) ([]bool, error)
	max   int           // most heartbeats in one batch
	slots chan struct{} // one per batch being written

	mu      sync.Mutex
	pending []*pendingHeartbeat

	// testSignals are the points tests wait for; no-ops unless a test
	// initialised them.
	testSignals batcherTestSignals
}

// batcherTestSignals are the points of the batcher a test can wait for.
type batcherTestSignals struct {
	// joined: a heartbeat joined the pending list.
	joined testsignal.TestSignal[lifecycle.HeartbeatCall]
}

type pendingHeartbeat struct {
	call lifecycle.HeartbeatCall
	done chan heartbeatResult // buffered: the writer never blocks on it
}

type heartbeatResult struct {
	shouldTerminate bool
	err             error
}

func newHeartbeatBatcher(write func(context.Context, []lifecycle.HeartbeatCall) ([]bool, error), flushers, max int) *heartbeatBatcher {
	return &heartbeatBatcher{write: write, max: max, slots: make(chan struct{}, flushers)}
}

// heartbeat records c in a batch and answers its shouldTerminate. A caller
// whose ctx ends while its heartbeat is still pending takes it back; once
// its batch is being written, it is written, and the caller is told ctx's
// error.
func (b *heartbeatBatcher) heartbeat(ctx context.Context, c lifecycle.HeartbeatCall) (bool, error) {
	p := &pendingHeartbeat{call: c, done: make(chan heartbeatResult, 1)}
	b.mu.Lock()
	b.pending = append(b.pending, p)
	b.mu.Unlock()
	b.testSignals.joined.Signal(c)
	for {
		select {
		case r := <-p.done:
			return r.shouldTerminate, r.err
		case b.slots <- struct{}{}:
			b.flush(context.WithoutCancel(ctx))
			<-b.slots
		case <-ctx.Done():
			if b.withdraw(p) {
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
}

// flush writes up to max pending heartbeats and answers each of them.
func (b *heartbeatBatcher) flush(ctx context.Context) {
	b.mu.Lock()
	n := min(len(b.pending), b.max)
	batch := append([]*pendingHeartbeat(nil), b.pending[:n]...)
	b.pending = append(b.pending[:0], b.pending[n:]...)
	b.mu.Unlock()
	if n == 0 {
		return
	}
	calls := make([]lifecycle.HeartbeatCall, n)
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

// withdraw takes p back from the pending list; false when a flush has it.
func (b *heartbeatBatcher) withdraw(p *pendingHeartbeat) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, q := range b.pending {
		if q == p {
			b.pending = append(b.pending[:i], b.pending[i+1:]...)
			return true
		}
	}
	return false
}

package kuberunner

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/runner/internal/steps"
)

// The dispatch buffer (Config.DispatchBuffer above 0).
//
// The tick walks the scheduled attempts as it does without a buffer, within
// MaxParallel, but instead of dispatching each one itself it hands it to a
// bounded queue; Config.DispatchWorkers goroutines take the attempts off it
// and dispatch them through dispatchOne, the very function the tick calls
// without a buffer: queue (fenced), credential, pod create, adopt or
// squatted on AlreadyExists, and every create error settled by the same
// judgment (offered again while unavailable within the window, failed as
// dispatch_failed once refused or exhausted). A full buffer makes the tick
// wait for a worker to take an attempt; nothing is ever dropped.
//
// Each handed-off attempt carries its tick's driver, whose writer is fenced
// by the tick's leadership term, and its tick's now: a worker writes under
// that term, so once the term no longer leads the board its first write,
// the queue, is refused (lifecycle.ErrDeposed) and it creates no pod.
//
// The tick waits for the attempts it handed off before it goes on, and
// merges what each worker did into its Result in the order it handed them
// off. This keeps what the runner promises without a buffer: a cycle's
// Result (and so its audit and metering, under its own term) holds every
// decision of its dispatches; the next tick's MaxParallel count and its
// list of scheduled attempts read a board on which every hand-off has
// landed, so no attempt is ever handed off twice; RunOnce is deterministic
// in tests; and a deposed term's cycle ends, as deposed, with nothing of
// it still running. What the buffer buys is that M creates are in flight
// at once instead of one, while the tick keeps listing and handing off.
//
// An attempt handed off counts against MaxParallel for the rest of its
// tick whatever became of its create (the tick cannot wait for the answer
// to hand off the next one); one whose create failed frees its slot for
// the next tick. Once a handed-off dispatch ends in an error (the term
// deposed, the board unreachable), the tick hands off nothing more, waits
// for what it handed off, and ends with the first such error (in hand-off
// order). The attempts already in the buffer are still dispatched, each
// through its own fenced writes: under a deposed term each one's queue is
// refused before its create, as on a tick that went on.
//
// The workers are started by Run, serve all its ticks and are stopped
// once its context is done and its last tick has returned; RunOnce and
// RunOnceFenced called on their own start workers for the call and stop
// them before they return.

// dispatchPool is the buffer and its workers.
type dispatchPool struct {
	jobs chan *handoff
	obs  DispatchObserver
	wg   sync.WaitGroup
}

// handoff is one attempt handed to the workers, and what became of it.
type handoff struct {
	run  func(res *Result) (bool, error)
	done func()
	// Written by the worker before done, read by the tick after.
	res Result
	err error
}

// startDispatchPool starts the workers, or returns nil without a buffer.
func (r *Runner) startDispatchPool() *dispatchPool {
	if r.cfg.DispatchBuffer <= 0 {
		return nil
	}
	p := &dispatchPool{jobs: make(chan *handoff, r.cfg.DispatchBuffer), obs: r.cfg.DispatchObserver}
	p.wg.Add(r.cfg.DispatchWorkers)
	for range r.cfg.DispatchWorkers {
		go p.work()
	}
	return p
}

// work dispatches the attempts handed off until the pool stops.
func (p *dispatchPool) work() {
	defer p.wg.Done()
	for h := range p.jobs {
		p.obs.DispatchBuffered(-1)
		h.run(&h.res)
		h.done()
	}
}

// stop stops the workers once they have dispatched what they were handed;
// nothing may be handed off after it (the tick that hands off has
// returned).
func (p *dispatchPool) stop() {
	close(p.jobs)
	p.wg.Wait()
}

// hand puts h in the buffer, waiting while it is full (counted in waits
// and told to the observer) unless ctx ends first.
func (p *dispatchPool) hand(ctx context.Context, h *handoff, waits *int) error {
	p.obs.DispatchBuffered(1)
	select {
	case p.jobs <- h:
		return nil
	default:
	}
	*waits++
	p.obs.DispatchBufferFull()
	select {
	case p.jobs <- h:
		return nil
	case <-ctx.Done():
		p.obs.DispatchBuffered(-1)
		return ctx.Err()
	}
}

// errHandOffStopped ends a tick's walk once a handed-off dispatch failed.
var errHandOffStopped = errors.New("a handed-off dispatch failed")

// dispatchBuffered is dispatch through the buffer: one, for each attempt
// the walk hands off, is run by a worker.
func (r *Runner) dispatchBuffered(ctx context.Context, p *dispatchPool, d steps.Driver, now time.Time, res *Result,
	one func(ctx context.Context, ti board.TaskInstance, res *Result) (bool, error)) error {
	var (
		handed []*handoff
		wg     sync.WaitGroup
		failed atomic.Bool
	)
	err := d.Dispatch(ctx, now, &res.Tally, r.cfg.MaxParallel, func(ctx context.Context, ti board.TaskInstance) (bool, error) {
		if failed.Load() {
			return false, errHandOffStopped
		}
		h := &handoff{}
		h.run = func(out *Result) (bool, error) {
			started, err := one(ctx, ti, out)
			if err != nil {
				h.err = err
				failed.Store(true)
			}
			return started, err
		}
		h.done = wg.Done
		wg.Add(1)
		if err := p.hand(ctx, h, &res.BufferWaits); err != nil {
			wg.Done()
			return false, err
		}
		handed = append(handed, h)
		return true, nil // it holds its slot for the tick, whatever its create meets
	})
	wg.Wait()
	var first error
	for _, h := range handed {
		res.add(h.res)
		if h.err != nil && first == nil {
			first = h.err
		}
	}
	res.Handed += len(handed)
	if first != nil {
		return first
	}
	return err
}

// add adds what a worker's dispatch did (in a Result of its own) to res.
// Every field a dispatch may touch is added; the others are the tick's.
func (res *Result) add(o Result) {
	res.Dispatched += o.Dispatched
	res.Scheduled += o.Scheduled
	res.Retried += o.Retried
	res.Rescheduled += o.Rescheduled
	res.Replaced += o.Replaced
	res.OfferedAgain += o.OfferedAgain
	res.Failed += o.Failed
	res.Finalized += o.Finalized
	res.Waiting += o.Waiting
	res.RunsStarted = append(res.RunsStarted, o.RunsStarted...)
	res.FinalizeLatencies = append(res.FinalizeLatencies, o.FinalizeLatencies...)
	res.DispatchLatencies = append(res.DispatchLatencies, o.DispatchLatencies...)
	res.Finished = append(res.Finished, o.Finished...)
	res.Decisions = append(res.Decisions, o.Decisions...)
}

// noteQueued records a queued attempt for the dispatch latency; the
// workers call it at once.
func (r *Runner) noteQueued(ti board.TaskInstance, now time.Time) {
	r.dispatchedMu.Lock()
	defer r.dispatchedMu.Unlock()
	r.dispatched.Queued(ti.Attempt, now)
}

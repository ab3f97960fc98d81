// Package clock is the one clock of the project. The host reads time only
// through a Clock and hands its reading to plugins with every pass, so every
// timing rule can be tested by advancing a Fake instead of sleeping.
package clock

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Clock tells the time and makes timers. Real is the production clock; Fake
// is moved by tests.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// After returns a channel that receives the time once d has passed.
	After(d time.Duration) <-chan time.Time
	// NewTicker returns a ticker that fires every d. Like time.Ticker, it
	// drops ticks a slow receiver misses rather than queueing them.
	NewTicker(d time.Duration) Ticker
}

// Ticker is the part of time.Ticker the project uses.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// Real is the wall clock.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// After is time.After.
func (Real) After(d time.Duration) <-chan time.Time { return time.After(d) }

// NewTicker wraps time.NewTicker.
func (Real) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time { return r.t.C }
func (r realTicker) Stop()               { r.t.Stop() }

// Fake is a clock that only moves when Advance or Set is called. Timers and
// tickers created from it fire during Advance, in time order.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	waiters []*fakeWaiter
	// changed is closed and replaced whenever a waiter is added, so tests can
	// wait for a goroutine to block on the clock (see BlockUntil).
	changed chan struct{}
}

type fakeWaiter struct {
	at     time.Time
	period time.Duration // > 0 for tickers
	ch     chan time.Time
	done   bool
}

// NewFake returns a fake clock set to start.
func NewFake(start time.Time) *Fake {
	return &Fake{now: start, changed: make(chan struct{})}
}

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// After returns a channel that receives once the fake time reaches now+d.
func (f *Fake) After(d time.Duration) <-chan time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := &fakeWaiter{at: f.now.Add(d), ch: make(chan time.Time, 1)}
	if d <= 0 {
		w.ch <- f.now
		return w.ch
	}
	f.addLocked(w)
	return w.ch
}

// NewTicker returns a ticker driven by Advance. Its channel holds one tick;
// ticks the receiver has not taken are dropped (coalesced).
func (f *Fake) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("clock: non-positive ticker period")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	w := &fakeWaiter{at: f.now.Add(d), period: d, ch: make(chan time.Time, 1)}
	f.addLocked(w)
	return &fakeTicker{f: f, w: w}
}

func (f *Fake) addLocked(w *fakeWaiter) {
	f.waiters = append(f.waiters, w)
	close(f.changed)
	f.changed = make(chan struct{})
}

// Waiters reports how many timers and tickers are pending.
func (f *Fake) Waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pendingLocked()
}

func (f *Fake) pendingLocked() int {
	n := 0
	for _, w := range f.waiters {
		if !w.done {
			n++
		}
	}
	return n
}

// BlockUntil waits until at least n timers and tickers are pending (a
// goroutine under test has blocked on the clock), so that a test can move
// the clock knowing who it wakes. It returns an error once ctx is done
// first.
func (f *Fake) BlockUntil(ctx context.Context, n int) error {
	for {
		f.mu.Lock()
		pending := f.pendingLocked()
		changed := f.changed
		f.mu.Unlock()
		if pending >= n {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d pending timers, %d pending: %w", n, pending, ctx.Err())
		}
	}
}

// Advance moves the clock forward by d, firing every timer and ticker that
// falls due on the way, in order.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	target := f.now.Add(d)
	f.mu.Unlock()
	f.Set(target)
}

// Set moves the clock to t (never backwards), firing what falls due.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for {
		var next *fakeWaiter
		for _, w := range f.waiters {
			if w.done || w.at.After(t) {
				continue
			}
			if next == nil || w.at.Before(next.at) {
				next = w
			}
		}
		if next == nil {
			break
		}
		if next.at.After(f.now) {
			f.now = next.at
		}
		select {
		case next.ch <- next.at:
		default: // the receiver still holds a tick: coalesce
		}
		if next.period > 0 {
			next.at = next.at.Add(next.period)
		} else {
			next.done = true
		}
	}
	if t.After(f.now) {
		f.now = t
	}
	kept := f.waiters[:0]
	for _, w := range f.waiters {
		if !w.done {
			kept = append(kept, w)
		}
	}
	f.waiters = kept
}

type fakeTicker struct {
	f *Fake
	w *fakeWaiter
}

func (t *fakeTicker) C() <-chan time.Time { return t.w.ch }

func (t *fakeTicker) Stop() {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	t.w.done = true
}

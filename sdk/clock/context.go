package clock

import (
	"context"
	"sync"
	"time"
)

// WithTimeout is context.WithTimeout on clock c: the context is cancelled
// once d has passed on c. On the Real clock it is context.WithTimeout itself
// (so the deadline travels with gRPC calls); on a Fake it is cancelled when
// the fake time is advanced past d, with context.DeadlineExceeded as its
// cause.
func WithTimeout(parent context.Context, c Clock, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := c.(Real); ok {
		return context.WithTimeout(parent, d)
	}
	ctx, cancel := context.WithCancelCause(parent)
	fired := c.After(d)
	done := make(chan struct{})
	go func() {
		select {
		case <-fired:
			cancel(context.DeadlineExceeded)
		case <-ctx.Done():
		case <-done:
		}
	}()
	var once sync.Once
	// Like every context.CancelFunc, it may be called more than once.
	return ctx, func() {
		once.Do(func() { close(done) })
		cancel(context.Canceled)
	}
}

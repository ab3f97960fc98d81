package clock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk/clock"
)

func TestFake(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

	t.Run("AfterFiresWhenAdvancedPast", func(t *testing.T) {
		c := clock.NewFake(start)
		ch := c.After(10 * time.Second)
		c.Advance(9 * time.Second)
		select {
		case <-ch:
			t.Fatal("fired early")
		default:
		}
		c.Advance(time.Second)
		select {
		case at := <-ch:
			if !at.Equal(start.Add(10 * time.Second)) {
				t.Fatalf("fired at %v", at)
			}
		default:
			t.Fatal("did not fire")
		}
	})

	t.Run("TickerCoalescesMissedTicks", func(t *testing.T) {
		c := clock.NewFake(start)
		tk := c.NewTicker(30 * time.Second)
		defer tk.Stop()
		c.Advance(95 * time.Second) // three periods pass, nobody receives
		n := 0
		for {
			select {
			case <-tk.C():
				n++
				continue
			default:
			}
			break
		}
		if n != 1 {
			t.Fatalf("received %d ticks, want 1 (coalesced)", n)
		}
		c.Advance(25 * time.Second) // the next period boundary is at 120s
		select {
		case at := <-tk.C():
			if !at.Equal(start.Add(120 * time.Second)) {
				t.Fatalf("tick at %v", at)
			}
		default:
			t.Fatal("no tick at 120s")
		}
	})

	t.Run("StoppedTickerIsDropped", func(t *testing.T) {
		c := clock.NewFake(start)
		tk := c.NewTicker(time.Second)
		tk.Stop()
		c.Advance(time.Minute)
		if c.Waiters() != 0 {
			t.Fatalf("waiters = %d", c.Waiters())
		}
	})
}

func TestFakeBlockUntil(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

	t.Run("ReturnsOnceAGoroutineWaitsOnTheClock", func(t *testing.T) {
		c := clock.NewFake(start)
		fired := make(chan time.Time)
		go func() { fired <- <-c.After(time.Minute) }()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.BlockUntil(ctx, 1); err != nil {
			t.Fatal(err)
		}
		c.Advance(time.Minute) // the goroutine's timer exists: this wakes it
		if at := <-fired; !at.Equal(start.Add(time.Minute)) {
			t.Fatalf("fired at %v", at)
		}
	})

	t.Run("AlreadyPending_ReturnsAtOnce", func(t *testing.T) {
		c := clock.NewFake(start)
		tk := c.NewTicker(time.Second)
		defer tk.Stop()
		if err := c.BlockUntil(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("NobodyWaits_ErrorOnceCtxIsDone", func(t *testing.T) {
		c := clock.NewFake(start)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := c.BlockUntil(ctx, 1); !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestWithTimeout(t *testing.T) {
	c := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	ctx, cancel := clock.WithTimeout(context.Background(), c, 30*time.Second)
	defer cancel()
	c.Advance(29 * time.Second)
	if ctx.Err() != nil {
		t.Fatal("cancelled early")
	}
	c.Advance(time.Second)
	<-ctx.Done() // the watcher goroutine cancels right after the advance
	if !errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
		t.Fatalf("cause = %v", context.Cause(ctx))
	}
}

// The cancel function of a fake-clock timeout may be called more than once,
// as every context.CancelFunc may (a deferred cancel after an early one).
func TestWithTimeoutCancelTwice(t *testing.T) {
	c := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	ctx, cancel := clock.WithTimeout(context.Background(), c, 30*time.Second)
	cancel()
	cancel()
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("err = %v", ctx.Err())
	}
}

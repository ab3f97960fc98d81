// Package eventually waits, bounded, for what a test cannot be told about:
// a real process, the API server, PostgreSQL. It polls a condition until it
// holds or a bound has passed; the bound is far beyond the expected time, so
// a passing test waits only as long as the outside world takes.
//
// It is not for what the code under test does itself (wait on a test signal
// from internal/testsignal) nor for a threshold of time to pass (advance a
// fake clock from sdk/clock): a poll is the last resort, for waits nothing
// can signal.
package eventually

import (
	"testing"
	"time"
)

// EveryDefault is how often a condition is polled unless Every says.
const EveryDefault = 10 * time.Millisecond

// Option tunes a poll.
type Option func(*poll)

type poll struct {
	every time.Duration
}

// Every polls every d instead of EveryDefault: slower for a condition that
// costs a round trip to a shared server, or that moves a fake clock each
// time it is asked.
func Every(d time.Duration) Option {
	return func(p *poll) {
		if d > 0 {
			p.every = d
		}
	}
}

// Until polls cond until it holds, for at most within, and reports whether
// it held. cond is asked at least once, and once more after the bound has
// passed before Until gives up.
func Until(within time.Duration, cond func() bool, opts ...Option) bool {
	p := poll{every: EveryDefault}
	for _, o := range opts {
		o(&p)
	}
	deadline := time.Now().Add(within)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		// The one sleep of the test kit: the pace between two polls of
		// something outside the test.
		time.Sleep(p.every)
	}
}

// True fails tb (Fatalf, so call it from the test's goroutine) unless cond
// holds within the bound, saying what it waited for.
func True(tb testing.TB, within time.Duration, what string, cond func() bool, opts ...Option) {
	tb.Helper()
	if !Until(within, cond, opts...) {
		tb.Fatalf("timed out after %s waiting for %s", within, what)
	}
}

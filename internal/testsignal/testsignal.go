// Package testsignal lets a test wait for something the code under test does
// itself (a goroutine reached a point, a call was queued) without sleeping
// or polling. A component holds a TestSignal at each such point and calls
// Signal there; in production the signal was never initialised and Signal
// does nothing. A test calls Init before it starts the component, then
// WaitOrTimeout for each value it expects.
//
// Product code may import this package; it imports nothing of the test kit
// and no testing package. The shape follows River's test signals.
package testsignal

import "time"

// WaitTimeout bounds WaitOrTimeout: far beyond any expected wait, so a
// passing test never waits for it.
const WaitTimeout = 30 * time.Second

// capacity is how many signals may wait unread; one more fails the test
// rather than blocking the code under test.
const capacity = 64

// TB is the part of testing.TB a signal needs.
type TB interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// TestSignal is a point in the code that a test can wait for, carrying a
// value of type T. Its zero value is ready for Signal, which then does
// nothing. Copies share the signal once it is initialised.
type TestSignal[T any] struct {
	ch chan T
	tb TB
}

// Init makes the signal record what Signal sends. Only tests call it, before
// the code that signals starts.
func (s *TestSignal[T]) Init(tb TB) {
	s.ch = make(chan T, capacity)
	s.tb = tb
}

// Signal records v for WaitOrTimeout; without Init it does nothing. It never
// blocks: a signal nobody reads in time fails the test instead.
func (s *TestSignal[T]) Signal(v T) {
	if s.ch == nil {
		return
	}
	select {
	case s.ch <- v:
	default:
		s.tb.Errorf("test signal full: %d values unread", capacity)
	}
}

// WaitOrTimeout returns the next value signalled, in order, or fails the
// test (Fatalf: call it from the test's goroutine) after WaitTimeout.
func (s *TestSignal[T]) WaitOrTimeout() T {
	if s.ch == nil {
		panic("testsignal: WaitOrTimeout on a signal that was never initialised")
	}
	s.tb.Helper()
	select {
	case v := <-s.ch:
		return v
	case <-time.After(WaitTimeout):
		s.tb.Fatalf("timed out after %s waiting for a test signal", WaitTimeout)
	}
	var zero T
	return zero
}

// RequireEmpty fails the test if a value was signalled and not yet waited
// for.
func (s *TestSignal[T]) RequireEmpty() {
	if s.ch == nil {
		panic("testsignal: RequireEmpty on a signal that was never initialised")
	}
	s.tb.Helper()
	select {
	case v := <-s.ch:
		s.tb.Errorf("test signal not empty: %v", v)
	default:
	}
}

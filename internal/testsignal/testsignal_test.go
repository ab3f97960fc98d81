package testsignal_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/dexaflow/reaper/internal/testsignal"
)

// recordTB records failures instead of ending the test.
type recordTB struct {
	mu     sync.Mutex
	errors []string
}

func (r *recordTB) Helper() {}

func (r *recordTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func (r *recordTB) Fatalf(format string, args ...any) { r.Errorf(format, args...) }

func TestTestSignal(t *testing.T) {
	t.Parallel()

	t.Run("Uninitialised_SignalIsANoOp", func(t *testing.T) {
		t.Parallel()
		var s testsignal.TestSignal[int]
		s.Signal(1) // neither blocks nor panics
	})

	t.Run("Initialised_WaitReturnsTheValuesInOrder", func(t *testing.T) {
		t.Parallel()
		var s testsignal.TestSignal[int]
		s.Init(t)
		go func() {
			s.Signal(1)
			s.Signal(2)
		}()
		if a, b := s.WaitOrTimeout(), s.WaitOrTimeout(); a != 1 || b != 2 {
			t.Fatalf("got %d then %d, want 1 then 2", a, b)
		}
		s.RequireEmpty()
	})

	t.Run("ACopyMadeAfterInit_SignalsTheOriginal", func(t *testing.T) {
		t.Parallel()
		var s testsignal.TestSignal[string]
		s.Init(t)
		type config struct{ signal testsignal.TestSignal[string] }
		c := config{signal: s}
		c.signal.Signal("copied")
		if got := s.WaitOrTimeout(); got != "copied" {
			t.Fatalf("got %q", got)
		}
	})

	t.Run("Full_FailsTheTestInsteadOfBlocking", func(t *testing.T) {
		t.Parallel()
		tb := &recordTB{}
		var s testsignal.TestSignal[int]
		s.Init(tb)
		for i := range 100 {
			s.Signal(i)
		}
		if len(tb.errors) == 0 {
			t.Fatal("a full signal did not fail the test")
		}
	})

	t.Run("Unread_RequireEmptyFails", func(t *testing.T) {
		t.Parallel()
		tb := &recordTB{}
		var s testsignal.TestSignal[int]
		s.Init(tb)
		s.Signal(7)
		s.RequireEmpty()
		if len(tb.errors) != 1 {
			t.Fatalf("errors %v, want one", tb.errors)
		}
	})
}

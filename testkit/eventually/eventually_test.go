package eventually_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dexaflow/reaper/testkit/eventually"
)

// fatalTB records a Fatalf instead of ending the test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) { f.msg = fmt.Sprintf(format, args...) }

func TestUntil(t *testing.T) {
	t.Parallel()

	// Each condition holds at its n-th poll: Until returns then, having
	// asked exactly n times.
	for name, n := range map[string]int32{"HeldAtOnce_AskedOnce": 1, "HeldAtTheThirdPoll_ReturnsThen": 3} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var asked atomic.Int32
			if !eventually.Until(time.Minute, func() bool { return asked.Add(1) == n }) {
				t.Fatalf("a condition that holds at poll %d was not seen to hold", n)
			}
			if got := asked.Load(); got != n {
				t.Fatalf("asked %d times, want %d", got, n)
			}
		})
	}

	t.Run("NeverHeld_FalseAfterTheBound_AskedOnceMoreAtIt", func(t *testing.T) {
		t.Parallel()
		var last time.Time
		begin := time.Now()
		if eventually.Until(30*time.Millisecond, func() bool { last = time.Now(); return false }) {
			t.Fatal("a condition that never holds was seen to hold")
		}
		if last.Sub(begin) < 30*time.Millisecond {
			t.Fatalf("last asked %s after the start, before the bound", last.Sub(begin))
		}
	})

	t.Run("Every_SetsThePace", func(t *testing.T) {
		t.Parallel()
		var asked atomic.Int32
		begin := time.Now()
		eventually.Until(time.Minute, func() bool { return asked.Add(1) == 3 }, eventually.Every(20*time.Millisecond))
		if took := time.Since(begin); took < 40*time.Millisecond {
			t.Fatalf("three polls 20ms apart took %s", took)
		}
	})
}

func TestTrue(t *testing.T) {
	t.Parallel()

	t.Run("Held_NoFailure", func(t *testing.T) {
		t.Parallel()
		tb := &fatalTB{TB: t}
		eventually.True(tb, time.Minute, "nothing", func() bool { return true })
		if tb.msg != "" {
			t.Fatalf("failed: %s", tb.msg)
		}
	})

	t.Run("NeverHeld_FailsSayingWhatAndTheBound", func(t *testing.T) {
		t.Parallel()
		tb := &fatalTB{TB: t}
		eventually.True(tb, 20*time.Millisecond, "the answer", func() bool { return false })
		if !strings.Contains(tb.msg, "the answer") || !strings.Contains(tb.msg, "20ms") {
			t.Fatalf("failure %q: want what was waited for and the bound", tb.msg)
		}
	})
}

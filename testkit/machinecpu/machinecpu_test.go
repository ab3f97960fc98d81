package machinecpu_test

import (
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/dexaflow/reaper/testkit/machinecpu"
)

// A busy loop of the test's own shows up in the machine's busy time.
func TestMeasuredCountsTheTestsOwnWork(t *testing.T) {
	if runtime.GOOS != "linux" {
		if !math.IsNaN(machinecpu.Busy()) {
			t.Fatal("Busy without /proc/stat is not NaN")
		}
		t.Skip("no /proc/stat")
	}
	cpu, err := machinecpu.Measured(func() error {
		for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
		}
		return nil
	})
	if err != nil || math.IsNaN(cpu) || cpu < 0.1 {
		t.Fatalf("measured %v s (err %v) over 0.3 s of spinning", cpu, err)
	}
}

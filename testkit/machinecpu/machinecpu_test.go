package machinecpu_test

import (
	"math"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/dexaflow/reaper/testkit/machinecpu"
)

// A busy loop of the test's own shows up in the machine's busy time and
// in the process's.
func TestMeasuredCountsTheTestsOwnWork(t *testing.T) {
	if runtime.GOOS != "linux" {
		if !math.IsNaN(machinecpu.Busy()) {
			t.Fatal("Busy without /proc/stat is not NaN")
		}
		t.Skip("no /proc/stat")
	}
	own := machinecpu.Process(os.Getpid())
	cpu, err := machinecpu.Measured(func() error {
		for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
		}
		return nil
	})
	if err != nil || math.IsNaN(cpu) || cpu < 0.1 {
		t.Fatalf("the machine: measured %v s (err %v) over 0.3 s of spinning", cpu, err)
	}
	if got := machinecpu.Process(os.Getpid()) - own; math.IsNaN(got) || got < 0.1 {
		t.Fatalf("the process: measured %v s over 0.3 s of spinning", got)
	}
}

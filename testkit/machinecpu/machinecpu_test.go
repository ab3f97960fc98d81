package machinecpu_test

import (
	"math"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/dexaflow/reaper/testkit/machinecpu"
)

// The test's own busy loop shows up in its process's CPU, and the machine's
// busy time counts at least as much over it (the machine may be shared:
// the loop runs until the process has spent its tenth of a second, however
// long that takes).
func TestTheProcessesWorkCountsInBoth(t *testing.T) {
	if runtime.GOOS != "linux" {
		if !math.IsNaN(machinecpu.Busy()) {
			t.Fatal("Busy without /proc/stat is not NaN")
		}
		t.Skip("no /proc/stat")
	}
	const spent = 0.1 // seconds of the process's CPU
	own := machinecpu.Process(os.Getpid())
	machine, err := machinecpu.Measured(func() error {
		for deadline := time.Now().Add(time.Minute); machinecpu.Process(os.Getpid())-own < spent; {
			if time.Now().After(deadline) {
				t.Fatal("a minute of spinning never counted in the process's CPU")
			}
			for i := 0; i < 1_000_000; i++ {
				_ = math.Sqrt(float64(i))
			}
		}
		return nil
	})
	if got := machinecpu.Process(os.Getpid()) - own; math.IsNaN(got) || got < spent {
		t.Fatalf("the process: measured %v s", got)
	}
	// /proc/stat counts in ticks of 10 ms.
	if err != nil || math.IsNaN(machine) || machine < spent-0.02 {
		t.Fatalf("the machine: measured %v s (err %v) over the process's %v s", machine, err, spent)
	}
}

// A child's CPU counts in its parent's Process, never in its Own.
func TestOwnLeavesChildrenOut(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("no /proc")
	}
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	const spent = 0.1 // seconds of the child's CPU
	for deadline := time.Now().Add(time.Minute); machinecpu.Own(cmd.Process.Pid) < spent; {
		if time.Now().After(deadline) {
			t.Fatal("a minute of the child spinning never counted in its CPU")
		}
		runtime.Gosched()
	}
	self, withChildren := machinecpu.Own(os.Getpid()), machinecpu.Process(os.Getpid())
	// Ticks of 10 ms, read one after the other: a tick of slack.
	if math.IsNaN(self) || withChildren-self < spent-0.01 {
		t.Fatalf("own %v s, with the child %v s: the child's %v s not told apart", self, withChildren, spent)
	}
}

package marked_test

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/dexaflow/reaper/testkit/eventually"
	"github.com/dexaflow/reaper/testkit/marked"
)

// A marked process (and the child it forks, which inherits the marker) is
// found with its task, an unmarked one is not, and KillAll leaves none.
func TestProcessesFindsTheMarkedAndKillAllLeavesNone(t *testing.T) {
	mark := fmt.Sprintf("%d-%d", os.Getpid(), time.Now().UnixNano())
	start := func(env ...string) *exec.Cmd {
		cmd := exec.Command("sh", "-c", "sleep 60 & wait")
		cmd.Env = append(os.Environ(), env...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	marked1 := start("TEST_MARK="+mark, "REAPER_TASK_ID=t1")
	other := start("TEST_MARK=other")

	var found []marked.Process
	eventually.Until(10*time.Second, func() bool {
		found = marked.Processes("TEST_MARK", mark)
		return len(found) == 2
	}, eventually.Every(20*time.Millisecond))
	if len(found) != 2 {
		t.Fatalf("found %+v, want the shell and its sleep", found)
	}
	pids := map[int]bool{}
	for _, p := range found {
		pids[p.PID] = true
		if p.Task != "t1" || p.Cmdline == "" {
			t.Errorf("process %+v: want task t1 and its command line", p)
		}
	}
	if !pids[marked1.Process.Pid] || pids[other.Process.Pid] {
		t.Fatalf("found %v: want %d and its child, never %d", pids, marked1.Process.Pid, other.Process.Pid)
	}

	marked.KillAll("TEST_MARK", mark)
	_ = marked1.Wait()
	if left := marked.Processes("TEST_MARK", mark); len(left) != 0 {
		t.Fatalf("left after KillAll: %+v", left)
	}
	if err := syscall.Kill(other.Process.Pid, 0); err != nil {
		t.Fatalf("the unmarked process: %v", err)
	}
}

package proc

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/testkit/eventually"
)

// startGroup starts sh -c script as the leader of a new process group.
func startGroup(t *testing.T, script string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
		_ = cmd.Wait()
	})
	return cmd
}

// waitFile waits, bounded, for a process under test to create path.
func waitFile(t *testing.T, path string) {
	t.Helper()
	eventually.True(t, 10*time.Second, path+" to appear", func() bool { _, err := os.Stat(path); return err == nil })
}

func TestStatSelf(t *testing.T) {
	info, err := Stat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if info.PID != os.Getpid() || info.PPID != os.Getppid() || info.PGID != unix.Getpgrp() || info.Start == 0 || info.Zombie {
		t.Fatalf("Stat(self) = %+v", info)
	}
	again, _ := Stat(os.Getpid())
	if again.Start != info.Start {
		t.Fatalf("start time moved: %d then %d", info.Start, again.Start)
	}
}

func TestGoneProcess(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if ok, err := Exists(pid); err != nil || ok {
		t.Fatalf("Exists(reaped pid) = %v, %v", ok, err)
	}
	if _, err := Stat(pid); !errors.Is(err, ErrNotExist) {
		t.Fatalf("Stat(reaped pid) = %v", err)
	}
}

func TestZombieGroupIsNotRunning(t *testing.T) {
	// The leader exits but is not reaped (the test does not wait yet): the
	// kernel still has the group, yet nothing of it runs.
	cmd := startGroup(t, "exit 0")
	pgid := cmd.Process.Pid
	if !eventually.Until(10*time.Second, func() bool {
		info, err := Stat(pgid)
		if err != nil {
			t.Fatal(err)
		}
		return info.Zombie
	}) {
		t.Fatal("leader did not exit")
	}
	if ok, _ := GroupExists(pgid); !ok {
		t.Fatal("signal 0 should still see the zombie's group")
	}
	if running, err := GroupRunning(pgid); err != nil || running {
		t.Fatalf("GroupRunning(zombie group) = %v, %v", running, err)
	}
}

func TestGroupRunningSeesMembersAfterLeaderExit(t *testing.T) {
	dir := t.TempDir()
	cmd := startGroup(t, "sleep 1000 & echo $! > "+dir+"/child; exit 0")
	pgid := cmd.Process.Pid
	if err := cmd.Wait(); err != nil { // leader reaped, child runs on
		t.Fatal(err)
	}
	if running, err := GroupRunning(pgid); err != nil || !running {
		t.Fatalf("GroupRunning = %v, %v; want true", running, err)
	}
	if _, err := StopGroup(context.Background(), clock.Real{}, pgid, 5*time.Second, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if running, _ := GroupRunning(pgid); running {
		t.Fatal("group still runs after StopGroup")
	}
}

func TestSignalRefusals(t *testing.T) {
	for _, id := range []int{-1, 0, 1} {
		if _, err := SignalGroup(id, unix.SIGTERM); err == nil {
			t.Errorf("SignalGroup(%d) accepted", id)
		}
		if _, err := Signal(id, unix.SIGTERM); err == nil {
			t.Errorf("Signal(%d) accepted", id)
		}
	}
	if _, err := SignalGroup(unix.Getpgrp(), unix.Signal(0)); err == nil {
		t.Error("SignalGroup(own group) accepted")
	}
	if _, err := Signal(os.Getpid(), unix.Signal(0)); err == nil {
		t.Error("Signal(self) accepted")
	}
}

func TestStopGroupEscalatesToKill(t *testing.T) {
	ready := t.TempDir() + "/ready"
	cmd := startGroup(t, "trap '' TERM; : > "+ready+"; while :; do sleep 0.05; done")
	pgid := cmd.Process.Pid
	waitFile(t, ready)
	// The leader is not reaped until cleanup: its zombie must not count.
	rep, err := StopGroup(context.Background(), clock.Real{}, pgid, 200*time.Millisecond, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Terminated || !rep.Killed || !rep.Gone {
		t.Fatalf("StopGroup = %+v; want SIGTERM, SIGKILL and gone", rep)
	}
}

func TestBootID(t *testing.T) {
	a, err := BootID()
	if err != nil || a == "" {
		t.Fatalf("BootID() = %q, %v", a, err)
	}
	if b, _ := BootID(); b != a {
		t.Fatalf("boot id changed: %q then %q", a, b)
	}
}

package lite_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/lite"
	"github.com/dexaflow/reaper/substrate/lite/proc"
	"github.com/dexaflow/reaper/substrate/lite/records"
)

// BenchmarkLiveness1000 reads the liveness of 1,000 attempts whose records
// are on disk: half name a few real live process groups (agent and group
// both alive and verifiable), half name processes that have exited.
func BenchmarkLiveness1000(b *testing.B) {
	benchLiveness(b, 4)
}

// BenchmarkLiveness1000Distinct is the same batch as production sees it:
// every live attempt has its own agent process and its own task group (1,000
// live processes), so nothing is read twice.
func BenchmarkLiveness1000Distinct(b *testing.B) {
	benchLiveness(b, 500)
}

// BenchmarkLivenessDead1000 is the batch a mass recovery probes: 1,000
// attempts whose agents were killed, their records naming 16 processes that
// have exited (an agent and a group leader each), so every attempt reads
// dead after one record read.
func BenchmarkLivenessDead1000(b *testing.B) {
	dir, err := records.Open(filepath.Join(b.TempDir(), "records"))
	if err != nil {
		b.Fatal(err)
	}
	boot, _ := proc.BootID()
	dead := benchDeadPIDs(b, 16)
	attempts := benchAttempts(1000)
	for i, a := range attempts {
		agent, leader := dead[i%len(dead)], dead[(i+1)%len(dead)]
		mustWrite(b, dir.WriteAgent(records.AgentRecord{Attempt: a, PID: agent, Start: 12345, Boot: boot}))
		mustWrite(b, dir.WriteGroup(records.GroupRecord{Attempt: a, PGID: leader, AgentPID: agent,
			AgentStart: 12345, LeaderStart: 12345, Boot: boot}))
	}
	timeProbe(b, dir, attempts, func(got []sdk.AttemptLiveness) {
		for _, l := range got {
			if l.State != sdk.Dead || l.Orphan {
				b.Fatalf("unexpected answer: %+v", l)
			}
		}
	})
}

func benchLiveness(b *testing.B, liveAttempts int) {
	dir, err := records.Open(filepath.Join(b.TempDir(), "records"))
	if err != nil {
		b.Fatal(err)
	}
	boot, _ := proc.BootID()
	type pair struct{ agent, leader proc.Info }
	var live []pair
	for range liveAttempts {
		agent, err := proc.Stat(benchLeader(b))
		if err != nil {
			b.Fatal(err)
		}
		leader, err := proc.Stat(benchLeader(b))
		if err != nil {
			b.Fatal(err)
		}
		live = append(live, pair{agent, leader})
	}
	dead := benchDeadPIDs(b, 8)
	attempts := benchAttempts(1000)
	for i, a := range attempts {
		if i%2 == 0 {
			p := live[(i/2)%len(live)]
			mustWrite(b, dir.WriteAgent(records.AgentRecord{Attempt: a, PID: p.agent.PID, Start: p.agent.Start, Boot: boot}))
			mustWrite(b, dir.WriteGroup(records.GroupRecord{Attempt: a, PGID: p.leader.PID, AgentPID: p.agent.PID,
				AgentStart: p.agent.Start, LeaderStart: p.leader.Start, Boot: boot}))
		} else {
			d := dead[i%len(dead)]
			mustWrite(b, dir.WriteAgent(records.AgentRecord{Attempt: a, PID: d, Start: 12345, Boot: boot}))
			mustWrite(b, dir.WriteGroup(records.GroupRecord{Attempt: a, PGID: d, AgentPID: d,
				AgentStart: 12345, LeaderStart: 12345, Boot: boot}))
		}
	}
	timeProbe(b, dir, attempts, func(got []sdk.AttemptLiveness) {
		if got[0].State != sdk.Alive || got[0].Orphan || got[1].State != sdk.Dead {
			b.Fatalf("unexpected answers: %+v / %+v", got[0], got[1])
		}
	})
}

// benchDeadPIDs returns the PIDs of n processes that have exited.
func benchDeadPIDs(b *testing.B, n int) []int {
	dead := make([]int, n)
	for i := range dead {
		dead[i] = benchDeadPID(b)
	}
	return dead
}

// benchAttempts names n attempts, ten to a run.
func benchAttempts(n int) []sdk.Attempt {
	out := make([]sdk.Attempt, n)
	for i := range out {
		out[i] = sdk.Attempt{RunID: fmt.Sprintf("run-%d", i/10), TaskID: fmt.Sprintf("task_%d", i%10), Try: 1}
	}
	return out
}

// timeProbe times probing attempts (their records in dir) in a loop, each
// batch's answers handed to check, and reports the CPU an attempt.
func timeProbe(b *testing.B, dir *records.Dir, attempts []sdk.Attempt, check func([]sdk.AttemptLiveness)) {
	ctx := context.Background()
	log := hclog.NewNullLogger()
	cpu0 := processCPU()
	b.ResetTimer()
	for b.Loop() {
		got, err := lite.Probe(ctx, dir, attempts, log)
		if err != nil {
			b.Fatal(err)
		}
		check(got)
	}
	reportCPU(b, cpu0, len(attempts))
}

// processCPU is the CPU time (user and system) this process has used. The
// probe runs on several workers, so ns/op (wall time) hides what it costs.
func processCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the CPU time used since cpu0 per attempt probed.
func reportCPU(b *testing.B, cpu0 time.Duration, attempts int) {
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N*attempts), "cpu-ns/attempt")
}

func mustWrite(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

// benchLeader starts a process leading its own group; it is killed when the
// benchmark ends.
func benchLeader(b testing.TB) int {
	b.Helper()
	cmd := exec.Command("sleep", "1000")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
		_ = cmd.Wait()
	})
	return cmd.Process.Pid
}

// benchDeadPID returns the PID of a process that has exited and been reaped.
func benchDeadPID(b testing.TB) int {
	b.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		b.Fatal(err)
	}
	return cmd.Process.Pid
}

package lite_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/runner/literunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/substrate/lite"
	"github.com/dexaflow/reaper/substrate/lite/proc"
	"github.com/dexaflow/reaper/substrate/lite/records"
	"github.com/dexaflow/reaper/testkit/eventually"
)

// agentPath is the reaper-agent binary TestMain builds for this package.
var agentPath string

func TestMain(m *testing.M) {
	if os.Getenv(probeHelperEnv) != "" {
		os.Exit(probeHelper()) // this binary re-run as another user
	}
	dir, err := os.MkdirTemp("", "lite-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	agentPath = filepath.Join(dir, literunner.AgentBinary)
	build := exec.Command("go", "build", "-o", agentPath, "github.com/dexaflow/reaper/cmd/reaper-agent")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building reaper-agent:", err)
		os.RemoveAll(dir)
		os.Exit(2)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// bundle is one test's Lite world: a configured substrate on its own record
// directory, a spawner, and a scratch directory for the tasks.
type bundle struct {
	sub     *lite.Substrate
	dir     *records.Dir
	spawner *literunner.Spawner
	work    string
	logs    *lockedBuffer
	seq     int
}

type opts struct {
	stopGrace, killWait string
	clock               *clock.Fake // nil: the real clock
}

func setup(t *testing.T, o opts) *bundle {
	t.Helper()
	if o.stopGrace == "" {
		o.stopGrace = "10s"
	}
	if o.killWait == "" {
		o.killWait = "5s"
	}
	logs := &lockedBuffer{}
	var clk clock.Clock = clock.Real{}
	if o.clock != nil {
		clk = o.clock
	}

	sub := lite.NewWithClock(hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Debug}), clk)
	t.Cleanup(sub.Close)
	err := sub.Configure(context.Background(), sdk.ConfigureRequest{Edition: "lite", Values: sdk.Values{
		lite.AttrRecordDir: filepath.Join(t.TempDir(), "records"),
		lite.AttrStopGrace: o.stopGrace,
		lite.AttrKillWait:  o.killWait,
	}})
	if err != nil {
		t.Fatal(err)
	}
	sp, err := literunner.NewSpawner(literunner.SpawnerConfig{AgentPath: agentPath, Records: sub.Records()})
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{sub: sub, dir: sub.Records(), spawner: sp, work: t.TempDir(), logs: logs}
}

// lockedBuffer collects logs written from several goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (b *bundle) attempt(t *testing.T) sdk.Attempt {
	b.seq++
	return sdk.Attempt{RunID: "run_" + t.Name(), TaskID: fmt.Sprintf("task.%d", b.seq), Try: 1, Epoch: 0}
}

// spawn starts an agent for a running attempt; cleanup kills whatever of it
// is left and reaps the agent.
func (b *bundle) spawn(t *testing.T, a sdk.Attempt, command string, edit func(*agent.Invocation)) *literunner.Agent {
	t.Helper()
	inv := agent.Invocation{
		Attempt:    a,
		Command:    command,
		Reporter:   agent.ReporterFile,
		ReportFile: filepath.Join(b.work, records.Name(a)+".report.jsonl"),
	}
	if edit != nil {
		edit(&inv)
	}
	ag, err := b.spawner.Spawn(context.Background(), literunner.SpawnRequest{Invocation: inv, Env: []string{"WORK=" + b.work}})
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { // the spawner is the agent's parent: reap it when it exits
		defer close(waited)
		_, _ = ag.Wait()
	}()
	t.Cleanup(func() {
		if g, err := b.dir.ReadGroup(a); err == nil {
			_, _ = proc.SignalGroup(g.PGID, unix.SIGKILL)
		}
		_, _ = proc.Signal(ag.PID, unix.SIGKILL)
		<-waited
		if t.Failed() {
			logs, _ := os.ReadFile(ag.Log)
			t.Logf("agent log:\n%s", logs)
		}
	})
	return ag
}

// group waits, bounded, for the agent to record its task's group.
func (b *bundle) group(t *testing.T, a sdk.Attempt) records.GroupRecord {
	t.Helper()
	var rec records.GroupRecord
	eventually.True(t, processWait, "the group record", func() bool {
		var err error
		rec, err = b.dir.ReadGroup(a)
		return err == nil
	})
	return rec
}

// await waits, bounded, for a task to create the file name in the scratch
// directory.
func (b *bundle) await(t *testing.T, name string) {
	t.Helper()
	eventually.True(t, processWait, name, func() bool { _, err := os.Stat(filepath.Join(b.work, name)); return err == nil })
}

func (b *bundle) live(t *testing.T, a sdk.Attempt) sdk.AttemptLiveness {
	t.Helper()
	got, err := b.sub.Liveness(context.Background(), sdk.LivenessRequest{Attempts: []sdk.Attempt{a}})
	if err != nil {
		t.Fatal(err)
	}
	return got[0]
}

// processWait bounds a wait on a real process (an agent, a task's group).
const processWait = 15 * time.Second

func gone(pid int) bool {
	info, err := proc.Stat(pid)
	return errors.Is(err, proc.ErrNotExist) || (err == nil && info.Zombie)
}

func expect(t *testing.T, got sdk.AttemptLiveness, state, agentL, group sdk.Liveness, orphan bool) {
	t.Helper()
	if got.State != state || got.Agent != agentL || got.Group != group || got.Orphan != orphan {
		t.Fatalf("liveness = state %s agent %s group %s orphan %v (%s); want state %s agent %s group %s orphan %v",
			got.State, got.Agent, got.Group, got.Orphan, got.Detail, state, agentL, group, orphan)
	}
}

func TestKilledAgentLeavesGroupAliveUntilGroupDies(t *testing.T) {
	b := setup(t, opts{})
	a := b.attempt(t)
	ag := b.spawn(t, a, `sleep 1000 & : > "$WORK/started"; sleep 1000`, nil)
	g := b.group(t, a)
	// The record exists before the command runs; an agent killed before it
	// releases the command means the command never runs at all.
	b.await(t, "started")
	expect(t, b.live(t, a), sdk.Alive, sdk.Alive, sdk.Alive, false)

	if err := unix.Kill(ag.PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, processWait, "the agent to die", func() bool { return gone(ag.PID) })
	expect(t, b.live(t, a), sdk.Alive, sdk.Dead, sdk.Alive, true)

	if err := unix.Kill(-g.PGID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, processWait, "the group to die", func() bool { r, _ := proc.GroupRunning(g.PGID); return !r })
	expect(t, b.live(t, a), sdk.Dead, sdk.Dead, sdk.Dead, false)
}

func TestBackgroundChildKeepsAttemptAliveUntilItExits(t *testing.T) {
	b := setup(t, opts{})
	a := b.attempt(t)
	// The leader backgrounds a child (which does not hold the output) and
	// exits when told; the child exits when told.
	ag := b.spawn(t, a, `sh -c 'while [ ! -e "$WORK/release" ]; do sleep 0.02; done' >/dev/null 2>&1 &
: > "$WORK/started"
while [ ! -e "$WORK/leave" ]; do sleep 0.02; done`, nil)
	g := b.group(t, a)
	b.await(t, "started")
	// Kill the agent first: otherwise it would stop the leftover child
	// itself once the leader exits.
	if err := unix.Kill(ag.PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, processWait, "the agent to die", func() bool { return gone(ag.PID) })
	touch(t, filepath.Join(b.work, "leave"))
	eventually.True(t, processWait, "the leader to exit", func() bool { return gone(g.PGID) })

	got := b.live(t, a)
	// Alive through the child, but not verifiable: its leader is gone.
	expect(t, got, sdk.Alive, sdk.Dead, sdk.Alive, false)
	res, err := b.sub.StopOrphan(context.Background(), sdk.StopRequest{Attempt: a, Reason: sdk.StopOrphan})
	if err != nil || res.Stopped {
		t.Fatalf("StopOrphan of an unverifiable group = %+v, %v; want not stopped, no error", res, err)
	}
	if r, _ := proc.GroupRunning(g.PGID); !r {
		t.Fatal("an unverifiable group was signalled")
	}

	touch(t, filepath.Join(b.work, "release"))
	eventually.True(t, processWait, "the child to exit", func() bool { r, _ := proc.GroupRunning(g.PGID); return !r })
	expect(t, b.live(t, a), sdk.Dead, sdk.Dead, sdk.Dead, false)
}

func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// startLeader starts a process leading its own group, outside any agent.
func startLeader(t *testing.T, script string) *exec.Cmd {
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

// deadPID returns the PID of a process that has exited and been reaped.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

func TestReusedLeaderPIDReadsDeadAndIsNeverSignalled(t *testing.T) {
	b := setup(t, opts{stopGrace: "200ms", killWait: "1s"})
	a := b.attempt(t)
	// A live group whose leader has the recorded PID but another start time:
	// the recorded leader exited and the OS gave its PID to this process.
	other := startLeader(t, "sleep 1000")
	info, err := proc.Stat(other.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	boot, _ := proc.BootID()
	dead := deadPID(t)
	if err := b.dir.WriteAgent(records.AgentRecord{Attempt: a, PID: dead, Boot: boot}); err != nil {
		t.Fatal(err)
	}
	if err := b.dir.WriteGroup(records.GroupRecord{Attempt: a, PGID: info.PID, AgentPID: dead,
		LeaderStart: info.Start - 1, Boot: boot}); err != nil {
		t.Fatal(err)
	}
	expect(t, b.live(t, a), sdk.Dead, sdk.Dead, sdk.Dead, false)

	res, err := b.sub.StopOrphan(context.Background(), sdk.StopRequest{Attempt: a, Reason: sdk.StopOrphan})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Stopped {
		t.Fatalf("StopOrphan = %+v: the recorded group is gone, so nothing of it is left", res)
	}
	if gone(other.Process.Pid) {
		t.Fatal("a process that is not the recorded leader was signalled")
	}
}

func TestRecordFromAnotherBootReadsDead(t *testing.T) {
	b := setup(t, opts{})
	a := b.attempt(t)
	other := startLeader(t, "sleep 1000")
	info, _ := proc.Stat(other.Process.Pid)
	// Everything matches except the boot: nothing recorded then can exist.
	if err := b.dir.WriteAgent(records.AgentRecord{Attempt: a, PID: info.PID, Start: info.Start, Boot: "another-boot"}); err != nil {
		t.Fatal(err)
	}
	if err := b.dir.WriteGroup(records.GroupRecord{Attempt: a, PGID: info.PID, AgentPID: info.PID,
		LeaderStart: info.Start, Boot: "another-boot"}); err != nil {
		t.Fatal(err)
	}
	expect(t, b.live(t, a), sdk.Dead, sdk.Dead, sdk.Dead, false)
}

func TestMissingRecordsReadDead(t *testing.T) {
	b := setup(t, opts{})
	expect(t, b.live(t, b.attempt(t)), sdk.Dead, sdk.Dead, sdk.Dead, false)
}

func TestGarbledRecordsReadUnknownAndAreNeverSignalled(t *testing.T) {
	b := setup(t, opts{stopGrace: "200ms", killWait: "1s"})
	victim := startLeader(t, "sleep 1000")
	info, _ := proc.Stat(victim.Process.Pid)
	good := records.GroupRecord{PGID: info.PID, AgentPID: deadPID(t), LeaderStart: info.Start}
	cases := map[string]func(a sdk.Attempt) []byte{
		"Truncated": func(a sdk.Attempt) []byte {
			g := good
			g.Attempt = a
			data := g.Marshal()
			return data[:len(data)-12]
		},
		"Garbage": func(sdk.Attempt) []byte { return []byte("pgid=" + fmt.Sprint(info.PID) + "\n") },
		"PGIDOne": func(a sdk.Attempt) []byte {
			g := good
			g.Attempt, g.PGID = a, 1
			return g.Marshal()
		},
		"NegativePGID": func(a sdk.Attempt) []byte {
			g := good
			g.Attempt, g.PGID = a, -info.PID
			return g.Marshal()
		},
	}
	t.Run("AgentPIDOne", func(t *testing.T) {
		a := b.attempt(t)
		path := b.dir.AgentPath(a)
		if err := os.WriteFile(path, records.AgentRecord{Attempt: a, PID: 1}.Marshal(), 0o600); err != nil {
			t.Fatal(err)
		}
		got := b.live(t, a)
		if got.State != sdk.Unknown || got.Agent != sdk.Unknown || got.Orphan {
			t.Fatalf("liveness %+v, want unknown", got)
		}
		if !strings.Contains(b.logs.String(), path) {
			t.Fatalf("the garbled record's path is not logged:\n%s", b.logs.String())
		}
	})
	for name, content := range cases {
		t.Run(name, func(t *testing.T) {
			a := b.attempt(t)
			path := b.dir.GroupPath(a)
			if err := os.WriteFile(path, content(a), 0o600); err != nil {
				t.Fatal(err)
			}
			got := b.live(t, a)
			if got.State != sdk.Unknown || got.Group != sdk.Unknown || got.Orphan {
				t.Fatalf("liveness %+v, want unknown", got)
			}
			if !strings.Contains(b.logs.String(), path) {
				t.Fatalf("the garbled record's path is not logged:\n%s", b.logs.String())
			}
			res, err := b.sub.StopOrphan(context.Background(), sdk.StopRequest{Attempt: a, Reason: sdk.StopOrphan})
			if err != nil || res.Stopped {
				t.Fatalf("StopOrphan = %+v, %v; want not stopped", res, err)
			}
			if gone(victim.Process.Pid) {
				t.Fatal("a process named by a garbled record was signalled")
			}
		})
	}
}

func TestRecordDirectoryRefused(t *testing.T) {
	base := t.TempDir()
	cases := []struct {
		name   string
		setup  func(string) error
		reason string
	}{
		{"Symlink", func(p string) error {
			if err := os.Mkdir(p+".target", 0o700); err != nil {
				return err
			}
			return os.Symlink(p+".target", p)
		}, "it is a symlink"},
		{"OwnedByAnotherUser", func(p string) error {
			if err := os.Mkdir(p, 0o700); err != nil {
				return err
			}
			return os.Chown(p, 65534, 65534)
		}, "it is owned by uid 65534"},
		{"WritableByOthers", func(p string) error {
			if err := os.Mkdir(p, 0o700); err != nil {
				return err
			}
			return os.Chmod(p, 0o777)
		}, "writable by group or others (mode 0777)"},
		{"WritableByGroup", func(p string) error {
			if err := os.Mkdir(p, 0o700); err != nil {
				return err
			}
			return os.Chmod(p, 0o770)
		}, "writable by group or others (mode 0770)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Only this case needs root (to hand a directory to another
			// user); the others run as any user.
			if tc.name == "OwnedByAnotherUser" && os.Geteuid() != 0 {
				t.Skip("needs root to hand a directory to another user")
			}
			path := filepath.Join(base, tc.name)
			if err := tc.setup(path); err != nil {
				t.Fatal(err)
			}
			err := lite.New(nil).Configure(context.Background(), sdk.ConfigureRequest{Values: sdk.Values{lite.AttrRecordDir: path}})
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("Configure = %v; want a refusal naming %s and %q", err, path, tc.reason)
			}
		})
	}
}

// Configuring has no side effect (reaperd validate configures every plugin):
// a missing record directory is created by the first read, with a warning.
func TestNewRecordDirectoryIsCreatedAtFirstUseWithAWarning(t *testing.T) {
	logs := &bytes.Buffer{}
	sub := lite.New(hclog.New(&hclog.LoggerOptions{Output: logs}))
	path := filepath.Join(t.TempDir(), "fresh")
	if err := sub.Configure(context.Background(), sdk.ConfigureRequest{Values: sdk.Values{lite.AttrRecordDir: path}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Configure made the record directory (%v)", err)
	}
	a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}
	live, err := sub.Liveness(context.Background(), sdk.LivenessRequest{Attempts: []sdk.Attempt{a}})
	if err != nil || len(live) != 1 || live[0].State != sdk.Dead {
		t.Fatalf("liveness in a new directory = %+v, %v; want dead", live, err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("record directory %v, %v; want mode 0700", st, err)
	}
	if !strings.Contains(logs.String(), "[WARN]") || !strings.Contains(logs.String(), "record directory is new") {
		t.Fatalf("no warning about a new directory:\n%s", logs)
	}
}

func TestOrphanStopKillsAGroupThatTrapsTerm(t *testing.T) {
	b := setup(t, opts{stopGrace: "300ms", killWait: "5s"})
	a := b.attempt(t)
	ag := b.spawn(t, a, `trap '' TERM; : > "$WORK/trapped"; sleep 1000 & while :; do sleep 0.02; done`, nil)
	g := b.group(t, a)
	b.await(t, "trapped")
	if err := unix.Kill(ag.PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, processWait, "the agent to die", func() bool { return gone(ag.PID) })
	expect(t, b.live(t, a), sdk.Alive, sdk.Dead, sdk.Alive, true)

	begin := time.Now()
	res, err := b.sub.StopOrphan(context.Background(), sdk.StopRequest{Attempt: a, Reason: sdk.StopOrphan})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Stopped || !strings.Contains(res.Detail, "SIGKILL") {
		t.Fatalf("StopOrphan = %+v; want stopped by SIGKILL", res)
	}
	if took := time.Since(begin); took < 300*time.Millisecond {
		t.Fatalf("stopped after %s, before the grace: SIGTERM cannot have done it", took)
	}
	if r, _ := proc.GroupRunning(g.PGID); r {
		t.Fatal("the group still runs")
	}
	expect(t, b.live(t, a), sdk.Dead, sdk.Dead, sdk.Dead, false)
}

// At the default timings a group that ignores SIGTERM needs 10 s, then
// SIGKILL and up to 5 s more: longer than a reaper's share of the cycle may
// allow. The stop goes on in the substrate and the call answers InFlight
// shortly before its deadline; asked again once the grace has passed (the
// substrate's clock is a fake one here, so no test waits 10 s), it answers
// stopped.
func TestOrphanStopOutlivesTheCallThatBeganIt(t *testing.T) {
	clk := clock.NewFake(time.Now())
	b := setup(t, opts{clock: clk}) // the defaults: 10s grace, 5s kill wait
	a := b.attempt(t)
	ag := b.spawn(t, a, `trap '' TERM; : > "$WORK/trapped"; sleep 1000 & while :; do sleep 0.02; done`, nil)
	g := b.group(t, a)
	b.await(t, "trapped")
	if err := unix.Kill(ag.PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, processWait, "the agent to die", func() bool { return gone(ag.PID) })

	ctx, cancel := context.WithTimeout(context.Background(), 800*time.Millisecond)
	defer cancel()
	res, err := b.sub.StopOrphan(ctx, sdk.StopRequest{Attempt: a, Reason: sdk.StopOrphan})
	if err != nil || res.Stopped || !res.InFlight {
		t.Fatalf("StopOrphan = %+v, %v; want in flight", res, err)
	}
	if ctx.Err() != nil {
		t.Fatal("the call used its whole deadline: no margin was left to the caller")
	}
	if r, _ := proc.GroupRunning(g.PGID); !r {
		t.Fatal("the trapping group died within its grace")
	}
	graceCtx, graceCancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer graceCancel()
	if err := clk.BlockUntil(graceCtx, 1); err != nil {
		t.Fatalf("the stop never waited on its grace: %v", err)
	}
	clk.Advance(10 * time.Second) // the grace passes: SIGKILL
	res, err = b.sub.StopOrphan(context.Background(), sdk.StopRequest{Attempt: a, Reason: sdk.StopOrphan})
	if err != nil || !res.Stopped || !strings.Contains(res.Detail, "SIGKILL") {
		t.Fatalf("StopOrphan after the grace = %+v, %v; want stopped by SIGKILL", res, err)
	}
	if r, _ := proc.GroupRunning(g.PGID); r {
		t.Fatal("the group still runs")
	}
}

func TestOrphanStopRefusesWhileTheAgentLives(t *testing.T) {
	b := setup(t, opts{stopGrace: "200ms", killWait: "1s"})
	a := b.attempt(t)
	b.spawn(t, a, "sleep 1000", nil)
	g := b.group(t, a)
	res, err := b.sub.StopOrphan(context.Background(), sdk.StopRequest{Attempt: a, Reason: sdk.StopOrphan})
	if err != nil || res.Stopped {
		t.Fatalf("StopOrphan = %+v, %v; want refused", res, err)
	}
	if r, _ := proc.GroupRunning(g.PGID); !r {
		t.Fatal("a live agent's group was signalled as an orphan")
	}
}

func TestCeilingStopEndsTheGroupAndTheAgentReports(t *testing.T) {
	b := setup(t, opts{stopGrace: "2s", killWait: "5s"})
	a := b.attempt(t)
	var report string
	ag := b.spawn(t, a, "sleep 1000", func(inv *agent.Invocation) { report = inv.ReportFile })
	g := b.group(t, a)
	res, err := b.sub.StopOrphan(context.Background(), sdk.StopRequest{Attempt: a, Reason: sdk.StopCredentialCeiling})
	if err != nil || !res.Stopped {
		t.Fatalf("StopOrphan(ceiling) = %+v, %v", res, err)
	}
	if r, _ := proc.GroupRunning(g.PGID); r {
		t.Fatal("the group still runs")
	}
	// The agent is never signalled: it sees its task end, reports, exits.
	eventually.True(t, processWait, "the agent to exit", func() bool { return gone(ag.PID) })
	events, err := agent.ReadReportFile(report)
	if err != nil {
		t.Fatal(err)
	}
	last := events[len(events)-1]
	if last.Event != agent.EventReport || last.Outcome.State != sdk.StateFailed || last.Outcome.Reason != agent.ReasonSignal {
		t.Fatalf("last report %+v", last)
	}
	expect(t, b.live(t, a), sdk.Dead, sdk.Dead, sdk.Dead, false)
}

// The ceiling stop reports stopped only once the agent is gone too, so the
// reaper's kill line comes after everything the agent writes. Here a
// descendant that left the group (setsid) holds the task's output open, so
// the agent drains it for up to 10 s after the group is killed: the first
// stop answers "agent still running", a later one "stopped".
func TestCeilingStopWaitsForTheAgentBeforeReportingStopped(t *testing.T) {
	b := setup(t, opts{stopGrace: "200ms", killWait: "300ms"})
	a := b.attempt(t)
	escaped := filepath.Join(b.work, "escaped.pid")
	t.Cleanup(func() {
		if raw, err := os.ReadFile(escaped); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(raw))); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	ag := b.spawn(t, a, `setsid sh -c 'echo $$ > "$WORK/escaped.pid"; exec sleep 30' & exec sleep 1000`, nil)
	g := b.group(t, a)
	eventually.True(t, processWait, "the escaped descendant to record itself", func() bool { _, err := os.Stat(escaped); return err == nil })
	res, err := b.sub.StopOrphan(context.Background(), sdk.StopRequest{Attempt: a, Reason: sdk.StopCredentialCeiling})
	if err != nil || res.Stopped || !strings.Contains(res.Detail, "agent still running") {
		t.Fatalf("StopOrphan(ceiling) = %+v, %v; want not stopped while the agent runs", res, err)
	}
	if r, _ := proc.GroupRunning(g.PGID); r {
		t.Fatal("the group still runs")
	}
	eventually.True(t, processWait, "the agent to exit", func() bool { return gone(ag.PID) })
	res, err = b.sub.StopOrphan(context.Background(), sdk.StopRequest{Attempt: a, Reason: sdk.StopCredentialCeiling})
	if err != nil || !res.Stopped {
		t.Fatalf("StopOrphan(ceiling) after the agent exited = %+v, %v", res, err)
	}
}

func TestSpawnFailsWhenTheRecordCannotBeWritten(t *testing.T) {
	b := setup(t, opts{})
	a := b.attempt(t)
	if err := os.WriteFile(b.dir.AgentPath(a), []byte("in the way"), 0o600); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(b.work, "ran")
	report := filepath.Join(b.work, "report.jsonl")
	_, err := b.spawner.Spawn(context.Background(), literunner.SpawnRequest{Invocation: agent.Invocation{
		Attempt: a, Command: "touch " + marker, Reporter: agent.ReporterFile, ReportFile: report,
	}})
	if err == nil || !strings.Contains(err.Error(), "recording the agent") {
		t.Fatalf("Spawn = %v; want a failure to record the agent", err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the task ran though its agent was never recorded")
	}
	if _, err := os.Stat(report); err == nil {
		t.Fatal("the unrecorded agent reached the control plane")
	}
}

func TestSpawnedAgentEnforcesTheTimeoutOnTheWholeGroup(t *testing.T) {
	b := setup(t, opts{})
	a := b.attempt(t)
	var report string
	ag := b.spawn(t, a, `echo before; (sleep 1000 & sleep 1000) & sleep 1000`, func(inv *agent.Invocation) {
		inv.ExecutionTimeout = 300 * time.Millisecond
		report = inv.ReportFile
	})
	g := b.group(t, a)
	eventually.True(t, processWait, "the agent to exit", func() bool { return gone(ag.PID) })
	if r, _ := proc.GroupRunning(g.PGID); r {
		t.Fatal("the group outlived its timeout")
	}
	events, err := agent.ReadReportFile(report)
	if err != nil {
		t.Fatal(err)
	}
	last := events[len(events)-1]
	if last.Outcome == nil || last.Outcome.Message != "execution_timeout: task exceeded 0.3s limit" {
		t.Fatalf("last report %+v", last)
	}
	if out, _ := os.ReadFile(ag.Output); string(out) != "before\n" {
		t.Fatalf("task output %q", out)
	}
	if _, err := b.dir.ReadAgent(a); err == nil {
		t.Fatal("the agent left its records behind after a clean finish")
	}
}

func TestSubstrateBasics(t *testing.T) {
	ctx := context.Background()
	s := lite.New(nil)
	if _, err := s.Liveness(ctx, sdk.LivenessRequest{}); err == nil {
		t.Fatal("Liveness before Configure succeeded")
	}
	info, _ := s.Info(ctx)
	if info.Name != "lite" || info.Kind != sdk.KindSubstrate || len(info.Editions) != 1 || info.Editions[0] != "lite" {
		t.Fatalf("Info = %+v", info)
	}
	schema, _ := s.ConfigSchema(ctx)
	v := schema.WithDefaults(nil)
	if v.String(lite.AttrRecordDir) != "" {
		t.Fatalf("record_dir default %q", v.String(lite.AttrRecordDir))
	}
	if d, _ := v.Duration(lite.AttrStopGrace); d != 10*time.Second {
		t.Fatalf("stop_grace default %s", d)
	}
	if d, _ := v.Duration(lite.AttrKillWait); d != 5*time.Second {
		t.Fatalf("kill_wait default %s", d)
	}
	if err := s.Configure(ctx, sdk.ConfigureRequest{Edition: "kube"}); err == nil {
		t.Fatal("configured for kube")
	}
	if err := s.Configure(ctx, sdk.ConfigureRequest{Values: sdk.Values{
		lite.AttrRecordDir: filepath.Join(t.TempDir(), "r"), lite.AttrStopGrace: "0s"}}); err == nil {
		t.Fatal("a zero stop grace was accepted")
	}
	if ok, _ := s.Synced(ctx); !ok {
		t.Fatal("not synced")
	}
	if res, err := s.Sweep(ctx, sdk.SweepRequest{}, nil); err != nil || len(res.Decisions) != 0 {
		t.Fatalf("Sweep = %+v, %v", res, err)
	}
	a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}
	out, err := s.Teardown(ctx, sdk.TeardownRequest{Attempt: &a})
	if err != nil || len(out) != 1 || out[0].Action != sdk.TeardownNothing {
		t.Fatalf("Teardown = %+v, %v", out, err)
	}
	if ws, err := s.WarmWorkers(ctx); err != nil || len(ws) != 0 {
		t.Fatalf("WarmWorkers = %v, %v", ws, err)
	}
	if _, err := s.StopOrphan(ctx, sdk.StopRequest{Attempt: a, Reason: "whim"}); err == nil {
		t.Fatal("an unknown stop reason was accepted")
	}
}

// Pruning removes the records of attempts of which nothing is left, and
// never those of an attempt whose agent or task group may still run.
func TestPruneRemovesOnlyRecordsOfAttemptsWithNothingLeft(t *testing.T) {
	b := setup(t, opts{})
	ctx := context.Background()
	later := time.Now().Add(time.Hour) // every record counts as old enough
	killAgent := func(t *testing.T, ag *literunner.Agent) {
		t.Helper()
		if err := unix.Kill(ag.PID, unix.SIGKILL); err != nil {
			t.Fatal(err)
		}
		eventually.True(t, processWait, "the agent to die", func() bool { return gone(ag.PID) })
	}
	loop := `: > "$WORK/%s"; sleep 1000 & while :; do sleep 0.02; done`

	// Everything gone: agent killed -9, then its group.
	deadA := b.attempt(t)
	ag := b.spawn(t, deadA, fmt.Sprintf(loop, "dead"), nil)
	g := b.group(t, deadA)
	b.await(t, "dead")
	killAgent(t, ag)
	if err := unix.Kill(-g.PGID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, processWait, "the group to die", func() bool { r, _ := proc.GroupRunning(g.PGID); return !r })

	// An orphan: agent killed -9, its group runs on.
	orphanA := b.attempt(t)
	ag = b.spawn(t, orphanA, fmt.Sprintf(loop, "orphan"), nil)
	b.group(t, orphanA)
	b.await(t, "orphan")
	killAgent(t, ag)

	// A group whose leader exited while a member runs on.
	leaderlessA := b.attempt(t)
	ag = b.spawn(t, leaderlessA, fmt.Sprintf(loop, "leaderless"), nil)
	lg := b.group(t, leaderlessA)
	b.await(t, "leaderless")
	killAgent(t, ag)
	if err := unix.Kill(lg.PGID, unix.SIGKILL); err != nil { // the leader only
		t.Fatal(err)
	}
	eventually.True(t, processWait, "the leader to die", func() bool { return gone(lg.PGID) })
	if r, _ := proc.GroupRunning(lg.PGID); !r {
		t.Fatal("the group's member died with its leader")
	}

	// A live agent.
	liveA := b.attempt(t)
	b.spawn(t, liveA, fmt.Sprintf(loop, "live"), nil)
	b.group(t, liveA)

	// A garbled record.
	garbledA := b.attempt(t)
	if err := os.WriteFile(b.dir.AgentPath(garbledA), []byte("not a record"), 0o600); err != nil {
		t.Fatal(err)
	}

	// Too fresh: nothing is judged that was written after the bound.
	if pruned, err := b.sub.Prune(ctx, time.Now().Add(-time.Hour)); err != nil || len(pruned) != 0 {
		t.Fatalf("prune of fresh records = %v, %v", pruned, err)
	}
	pruned, err := b.sub.Prune(ctx, later)
	if err != nil {
		t.Fatal(err)
	}
	if len(pruned) != 1 || pruned[0] != deadA {
		t.Fatalf("pruned %v; want only %s", pruned, deadA)
	}
	if _, err := b.dir.ReadAgent(deadA); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the dead attempt's agent record: %v", err)
	}
	for _, a := range []sdk.Attempt{orphanA, leaderlessA, liveA} {
		if _, err := b.dir.ReadGroup(a); err != nil {
			t.Fatalf("%s: group record gone: %v", a, err)
		}
	}
	if _, err := os.Stat(b.dir.AgentPath(garbledA)); err != nil {
		t.Fatalf("the garbled record was removed: %v", err)
	}
	// The leaderless group is stopped by hand: nothing signals it.
	_ = unix.Kill(-lg.PGID, unix.SIGKILL)
}

package tasksecrets_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/runner/literunner"
	"github.com/dexaflow/reaper/substrate/lite/proc"
)

// probeSetuidEnv, set for the probe, makes it read its own capability sets
// and its parent's, and try to become each uid the value lists (comma
// separated).
const probeSetuidEnv = "TASKSECRETS_SETUID"

// runAsCaps are the capabilities docs/operate.md and the systemd unit's
// drop-in give reaperd for runner.run_as, exactly: reaperd holds them as
// ambient capabilities and its agents inherit them.
var runAsCaps = []uintptr{unix.CAP_SETUID, unix.CAP_SETGID}

// probeCaps fills r.Caps and r.Setuid (see probeResult).
func probeCaps(r *probeResult, uids string) {
	r.Caps = map[string]string{}
	for k, v := range capsOf("/proc/self/status") {
		r.Caps[k] = v
	}
	r.Caps["ParentCapEff"] = capsOf(fmt.Sprintf("/proc/%d/status", r.PPID))["CapEff"]
	r.Setuid = map[string]string{}
	for _, s := range strings.Split(uids, ",") {
		uid, err := strconv.Atoi(s)
		if err != nil {
			continue
		}
		if err := syscall.Setuid(uid); err != nil {
			r.Setuid[s] = errnoOf(err)
		} else {
			r.Setuid[s] = "became"
		}
	}
}

// capsOf reads the Cap* lines of a /proc status file.
func capsOf(path string) map[string]string {
	out := map[string]string{}
	b, err := os.ReadFile(path)
	if err != nil {
		return out
	}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.HasPrefix(k, "Cap") {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

// twoUnprivileged are two unprivileged users: the one reaperd (and so the
// agent) runs as, and the run_as user of its tasks.
func twoUnprivileged(t *testing.T) (reaperd, tasks account) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: to run the agent as one unprivileged user with the run_as capabilities, its task as another")
	}
	var found []account
	for _, name := range []string{"nobody", "postgres", "daemon", "www-data", "bin"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.Atoi(u.Uid)
		gid, err2 := strconv.Atoi(u.Gid)
		if err1 != nil || err2 != nil || uid == 0 || (len(found) == 1 && found[0].UID == uid) {
			continue
		}
		found = append(found, account{Name: name, UID: uid, GID: gid})
		if len(found) == 2 {
			return found[0], found[1]
		}
	}
	t.Skip("needs two unprivileged accounts (of nobody, postgres, daemon, www-data, bin)")
	return account{}, account{}
}

// TestRunAsFromAnUnprivilegedAgent: reaperd without root holds exactly the
// capabilities the docs prescribe for run_as (ambient CAP_SETUID and
// CAP_SETGID), and so does the agent it starts. The real agent, run so as
// an unprivileged user, starts its task as the run_as user: the task holds
// no capability at all and cannot become the agent's user or root; and the
// agent, without CAP_KILL, still stops the task's whole group at its
// execution timeout and on should_terminate.
func TestRunAsFromAnUnprivilegedAgent(t *testing.T) {
	reaperd, tasks := twoUnprivileged(t)
	w := newWorld(t, reaperd)
	var n int
	start := func(t *testing.T, env []string, args ...string) (cmd *exec.Cmd, out, report string, done <-chan error) {
		t.Helper()
		n++
		out = filepath.Join(w.work, fmt.Sprintf("out-%d", n))
		report = filepath.Join(w.work, fmt.Sprintf("report-%d.jsonl", n))
		args = append([]string{"-mode", agent.ModeLite, "-record-dir", filepath.Join(w.work, "records"),
			"-run", "r", "-task", fmt.Sprintf("t%d", n), "-try", "1", "-run-as", tasks.Name, "-workdir", w.base,
			"-reporter", agent.ReporterFile, "-report-file", report, "-output", out}, args...)
		cmd = exec.Command(filepath.Join(binDir, literunner.AgentBinary), args...)
		cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: reaperd.Credential(), AmbientCaps: runAsCaps}
		logs := &strings.Builder{}
		cmd.Stdout, cmd.Stderr = logs, logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			if t.Failed() {
				t.Logf("the agent's log:\n%s", logs.String())
			}
		})
		return cmd, out, report, exited
	}
	// awaitExit waits for the agent to end; one that is still running after
	// a minute has not stopped its task.
	awaitExit := func(t *testing.T, cmd *exec.Cmd, exited <-chan error) {
		t.Helper()
		select {
		case <-exited:
		case <-time.After(time.Minute):
			t.Fatal("the agent still runs after a minute: its task's group was not stopped")
		}
	}
	pgidLine := regexp.MustCompile(`(?m)^PGID (\d+)$`)
	pgidOf := func(t *testing.T, out string) int {
		t.Helper()
		b, _ := os.ReadFile(out)
		m := pgidLine.FindSubmatch(b)
		if m == nil {
			t.Fatalf("no PGID line in the task's output:\n%s", b)
		}
		pgid, _ := strconv.Atoi(string(m[1]))
		return pgid
	}
	groupGone := func(t *testing.T, pgid int, report, reason string) {
		t.Helper()
		if running, err := proc.GroupRunning(pgid); err != nil || running {
			t.Errorf("the task's group %d: running %v (%v), want gone, its background process included", pgid, running, err)
		}
		b, _ := os.ReadFile(report)
		if !strings.Contains(string(b), `"`+reason+`"`) {
			t.Errorf("the report does not name %s:\n%s", reason, b)
		}
	}
	// The task: a leader and a process in the background, each of which
	// would outlive a stop that reached only one of them.
	const stubborn = `echo "PGID $$"; sleep 300 & sleep 300`

	t.Run("TaskHoldsNoCapabilityAndCannotBecomeReaperdsUserOrRoot", func(t *testing.T) {
		cmd, out, _, exited := start(t, []string{probeEnv + "=1", probeSetuidEnv + "=" + strconv.Itoa(reaperd.UID) + ",0"},
			"-command", "exec "+w.probe)
		awaitExit(t, cmd, exited)
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		r := parseProbe(t, string(data))
		t.Logf("the task (uid %d) under the agent (uid %d, CapEff %s): caps %v, setuid %v",
			r.UID, reaperd.UID, r.Caps["ParentCapEff"], r.Caps, r.Setuid)
		if r.UID != tasks.UID {
			t.Fatalf("the task ran as uid %d, want %s's %d", r.UID, tasks.Name, tasks.UID)
		}
		want := uint64(1<<unix.CAP_SETUID | 1<<unix.CAP_SETGID)
		if eff, err := strconv.ParseUint(r.Caps["ParentCapEff"], 16, 64); err != nil || eff != want {
			t.Errorf("the agent's CapEff %q, want exactly CAP_SETUID and CAP_SETGID (%x): else this proves nothing", r.Caps["ParentCapEff"], want)
		}
		for _, k := range []string{"CapEff", "CapPrm", "CapAmb", "CapInh"} {
			if v, err := strconv.ParseUint(r.Caps[k], 16, 64); err != nil || v != 0 {
				t.Errorf("the task's %s = %q, want 0", k, r.Caps[k])
			}
		}
		for uid, got := range r.Setuid {
			if got != "EPERM" {
				t.Errorf("the task becoming uid %s: %s, want EPERM", uid, got)
			}
		}
		if len(r.Setuid) != 2 {
			t.Errorf("setuid tried for %v, want reaperd's uid and root", r.Setuid)
		}
	})

	t.Run("ExecutionTimeoutKillsTheTasksWholeGroup", func(t *testing.T) {
		cmd, out, report, exited := start(t, nil, "-command", stubborn, "-execution-timeout", "2s", "-kill-wait", "10s")
		awaitExit(t, cmd, exited)
		groupGone(t, pgidOf(t, out), report, agent.ReasonExecutionTimeout)
	})

	t.Run("ShouldTerminateStopsTheTasksWholeGroup", func(t *testing.T) {
		terminate := filepath.Join(w.work, "terminate")
		cmd, out, report, exited := start(t, nil, "-command", stubborn, "-terminate-file", terminate,
			"-heartbeat", "200ms", "-terminate-grace", "10s", "-kill-wait", "10s")
		// The task has started once it has written its group.
		deadline := time.Now().Add(30 * time.Second)
		for {
			if b, _ := os.ReadFile(out); pgidLine.Match(b) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the task did not start within 30s")
			}
			select {
			case err := <-exited:
				t.Fatalf("the agent exited before its task started: %v", err)
			case <-time.After(20 * time.Millisecond):
			}
		}
		if err := os.WriteFile(terminate, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		awaitExit(t, cmd, exited)
		groupGone(t, pgidOf(t, out), report, agent.ReasonTerminated)
	})
}

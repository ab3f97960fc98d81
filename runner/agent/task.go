package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/dexaflow/reaper/internal/confine"
	"github.com/dexaflow/reaper/internal/runas"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/substrate/lite/proc"
)

// gateScript is what the task's leader runs first. It waits for the agent's
// go-ahead on fd 3 (sent once the group is recorded), closes fd 3, and then
// replaces itself with "$SHELL -c COMMAND": the same process, so the start
// time the agent recorded is the task's. If the agent goes away before the
// go-ahead, read sees end-of-file and COMMAND never runs.
const gateScript = `IFS= read -r _ <&3 || exit 125; exec 3<&-; exec "$0" -c "$1"`

// Signals the agent sends to the task's group.
const (
	sigTerm = unix.SIGTERM
	sigKill = unix.SIGKILL
)

// task is one started task: the leader of its own process group.
type task struct {
	proc *os.Process
	pgid int
	// start is the leader's start time, read when recording the group.
	start uint64
	// out is the read end of the pipe the task writes stdout and stderr to.
	out *os.File
	// gate is the write end of the go-ahead pipe; nil once used.
	gate *os.File
	// exited is closed when the leader has exited. On Linux the leader is
	// not reaped then: its zombie keeps the group id from being reused
	// until reap, so every signal the agent sends reaches only its group.
	exited chan struct{}
	// state is the leader's exit status, set by reap (or on exit where
	// waiting without reaping is not available).
	state *os.ProcessState
	// drained is closed when the output copy has ended.
	drained chan struct{}
	// runAs is the user the task runs as (Lite's run_as), nil when the
	// agent's own: see signalGroup.
	runAs *runas.User
}

func startTask(cfg Config) (t *task, err error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("starting the task: output pipe: %w", err)
	}
	gateR, gateW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("starting the task: gate pipe: %w", err)
	}
	a := cfg.Attempt
	cmd := exec.Command(cfg.Shell, "-c", gateScript, cfg.Shell, cfg.Command)
	cmd.Dir = cfg.Dir
	cmd.Env = append(taskEnviron(os.Environ()),
		"REAPER_RUN_ID="+a.RunID,
		"REAPER_TASK_ID="+a.TaskID,
		"REAPER_TRY="+strconv.Itoa(int(a.Try)),
		"REAPER_EPOCH="+strconv.Itoa(int(a.Epoch)),
	)
	cmd.Env = append(cmd.Env, cfg.Env...)
	cmd.Stdout = outW
	cmd.Stderr = outW
	cmd.ExtraFiles = []*os.File{gateR}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if cfg.RunAs != nil {
		// Later entries win: the task is told who it is, not who the
		// agent is.
		cmd.Env = append(cmd.Env, cfg.RunAs.Env()...)
		cmd.SysProcAttr.Credential = cfg.RunAs.Credential()
	}
	err = startWithoutCapabilities(cmd)
	outW.Close()
	gateR.Close()
	if err != nil {
		outR.Close()
		gateW.Close()
		return nil, fmt.Errorf("starting the task with %s: %w", cfg.Shell, err)
	}
	t = &task{
		proc:    cmd.Process,
		pgid:    cmd.Process.Pid,
		out:     outR,
		gate:    gateW,
		exited:  make(chan struct{}),
		drained: make(chan struct{}),
		runAs:   cfg.RunAs,
	}
	go func() {
		defer close(t.exited)
		t.state = waitExit(t.proc)
	}()
	go func() {
		defer close(t.drained)
		_, _ = io.Copy(cfg.Output, outR)
	}()
	return t, nil
}

// startWithoutCapabilities starts cmd from an OS thread whose ambient and
// inheritable capability sets are emptied for the start: the task, unless
// it runs as root, starts with no capability at all, whatever the agent
// holds (CAP_SETUID and CAP_SETGID, inherited from reaperd, to start it as
// run_as; Go's SysProcAttr can raise ambient capabilities but not clear
// them). The sets are restored before the thread runs anything else; if
// they cannot be, the thread stays locked and ends with the goroutine.
func startWithoutCapabilities(cmd *exec.Cmd) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		restore, err := confine.ClearInheritable()
		if err != nil {
			done <- fmt.Errorf("clearing the capabilities the task would inherit: %w", err)
			return
		}
		err = cmd.Start()
		if restore() == nil {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}

// signalGroup sends sig to the task's group. A task of Lite's run_as runs
// as another user, whom the agent (not root, without CAP_KILL) may not
// signal: refused so (EPERM), the signal is sent again from a thread of the
// agent's whose effective user is the task's (confine.AsUser; the agent
// holds CAP_SETUID to start the task), as a process may signal its own
// user's. A signal that still fails is an error for the caller to log.
func (t *task) signalGroup(pgid int, sig unix.Signal) (bool, error) {
	sent, err := proc.SignalGroup(pgid, sig)
	if t.runAs == nil || !errors.Is(err, unix.EPERM) {
		return sent, err
	}
	var asSent bool
	aerr := confine.AsUser(t.runAs.UID, func() (e error) {
		asSent, e = proc.SignalGroup(pgid, sig)
		return e
	})
	if aerr != nil {
		return false, fmt.Errorf("%w; as the task's user %s (uid %d): %w", err, t.runAs.Name, t.runAs.UID, aerr)
	}
	return asSent, nil
}

// readStart reads the leader's start time and checks that it leads its group.
func (t *task) readStart() error {
	info, err := proc.Stat(t.pgid)
	if err != nil {
		return fmt.Errorf("reading the task leader's start time: %w", err)
	}
	if info.PGID != t.pgid {
		return fmt.Errorf("the task leader %d is in group %d, not its own", t.pgid, info.PGID)
	}
	if info.Zombie {
		return fmt.Errorf("the task leader %d exited before its group was recorded", t.pgid)
	}
	t.start = info.Start
	return nil
}

// release lets the task run its command.
func (t *task) release(log hclog.Logger) {
	if _, err := t.gate.WriteString("go\n"); err != nil {
		log.Warn("could not release the task: its leader is gone", "error", err)
	}
	t.gate.Close()
	t.gate = nil
}

// abort closes the gate (the command never runs) and kills the group.
func (t *task) abort(clk clock.Clock, killWait time.Duration, log hclog.Logger) {
	if t.gate != nil {
		t.gate.Close()
		t.gate = nil
	}
	if err := proc.KillGroupWith(context.Background(), clk, t.pgid, killWait, t.signalGroup); err != nil {
		log.Error("could not kill the unrecorded task group", "pgid", t.pgid, "error", err)
	}
	<-t.exited
}

func (t *task) signal(sig unix.Signal, log hclog.Logger) {
	if _, err := t.signalGroup(t.pgid, sig); err != nil {
		log.Error("could not signal the task's group", "pgid", t.pgid, "signal", unix.SignalName(sig), "error", err)
	}
}

// cutOutput stops the output copy now, whoever still holds the pipe.
func (t *task) cutOutput() {
	_ = t.out.SetReadDeadline(time.Now())
	<-t.drained
}

// reap collects the leader's exit status (once) and closes the output pipe.
func (t *task) reap() {
	<-t.exited
	if t.state == nil {
		st, err := t.proc.Wait()
		if err == nil {
			t.state = st
		}
	}
	t.out.Close()
}

// exitCode is the leader's exit code, or -1 when a signal ended it.
func exitCode(st *os.ProcessState) int {
	if st == nil {
		return -1
	}
	return st.ExitCode()
}

func signalName(st *os.ProcessState) string {
	if st == nil {
		return "an unknown cause"
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return "signal " + unix.SignalName(ws.Signal())
	}
	return st.String()
}

func bootID() (string, error) { return proc.BootID() }

func groupRunning(pgid int) (bool, error) { return proc.GroupRunning(pgid) }

// stop stops the task's group: SIGTERM, grace, SIGKILL, killWait.
func (t *task) stop(ctx context.Context, clk clock.Clock, grace, killWait time.Duration) (proc.StopReport, error) {
	return proc.StopGroupWith(ctx, clk, t.pgid, grace, killWait, t.signalGroup)
}

// privateEnv names the agent's own settings that a task must not inherit:
// the attempt's credential and how to reach the attempt API (the task could
// report for its attempt with them), a warm worker's credential (with it a
// task could claim the attempts bound to its worker, other runs' too), a
// board connection string should one reach the agent, and the agent's
// journal.
var privateEnv = []string{
	attempttoken.EnvToken + "=", attempttoken.EnvAPI + "=", attempttoken.EnvCA + "=",
	attempttoken.EnvWorkerToken + "=", "REAPER_DSN=", JournalDirEnv + "=",
}

// taskEnviron is the agent's environment less what is private to it.
func taskEnviron(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		private := false
		for _, p := range privateEnv {
			if strings.HasPrefix(kv, p) {
				private = true
				break
			}
		}
		if !private {
			out = append(out, kv)
		}
	}
	return out
}

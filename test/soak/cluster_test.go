package soak

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dexaflow/reaper/testkit/pgtest"
)

// The ladder of the soak: the specification's order, shortened so that ten
// minutes see hundreds of cycles, tens of leadership changes and every
// threshold crossed many times.
const (
	interval     = 2 * time.Second
	lease        = 3 * time.Second
	heartbeat    = time.Second
	agentLost    = 5 * time.Second
	grace        = 8 * time.Second
	dispatchLost = 10 * time.Second
	orphanRun    = 20 * time.Second
	stopGrace    = 2 * time.Second
	killWait     = 2 * time.Second
	runnerTick   = time.Second
	replicas     = 3
)

// Environment variables the soak hands to reaperd, and through it to
// every plugin, agent and task.
const (
	markEnv = "REAPER_SOAK_MARK" // marks every process of this soak
	escEnv  = "SOAK_ESC"         // where an escaping task writes its escaped child's pid
)

// database is the soak's PostgreSQL: one server, restarted by the injector.
type database struct {
	mu  sync.Mutex // Pause and Resume are not safe together
	srv *pgtest.Server
	dsn string
}

func startDatabase(ctx context.Context, base string) (*database, error) {
	srv, err := pgtest.Start(ctx, pgtest.Options{BaseDir: base})
	if err != nil {
		return nil, err
	}
	if err := srv.CreateDatabase(ctx, "reaper", ""); err != nil {
		srv.Stop()
		return nil, err
	}
	return &database{srv: srv, dsn: srv.DSN("reaper")}, nil
}

// restart stops the server (fast shutdown: connections cut), keeps it down
// for down, and starts it again on the same port.
func (db *database) restart(ctx context.Context, down time.Duration) error {
	db.mu.Lock()
	defer db.mu.Unlock()
	if err := db.srv.Pause(); err != nil {
		return err
	}
	select {
	case <-time.After(down):
	case <-ctx.Done():
	}
	return db.srv.Resume(context.WithoutCancel(ctx))
}

func (db *database) stop() error {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.srv.Stop()
}

// configHCL is every replica's configuration on the Lite edition.
// Every replica shares one attempt API address (apiListen) and state
// directory, so an agent reaches whichever replica is up.
func configHCL(bin, dsn, recordDir, logDir, apiListen, apiState string) string {
	leader := fmt.Sprintf("leader \"postgres\" {\n  lease = %q\n}\n", lease)
	return baseHCL(editionLite, bin, dsn, leader, "", apiListen, apiState, "") + fmt.Sprintf(`
substrate "lite" {
  record_dir = %q
  stop_grace = %q
  kill_wait  = %q
}

runner {
  log_dir  = %q
  interval = %q
}

reaper "dispatchlost" {}
reaper "agentlost" {}
reaper "orphanrun" {}
`, recordDir, stopGrace, killWait, logDir, runnerTick)
}

// baseHCL is what both editions' configurations share: the store, the
// leader block given, the cycle, the ladder (with the edition's extra
// lines), telemetry and the attempt API (with apiExtra's lines: the real
// node's certificate).
func baseHCL(edition, bin, dsn, leader, ladderExtra, apiListen, apiState, apiExtra string) string {
	return fmt.Sprintf(`edition    = %q
plugin_dir = %q

store {
  dsn = %q
}

%s
maintenance {
  interval = %q
}

ladder {
  heartbeat      = %q
  agent_lost     = %q
  settling_grace = %q
  dispatch_lost  = %q
  orphan_run     = %q
%s}

telemetry {
  listen = "127.0.0.1:0"
}

attempt_api {
  listen    = %q
  state_dir = %q
%s}
`, edition, bin, dsn, leader, interval, heartbeat, agentLost, grace, dispatchLost, orphanRun, ladderExtra,
		apiListen, apiState, apiExtra)
}

// daemon is one reaperd replica slot: the process running in it now, and
// how to start the next.
type daemon struct {
	slot   int
	bin    string
	config string
	env    []string
	logDir string

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	paused bool
	starts int
}

func (d *daemon) start() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.starts++
	logf, err := os.OpenFile(filepath.Join(d.logDir, fmt.Sprintf("reaperd-%d.log", d.slot)),
		os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("reaperd #%d: open its log: %w", d.slot, err)
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(d.bin, "reaperd"), "run", "-config", d.config)
	cmd.Env = d.env
	cmd.Stdout, cmd.Stderr = logf, logf
	// A soak killed outright takes its replicas with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("reaperd #%d: start: %w", d.slot, err)
	}
	done := make(chan struct{})
	go func() { // owned by the daemon: ends when the process does
		_ = cmd.Wait()
		close(done)
	}()
	d.cmd, d.done, d.paused = cmd, done, false
	return nil
}

// pid is the running process's id, 0 when none runs.
func (d *daemon) pid() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil || d.exited() {
		return 0
	}
	return d.cmd.Process.Pid
}

func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// usable: running and not paused.
func (d *daemon) usable() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cmd != nil && !d.exited() && !d.paused
}

func (d *daemon) signal(sig syscall.Signal) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil || d.exited() {
		return fmt.Errorf("reaperd #%d is not running", d.slot)
	}
	switch sig {
	case syscall.SIGSTOP:
		d.paused = true
	case syscall.SIGCONT:
		d.paused = false
	}
	return d.cmd.Process.Signal(sig)
}

// kill sends SIGKILL and waits for the process.
func (d *daemon) kill() {
	if err := d.signal(syscall.SIGKILL); err != nil {
		return
	}
	<-d.done
}

// stop resumes the process if paused, sends SIGTERM and waits up to bound
// for a clean exit, then kills it. It reports whether it exited cleanly.
func (d *daemon) stop(bound time.Duration) bool {
	if d.pid() == 0 {
		return true
	}
	_ = d.signal(syscall.SIGCONT)
	_ = d.signal(syscall.SIGTERM)
	select {
	case <-d.done:
		return true
	case <-time.After(bound):
		d.kill()
		return false
	}
}

// holderPID is the pid in a lease holder's name: host/pid/random (reaperd's
// default), or host/pid.
func holderPID(holder string) int {
	parts := strings.Split(holder, "/")
	if len(parts) < 2 {
		return 0
	}
	if len(parts) >= 3 {
		parts = parts[:len(parts)-1]
	}
	pid, _ := strconv.Atoi(parts[len(parts)-1])
	return pid
}

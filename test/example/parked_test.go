package example_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/cmd/reaperctl/ctl"
	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/runner/literunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/lite/records"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// hostConfig runs the Lite edition with its runner and the example reaper.
// The ladder is short so that real processes go through several cycles in
// seconds; the rows' own times are placed hours back, so the plugin's TTL
// (1h here) is passed without waiting for it.
const hostConfig = `edition    = "lite"
plugin_dir = %q

store {
  dsn = %q
}

leader "postgres" {
  lease = "1s"
}

maintenance {
  interval = "300ms"
}

ladder {
  heartbeat      = "100ms"
  agent_lost     = "500ms"
  settling_grace = "1s"
}

telemetry {
  listen = "127.0.0.1:0"
}

attempt_api {
  listen    = %q
  state_dir = %q
}

substrate "lite" {
  record_dir = %q
}

runner {
  log_dir = %q
}

reaper "parked" {
  ttl    = %q
  policy = "replace"
}
`

// The example's decision labels. This module does not import the example's
// (a module of its own, built here as a binary), so they are spelled out.
const (
	labelExpired = "parked_expired"
	labelAlive   = "parked_process_alive"
)

// unreachableAPI is an attempt API address nobody listens on: an agent
// given it keeps retrying its first report and stays alive without running
// its task.
const unreachableAPI = "https://127.0.0.1:1"

// world is one test's deployment: a fresh board, a record directory shared
// by the test's own agents and reaperd's Lite substrate and runner, and the
// configuration file reaperd runs from.
type world struct {
	t       *testing.T
	ctx     context.Context
	dsn     string
	store   *board.Store
	w       *lifecycle.Writer
	pool    *pgxpool.Pool
	spawner *literunner.Spawner
	config  string
}

func newWorld(t *testing.T, ttl string) *world {
	t.Helper()
	w := &world{t: t, ctx: context.Background(), dsn: pgtest.NewDSN(t)}
	pool, err := pgxpool.New(w.ctx, w.dsn)
	if err != nil {
		t.Fatalf("connect to the board: %v", err)
	}
	t.Cleanup(pool.Close)
	w.pool, w.store, w.w = pool, board.New(pool, board.Options{}), lifecycle.New(pool, lifecycle.Options{})

	recordDir := filepath.Join(t.TempDir(), "records")
	dir, err := records.Open(recordDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dir.Close() })
	logDir := t.TempDir()
	if w.spawner, err = literunner.NewSpawner(literunner.SpawnerConfig{
		AgentPath: filepath.Join(binDir, literunner.AgentBinary), Records: dir, LogDir: logDir,
	}); err != nil {
		t.Fatal(err)
	}
	w.config = filepath.Join(t.TempDir(), "reaper.hcl")
	src := fmt.Sprintf(hostConfig, binDir, w.dsn, attemptapitest.FreeAddr(t),
		filepath.Join(t.TempDir(), "attempt-api"), recordDir, logDir, ttl)
	if err := os.WriteFile(w.config, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return w
}

// parkedAttempt creates a run of one Lite task that runs command, starts its
// first attempt with a real agent (which never gets through to the board),
// and parks the attempt as deferred since parkedAt. Nothing on Lite ever
// brings a deferred attempt back: without the reaper it stays parked, and
// its run open, for good.
func (w *world) parkedAttempt(runID, command string, parkedAt time.Time) (sdk.Attempt, *literunner.Agent) {
	w.t.Helper()
	start := parkedAt.Add(-time.Minute)
	if err := w.w.CreateRun(w.ctx, lifecycle.NewRun{RunID: runID, DagID: "dag_" + runID, Tasks: []lifecycle.NewTask{
		{TaskID: "sensor", Executor: sdk.ExecutorLite, Command: command},
	}}, start); err != nil {
		w.t.Fatal(err)
	}
	a := sdk.Attempt{RunID: runID, TaskID: "sensor", Try: 1}
	if ok, err := w.w.Enqueue(w.ctx, a, start); err != nil || !ok {
		w.t.Fatalf("enqueue %s: ok=%v err=%v", a, ok, err)
	}
	if ok, err := w.w.Queue(w.ctx, a, start); err != nil || !ok {
		w.t.Fatalf("queue %s: ok=%v err=%v", a, ok, err)
	}
	if stop, err := w.w.Running(w.ctx, a, start); err != nil || stop {
		w.t.Fatalf("running %s: stop=%v err=%v", a, stop, err)
	}
	ag, err := w.spawner.Spawn(w.ctx, literunner.SpawnRequest{
		Invocation: agent.Invocation{Attempt: a, Command: "sleep 1000", Reporter: agent.ReporterAPI, Heartbeat: time.Hour},
		Env:        []string{attempttoken.EnvAPI + "=" + unreachableAPI, attempttoken.EnvToken + "=unused"},
	})
	if err != nil {
		w.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { // the test is the agent's parent: reap it when it exits
		defer close(exited)
		_, _ = ag.Wait()
	}()
	w.t.Cleanup(func() {
		_ = syscall.Kill(ag.PID, syscall.SIGKILL)
		<-exited
	})
	// No writer parks an attempt as deferred on this board: place it.
	tag, err := w.pool.Exec(w.ctx, `UPDATE task_instances SET state = 'deferred', ended_at = $3, updated_at = $3
        WHERE run_id = $1 AND task_id = $2`, a.RunID, a.TaskID, parkedAt)
	if err != nil || tag.RowsAffected() != 1 {
		w.t.Fatalf("park %s: %v", a, err)
	}
	return a, ag
}

// killAgent kills an agent with SIGKILL and waits until it is gone.
func (w *world) killAgent(ag *literunner.Agent) {
	w.t.Helper()
	if err := syscall.Kill(ag.PID, syscall.SIGKILL); err != nil {
		w.t.Fatal(err)
	}
	eventually(w.t, 15*time.Second, fmt.Sprintf("agent %d to exit", ag.PID), func() bool {
		return syscall.Kill(ag.PID, 0) != nil
	})
}

func (w *world) ti(runID, taskID string) board.TaskInstance {
	w.t.Helper()
	ti, err := w.store.TaskInstance(w.ctx, runID, taskID)
	if err != nil {
		w.t.Fatal(err)
	}
	return ti
}

// decisions returns the audited decisions of the parked reaper about the
// attempt, by label.
func (w *world) decisions(a sdk.Attempt) map[string][]board.AuditRecord {
	w.t.Helper()
	recs, err := w.store.DecisionsFor(w.ctx, a.RunID, a.TaskID, 0)
	if err != nil {
		w.t.Fatal(err)
	}
	out := map[string][]board.AuditRecord{}
	for _, r := range recs {
		if r.Reaper == "parked" && r.Attempt == a {
			out[r.Label] = append(out[r.Label], r)
		}
	}
	return out
}

// TestParkedUnderReaperd: reaperd runs reaper-parked, built from its own
// module, out of process. An attempt parked past the TTL whose agent was
// killed is failed as parked_expired, re-placed by the runner on the infra
// rail, runs, and its run finishes; an attempt parked as long whose agent
// is alive is deferred pass after pass and never written.
func TestParkedUnderReaperd(t *testing.T) {
	w := newWorld(t, "1h")
	parkedAt := time.Now().Add(-2 * time.Hour)
	lost, lostAgent := w.parkedAttempt("lost", "true", parkedAt)
	waiting, _ := w.parkedAttempt("waiting", "true", parkedAt)
	w.killAgent(lostAgent)
	before := w.ti(waiting.RunID, waiting.TaskID)

	if code, out := reaperd(t, "validate", "-config", w.config); code != 0 {
		t.Fatalf("reaperd validate: exit %d:\n%s", code, out)
	}
	d := startDaemon(t, w.config)
	started := time.Now()

	eventually(t, 60*time.Second, "the lost attempt's run to finish", func() bool {
		r, err := w.store.Run(w.ctx, lost.RunID)
		return err == nil && r.State != sdk.RunRunning
	})
	t.Logf("the lost attempt's run finished %s after reaperd started", time.Since(started).Round(time.Millisecond))
	eventually(t, 30*time.Second, "two passes deferring the live attempt", func() bool {
		return len(w.decisions(waiting)[labelAlive]) >= 2
	})
	d.stop(t)

	t.Run("StaleAndDead_MarkedReplacedAndTheRunSettles", func(t *testing.T) {
		if r, _ := w.store.Run(w.ctx, lost.RunID); r.State != sdk.RunSuccess {
			t.Fatalf("run %s is %s, want success", lost.RunID, r.State)
		}
		ti := w.ti(lost.RunID, lost.TaskID)
		if ti.State != sdk.StateSuccess || ti.Try != 1 || ti.Epoch != 1 || ti.InfraUsed != 1 {
			t.Fatalf("the re-placed attempt: %+v", ti)
		}
		got := w.decisions(lost)[labelExpired]
		if len(got) != 1 || !got[0].Applied || got[0].Evidence["liveness"] != "dead" || got[0].Evidence["parked_for"] == "" {
			t.Fatalf("parked_expired decisions about %s: %+v", lost, got)
		}
	})
	t.Run("StaleAndAlive_LeftAlone", func(t *testing.T) {
		after := w.ti(waiting.RunID, waiting.TaskID)
		if after.State != sdk.StateDeferred || after.Attempt != before.Attempt || !after.UpdatedAt.Equal(before.UpdatedAt) {
			t.Fatalf("the live parked attempt was written:\n before %+v\n after  %+v", before, after)
		}
		if r, _ := w.store.Run(w.ctx, waiting.RunID); r.State != sdk.RunRunning {
			t.Fatalf("run %s is %s", waiting.RunID, r.State)
		}
		ds := w.decisions(waiting)
		if n := len(ds[labelExpired]); n != 0 {
			t.Fatalf("%d parked_expired decisions about a live attempt", n)
		}
		for _, r := range ds[labelAlive] {
			if r.Applied || r.Evidence["liveness"] != "alive" {
				t.Fatalf("decision %+v", r)
			}
		}
	})
	t.Run("ExplainTellsTheStory", func(t *testing.T) {
		var out bytes.Buffer
		code := ctl.CLI{Getenv: func(string) string { return "" }}.Run(w.ctx,
			[]string{"explain", "-config", w.config, lost.RunID, lost.TaskID}, &out, &out)
		if code != 0 || !strings.Contains(out.String(), "parked_expired") {
			t.Fatalf("reaperctl explain: exit %d:\n%s", code, out.String())
		}
		t.Logf("reaperctl explain %s %s:\n%s", lost.RunID, lost.TaskID, out.String())
	})
}

// TestValidateReportsThePluginsRefusal: a value the plugin refuses fails
// `reaperd validate` with the file and the plugin's own words.
func TestValidateReportsThePluginsRefusal(t *testing.T) {
	w := newWorld(t, "0s")
	code, out := reaperd(t, "validate", "-config", w.config)
	if code == 0 || !strings.Contains(out, "reaper.hcl:") || !strings.Contains(out, `attribute "ttl": must be positive`) {
		t.Fatalf("reaperd validate: exit %d:\n%s", code, out)
	}
	t.Logf("reaperd validate:\n%s", out)
}

// reaperd runs one reaperd command to its end and returns its exit code and
// output.
func reaperd(t *testing.T, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "reaperd"), args...)
	cmd.Env = append(os.Environ(), "REAPER_DSN=")
	out, err := cmd.CombinedOutput()
	if cmd.ProcessState == nil {
		t.Fatalf("reaperd %s: %v", args[0], err)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

// daemon is a running `reaperd run`.
type daemon struct {
	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	logs []string
}

func startDaemon(t *testing.T, config string) *daemon {
	t.Helper()
	d := &daemon{cmd: exec.Command(filepath.Join(binDir, "reaperd"), "run", "-config", config), done: make(chan struct{})}
	d.cmd.Env = append(os.Environ(), "REAPER_DSN=")
	stderr, err := d.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			d.mu.Lock()
			d.logs = append(d.logs, sc.Text())
			d.mu.Unlock()
		}
		_ = d.cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(func() {
		_ = d.cmd.Process.Signal(syscall.SIGKILL)
		<-d.done
		if t.Failed() {
			d.mu.Lock()
			t.Logf("reaperd log:\n%s", strings.Join(d.logs, "\n"))
			d.mu.Unlock()
		}
	})
	return d
}

// stop asks reaperd to stop (SIGTERM) and waits, bounded, for it to exit.
func (d *daemon) stop(t *testing.T) {
	t.Helper()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		t.Fatal("reaperd did not stop within 30s of SIGTERM")
	}
}

// eventually polls cond every 50ms until it holds, failing t once bound
// passes. Bounds are far beyond the expected times; polling ends as soon as
// the real processes get there.
func eventually(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", bound, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
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
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/eventually"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// binDir holds reaperd and the test plugins, built once for the package.
var binDir string

// cluster is the API server of the kubernetes-leader tests, started by the
// first of them and stopped after the last.
var cluster kubeOnce

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "reaperd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := buildBinaries(dir)
	if code == 0 {
		code = pgtest.Run(m)
	}
	cluster.stop()
	os.RemoveAll(dir)
	os.Exit(code)
}

// realDir is the subdirectory of binDir holding real plugins (the Lite
// substrate, a reaper, and the two kube-only reapers Lite refuses), for
// what the test plugins cannot show.
const realDir = "real"

// kubeDir is the subdirectory of binDir holding the kube edition's real
// plugins: its substrate and the five reapers.
const kubeDir = "kube"

func buildBinaries(dir string) int {
	for out, pkg := range map[string]string{
		"reaperd":               ".",
		"reaper-echo":           "../../host/loader/testdata/testreaper",
		"reaper-substrate-lite": "../../host/loader/testdata/testsubstrate",
		filepath.Join(realDir, "reaper-substrate-lite"): "../../substrate/lite/cmd/reaper-substrate-lite",
		filepath.Join(realDir, "reaper-agentlost"):      "../../plugins/agentlost/cmd/reaper-agentlost",
		filepath.Join(realDir, "reaper-podlost"):        "../../plugins/podlost/cmd/reaper-podlost",
		filepath.Join(realDir, "reaper-warmworker"):     "../../plugins/warmworker/cmd/reaper-warmworker",
		filepath.Join(kubeDir, "reaper-substrate-kube"): "../../substrate/kube/cmd/reaper-substrate-kube",
		filepath.Join(kubeDir, "reaper-podlost"):        "../../plugins/podlost/cmd/reaper-podlost",
		filepath.Join(kubeDir, "reaper-dispatchlost"):   "../../plugins/dispatchlost/cmd/reaper-dispatchlost",
		filepath.Join(kubeDir, "reaper-agentlost"):      "../../plugins/agentlost/cmd/reaper-agentlost",
		filepath.Join(kubeDir, "reaper-warmworker"):     "../../plugins/warmworker/cmd/reaper-warmworker",
		filepath.Join(kubeDir, "reaper-orphanrun"):      "../../plugins/orphanrun/cmd/reaper-orphanrun",
	} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, out), pkg)
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n", out, err)
			return 1
		}
	}
	for _, name := range []string{"reaper-first", "reaper-crashy", "reaper-last"} {
		if err := os.Link(filepath.Join(dir, "reaper-echo"), filepath.Join(dir, name)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return 0
}

// A ladder short enough for real processes to go through a few cycles in
// seconds: interval 300ms, grace 1s, lease 1s.
const fastLadder = `
maintenance {
  interval = "300ms"
}
leader "postgres" {
  lease = "1s"
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
  listen = "127.0.0.1:0"
}
`

func writeConfig(t *testing.T, dsn, reapers string) string {
	t.Helper()
	return writeConfigLadder(t, dsn, fastLadder, reapers)
}

// writeConfigLadder is writeConfig with a ladder of the test's own.
func writeConfigLadder(t *testing.T, dsn, ladder, reapers string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "reaper.hcl")
	src := fmt.Sprintf("edition = %q\nplugin_dir = %q\nstore {\n  dsn = %q\n}\n%s\nsubstrate \"lite\" {}\n%s",
		"lite", binDir, dsn, ladder, reapers)
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// reaperdProc is a reaperd process.
type reaperdProc struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	logs []string
	done chan struct{}
}

func startDaemon(t *testing.T, config string, env ...string) *reaperdProc {
	t.Helper()
	return startDaemonCmd(t, exec.Command(filepath.Join(binDir, "reaperd"), "run", "-config", config), env...)
}

// startDaemonCmd starts cmd (a reaperd run) with env added to this
// process's environment, REAPER_DSN and REAPER_DSN_FILE cleared, and
// collects its log; it is killed when the test ends.
func startDaemonCmd(t *testing.T, cmd *exec.Cmd, env ...string) *reaperdProc {
	t.Helper()
	d := &reaperdProc{cmd: cmd, done: make(chan struct{})}
	d.cmd.Env = append(append(os.Environ(), "REAPER_DSN=", "REAPER_DSN_FILE="), env...)
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
		d.cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(func() {
		if t.Failed() && os.Getenv("REAPERD_TEST_DUMP") != "" {
			d.cmd.Process.Signal(syscall.SIGQUIT) // Go prints every goroutine's stack
			select {
			case <-d.done:
			case <-time.After(5 * time.Second):
			}
		}
		d.cmd.Process.Signal(syscall.SIGKILL)
		<-d.done
		if t.Failed() {
			d.mu.Lock()
			t.Logf("reaperd %d log:\n%s", d.cmd.Process.Pid, strings.Join(d.logs, "\n"))
			d.mu.Unlock()
		}
	})
	return d
}

// holds reports whether holder is this process's leader identity
// (host/pid/random: its prefix names the process).
func (d *reaperdProc) holds(holder string) bool {
	host, _ := os.Hostname()
	return strings.HasPrefix(holder, fmt.Sprintf("%s/%d/", host, d.cmd.Process.Pid))
}

func migratedStore(t *testing.T) (*board.Store, *lifecycle.Writer, string) {
	t.Helper()
	dsn := pgtest.NewDSN(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return board.New(pool, board.Options{}), lifecycle.New(pool, lifecycle.Options{}), dsn
}

// runningSilentAttempt puts a running Lite attempt whose last heartbeat is
// long past on the board.
func runningSilentAttempt(t *testing.T, w *lifecycle.Writer, runID string) sdk.Attempt {
	t.Helper()
	ctx := context.Background()
	old := time.Now().Add(-time.Hour)
	if err := w.CreateRun(ctx, lifecycle.NewRun{RunID: runID, DagID: "dag", Tasks: []lifecycle.NewTask{
		{TaskID: "t", Executor: sdk.ExecutorLite},
	}}, old); err != nil {
		t.Fatal(err)
	}
	a := sdk.Attempt{RunID: runID, TaskID: "t", Try: 1, Epoch: 0}
	steps := []func() error{
		func() error { _, err := w.Enqueue(ctx, a, old); return err },
		func() error { _, err := w.Queue(ctx, a, old); return err },
		func() error { _, err := w.Running(ctx, a, old); return err },
		func() error { _, err := w.Heartbeat(ctx, a, old); return err },
	}
	for _, s := range steps {
		if err := s(); err != nil {
			t.Fatal(err)
		}
	}
	return a
}

func decisions(t *testing.T, s *board.Store, a sdk.Attempt) []board.AuditRecord {
	t.Helper()
	recs, err := s.DecisionsFor(context.Background(), a.RunID, a.TaskID, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// allDecisions reads the whole audit, gate decisions included.
func allDecisions(t *testing.T, s *board.Store) []board.AuditRecord {
	t.Helper()
	rows, err := s.Pool().Query(context.Background(), `SELECT at, term, reaper, label FROM reap_decisions ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []board.AuditRecord
	for rows.Next() {
		var r board.AuditRecord
		if err := rows.Scan(&r.At, &r.Term, &r.Reaper, &r.Label); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestTwoReplicasOnOneBoard(t *testing.T) {
	store, w, dsn := migratedStore(t)
	a := runningSilentAttempt(t, w, "alive-run") // the test substrate says alive: decided every pass, never marked
	cfg := writeConfig(t, dsn, "reaper \"echo\" {}\n")

	first := startDaemon(t, cfg)
	ctx := context.Background()
	var lease board.Lease
	eventually.True(t, 20*time.Second, "the first replica to lead", func() bool {
		l, ok, err := store.CurrentLeader(ctx)
		lease = l
		return err == nil && ok && first.holds(l.Holder)
	})
	second := startDaemon(t, cfg)
	firstTerm := lease.Term

	// Both run a few cycles: the second never takes the lease.
	eventually.True(t, 20*time.Second, "the leader's reaper to run", func() bool {
		for _, r := range decisions(t, store, a) {
			if r.Reaper == "echo" && r.Term == firstTerm {
				return true
			}
		}
		return false
	})
	if l, _, _ := store.CurrentLeader(ctx); l.Term != firstTerm || !first.holds(l.Holder) {
		t.Fatalf("leadership moved while the leader lived: %+v", l)
	}

	// kill -9 the leader: no resignation; the second takes over once the
	// lease has run out, under a new term.
	orphans := childPIDs(t, first.cmd.Process.Pid)
	first.cmd.Process.Signal(syscall.SIGKILL)
	<-first.done
	killedAt := time.Now()
	eventually.True(t, 10*time.Second, "the killed host's plugins to die with it", func() bool {
		for _, pid := range orphans {
			if syscall.Kill(pid, 0) == nil {
				return false
			}
		}
		return true
	})
	eventually.True(t, 20*time.Second, "the second replica to take over", func() bool {
		l, ok, err := store.CurrentLeader(ctx)
		lease = l
		return err == nil && ok && second.holds(l.Holder)
	})
	if lease.Term != firstTerm+1 {
		t.Fatalf("new term %d, want %d", lease.Term, firstTerm+1)
	}
	if took := time.Since(killedAt); took > 10*time.Second {
		t.Fatalf("takeover took %v", took)
	}

	gateResetAndOldTermFenced(t, store, a, firstTerm, lease, time.Second)
}

// gateResetAndOldTermFenced checks what follows a takeover under lease:
// the new leader waits its own grace (from its acquisition) before its
// first reap, recording a settling skip each cycle meanwhile; and a write
// carrying the deposed leader's oldTerm is a no-op.
func gateResetAndOldTermFenced(t *testing.T, store *board.Store, a sdk.Attempt, oldTerm int64, lease board.Lease, grace time.Duration) {
	t.Helper()
	ctx := context.Background()
	eventually.True(t, 20*time.Second, "the new leader's first reap", func() bool {
		for _, r := range decisions(t, store, a) {
			if r.Reaper == "echo" && r.Term == lease.Term {
				return true
			}
		}
		return false
	})
	recs := allDecisions(t, store)
	var skips int
	var firstReap time.Time
	for _, r := range recs {
		if r.Term != lease.Term {
			continue
		}
		if r.Label == sdk.LabelSettlingSkip {
			skips++
		}
		if r.Reaper == "echo" && (firstReap.IsZero() || r.At.Before(firstReap)) {
			firstReap = r.At
		}
	}
	if skips == 0 {
		t.Fatal("the new leader recorded no settling skip")
	}
	if firstReap.Sub(lease.AcquiredAt) < grace {
		t.Fatalf("first reap %v after leadership, inside the %s grace", firstReap.Sub(lease.AcquiredAt), grace)
	}

	// A write carrying the old term is a no-op.
	res, err := store.Mark(ctx, []sdk.Mark{{Attempt: a, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
		Reason: sdk.LabelAgentLost, Term: oldTerm, At: time.Now()}})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Applied || res[0].NoopReason != sdk.NoopDeposed {
		t.Fatalf("old-term mark = %+v, want a deposed no-op", res[0])
	}
}

func TestCrashedPluginIsRestartedAndOthersRunTheSameCycle(t *testing.T) {
	store, w, dsn := migratedStore(t)
	a := runningSilentAttempt(t, w, "alive-run")
	marker := filepath.Join(t.TempDir(), "crashed")
	// A cycle long enough that each reaper's share of the reap budget
	// (a third of it) outlasts a pass on a busy machine: the test is about
	// the order within one cycle, not about budgets.
	const interval = 1500 * time.Millisecond
	ladder := strings.Replace(strings.Replace(fastLadder, `"300ms"`, `"1500ms"`, 1), `settling_grace = "1s"`, `settling_grace = "4s"`, 1)
	cfg := writeConfigLadder(t, dsn, ladder, fmt.Sprintf(`
reaper "first" {}
reaper "crashy" {
  mode         = "crash_once"
  crash_marker = %q
}
reaper "last" {}
`, marker))
	startDaemon(t, cfg)

	var crashAt time.Time
	eventually.True(t, 30*time.Second, "the crashy reaper to be restarted and run", func() bool {
		recs := allDecisions(t, store)
		ranAgain := false
		for _, r := range recs {
			if r.Reaper == "crashy" && r.Label == sdk.LabelPluginUnavailable {
				crashAt = r.At
			}
		}
		if crashAt.IsZero() {
			return false
		}
		for _, r := range decisions(t, store, a) {
			if r.Reaper == "crashy" && r.At.After(crashAt) {
				ranAgain = true
			}
		}
		return ranAgain
	})
	// In the cycle of the crash, "last" still ran (after the crash, before
	// the next cycle's "first").
	var lastRan bool
	for _, r := range decisions(t, store, a) {
		if r.Reaper == "last" && !r.At.Before(crashAt) && r.At.Before(crashAt.Add(interval)) {
			lastRan = true
		}
	}
	if !lastRan {
		t.Fatal("the reaper after the crashed one did not run in the same cycle")
	}
}

// childPIDs lists the direct children of pid (the plugin processes).
func childPIDs(t *testing.T, pid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range entries {
		var child int
		if _, err := fmt.Sscan(e.Name(), &child); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// The fields after the command (which may hold spaces) start with
		// the state and then the parent pid.
		rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
		var state string
		var ppid int
		if _, err := fmt.Sscan(rest, &state, &ppid); err == nil && ppid == pid {
			out = append(out, child)
		}
	}
	return out
}

// stopCleanly sends SIGTERM and waits for an exit with code 0.
func (d *reaperdProc) stopCleanly(t *testing.T) {
	t.Helper()
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(20 * time.Second):
		t.Fatal("reaperd did not exit after SIGTERM")
	}
	if code := d.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
}

func TestSIGTERMResignsKillsPluginsAndExitsZero(t *testing.T) {
	store, _, dsn := migratedStore(t)
	cfg := writeConfig(t, dsn, "reaper \"first\" {}\nreaper \"last\" {}\n")
	d := startDaemon(t, cfg)
	ctx := context.Background()
	eventually.True(t, 20*time.Second, "leadership", func() bool {
		l, ok, err := store.CurrentLeader(ctx)
		return err == nil && ok && d.holds(l.Holder)
	})
	plugins := childPIDs(t, d.cmd.Process.Pid)
	if len(plugins) != 3 {
		t.Fatalf("plugin processes = %v, want substrate + 2 reapers", plugins)
	}
	d.stopCleanly(t)
	l, _, err := store.CurrentLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l.Held(time.Now()) || l.Holder != "" {
		t.Fatalf("lease still held after a clean stop: %+v", l)
	}
	for _, pid := range plugins {
		if err := syscall.Kill(pid, 0); err == nil {
			t.Errorf("plugin process %d still running", pid)
		}
	}
}

// telemetryAddr is the address the daemon's telemetry server bound, read
// from its log.
func (d *reaperdProc) telemetryAddr() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, l := range d.logs {
		var ev struct {
			Message string `json:"@message"`
			Addr    string `json:"addr"`
		}
		if json.Unmarshal([]byte(l), &ev) == nil && ev.Message == "telemetry listening" {
			return ev.Addr
		}
	}
	return ""
}

func (d *reaperdProc) health(t *testing.T) (int, string) {
	t.Helper()
	return d.get(t, "/monitor/health")
}

// get asks the daemon's telemetry for path: the status code and the body
// (0 and "" before it serves).
func (d *reaperdProc) get(t *testing.T, path string) (int, string) {
	t.Helper()
	addr := d.telemetryAddr()
	if addr == "" {
		return 0, ""
	}
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// count is how many lines of the daemon's log hold s.
func (d *reaperdProc) count(s string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, l := range d.logs {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

// logged reports whether a line of the daemon's log holds s.
func (d *reaperdProc) logged(s string) bool { return d.count(s) > 0 }

// stop sends SIGTERM and waits for the daemon to exit.
func (d *reaperdProc) stop(t *testing.T) {
	t.Helper()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		t.Fatal("reaperd did not exit 30s after SIGTERM")
	}
}

func TestDatabaseDownAtStart(t *testing.T) {
	ctx := context.Background()
	srv, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	name := srv.UniqueName("down")
	if err := srv.CreateDatabase(ctx, name, ""); err != nil { // migrated below
		t.Fatal(err)
	}
	dsn := srv.DSN(name)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := board.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	store, w := board.New(pool, board.Options{}), lifecycle.New(pool, lifecycle.Options{})
	a := runningSilentAttempt(t, w, "alive-run")

	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, writeConfig(t, dsn, "reaper \"echo\" {}\n"))
	eventually.True(t, 20*time.Second, "the daemon to report itself unhealthy, saying why", func() bool {
		code, body := d.health(t)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "unreachable") &&
			strings.Contains(body, `"reason":"the database's schema cannot be checked yet: connection refused`)
	})
	// Several retries of the schema gate pass with the database down: the
	// daemon stays up, and nothing leads before the gate opens.
	eventually.True(t, 20*time.Second, "a few retries", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		n := 0
		for _, l := range d.logs {
			if strings.Contains(l, "the database's schema cannot be checked yet") && strings.Contains(l, "retry_in") {
				n++
			}
		}
		return n >= 3
	})
	select {
	case <-d.done:
		t.Fatal("reaperd exited while the database was down")
	default:
	}

	resumedAt := time.Now()
	if err := srv.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, 30*time.Second, "leadership and a reap after the database returned", func() bool {
		recs, err := store.DecisionsFor(ctx, a.RunID, a.TaskID, 100) // the test's own pool reconnects too
		if err != nil {
			return false
		}
		for _, r := range recs {
			if r.Reaper == "echo" {
				return true
			}
		}
		return false
	})
	for _, r := range allDecisions(t, store) {
		if r.At.Before(resumedAt) {
			t.Fatalf("a decision was made while the database was down: %+v", r)
		}
	}
	if code, body := d.health(t); code != http.StatusOK {
		t.Fatalf("still unhealthy after the database returned: %d %s", code, body)
	}
}

package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// base is "now" for the CLI in every test.
var base = time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)

// bundle is a fresh board, a configuration file naming it, and the CLI
// with its clock stopped at base.
type bundle struct {
	dsn     string
	cfgPath string
	pool    *pgxpool.Pool
	store   *board.Store
	w       *lifecycle.Writer
	term    int64
	cli     CLI
}

// setup makes a board and a configuration file for it; extra is appended
// to the file (a ladder block, say).
func setup(t *testing.T, extra string) *bundle {
	t.Helper()
	dsn := pgtest.NewDSN(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := &bundle{
		dsn:     dsn,
		cfgPath: writeConfig(t, dsn, extra),
		pool:    pool,
		store:   board.New(pool, board.Options{}),
		w:       lifecycle.New(pool, lifecycle.Options{}),
		cli:     CLI{Now: func() time.Time { return base }, Getenv: func(string) string { return "" }},
	}
	lease, ok, err := b.store.TryAcquire(context.Background(), "host-a", 4*time.Hour, base.Add(-3*time.Hour))
	if err != nil || !ok {
		t.Fatalf("acquire leadership: %v %v", ok, err)
	}
	b.term = lease.Term
	return b
}

// writeConfig writes a valid Lite configuration naming dsn.
func writeConfig(t *testing.T, dsn, extra string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "reaper.hcl")
	src := fmt.Sprintf("edition = \"lite\"\n\nstore {\n  dsn = %q\n}\n\nsubstrate \"lite\" {}\n\n%s", dsn, extra)
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// closedDSN names a database on a 127.0.0.1 port nothing listens on.
func closedDSN(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("postgres://reaper@127.0.0.1:%d/reaper?sslmode=disable&connect_timeout=2", port)
}

// result is what one command line did.
type result struct {
	code           int
	stdout, stderr string
}

// ctl runs reaperctl CMD -config FILE ARGS... against the bundle's board.
func (b *bundle) ctl(t *testing.T, cmd string, args ...string) result {
	t.Helper()
	return run(t, b.cli, append([]string{cmd, "-config", b.cfgPath}, args...)...)
}

func run(t *testing.T, cli CLI, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := cli.Run(context.Background(), args, &out, &errOut)
	return result{code: code, stdout: out.String(), stderr: errOut.String()}
}

// ok fails t unless the command succeeded quietly on stderr.
func (r result) ok(t *testing.T) result {
	t.Helper()
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s", r.code, r.stderr, r.stdout)
	}
	return r
}

// failed fails t unless the command exited with code, printing exactly one
// line on stderr that holds want, and nothing on stdout.
func (r result) failed(t *testing.T, code int, want string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit %d, want %d; stderr %q", r.code, code, r.stderr)
	}
	if strings.Count(r.stderr, "\n") != 1 || !strings.HasSuffix(r.stderr, "\n") {
		t.Fatalf("stderr is not one line: %q", r.stderr)
	}
	if !strings.Contains(r.stderr, want) {
		t.Fatalf("stderr %q does not say %q", r.stderr, want)
	}
	if r.stdout != "" {
		t.Fatalf("stdout of a failure: %q", r.stdout)
	}
}

// decode parses stdout as exactly one JSON document.
func (r result) decode(t *testing.T, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("stdout is not the JSON document: %v\n%s", err, r.stdout)
	}
	if dec.More() {
		t.Fatalf("stdout holds more than one JSON document:\n%s", r.stdout)
	}
}

// createRun makes a running run started at startedAt with one Lite task
// instance per task id, all in none.
func (b *bundle) createRun(t *testing.T, runID string, startedAt time.Time, taskIDs ...string) {
	t.Helper()
	r := lifecycle.NewRun{RunID: runID, DagID: "dag", State: sdk.RunRunning}
	for _, id := range taskIDs {
		r.Tasks = append(r.Tasks, lifecycle.NewTask{TaskID: id, Executor: sdk.ExecutorLite, Retries: 1,
			Command: "sleep 1"})
	}
	if err := b.w.CreateRun(context.Background(), r, startedAt); err != nil {
		t.Fatal(err)
	}
}

func first(runID, taskID string) sdk.Attempt {
	return sdk.Attempt{RunID: runID, TaskID: taskID, Try: 1}
}

// queued drives a fresh attempt to queued at at.
func (b *bundle) queued(t *testing.T, a sdk.Attempt, at time.Time) {
	t.Helper()
	ctx := context.Background()
	if ok, err := b.w.Enqueue(ctx, a, at); err != nil || !ok {
		t.Fatalf("enqueue %s: %v %v", a, ok, err)
	}
	if ok, err := b.w.Queue(ctx, a, at); err != nil || !ok {
		t.Fatalf("queue %s: %v %v", a, ok, err)
	}
}

// running drives a fresh attempt to running: queued at queuedAt, running at
// runningAt, and heartbeated at heartbeatAt unless it is zero.
func (b *bundle) running(t *testing.T, a sdk.Attempt, queuedAt, runningAt, heartbeatAt time.Time) {
	t.Helper()
	ctx := context.Background()
	b.queued(t, a, queuedAt)
	if stop, err := b.w.Running(ctx, a, runningAt); err != nil || stop {
		t.Fatalf("running %s: %v %v", a, stop, err)
	}
	if !heartbeatAt.IsZero() {
		if stop, err := b.w.Heartbeat(ctx, a, heartbeatAt); err != nil || stop {
			t.Fatalf("heartbeat %s: %v %v", a, stop, err)
		}
	}
}

// succeeded drives a fresh attempt through queued and running to success.
func (b *bundle) succeeded(t *testing.T, a sdk.Attempt, queuedAt, runningAt, endedAt time.Time) {
	t.Helper()
	b.running(t, a, queuedAt, runningAt, time.Time{})
	if stop, err := b.w.Report(context.Background(), a, lifecycle.TerminalReport{State: sdk.StateSuccess}, endedAt); err != nil || stop {
		t.Fatalf("report %s: %v %v", a, stop, err)
	}
}

// mark fails a running attempt on the infra rail as agent_lost, confirmed,
// held for review when hold is set.
func (b *bundle) mark(t *testing.T, a sdk.Attempt, hold bool, at time.Time) {
	t.Helper()
	res, err := b.store.Mark(context.Background(), []sdk.Mark{{Attempt: a, FromStates: []string{sdk.StateRunning},
		Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost, Message: "agent_lost: no heartbeat for 6m",
		Confirm: true, Hold: hold, Term: b.term, At: at}})
	if err != nil || !res[0].Applied {
		t.Fatalf("mark %s: %+v %v", a, res, err)
	}
}

// decide records decisions in the audit at at.
func (b *bundle) decide(t *testing.T, at time.Time, ds ...sdk.Decision) {
	t.Helper()
	if err := b.store.RecordDecisions(context.Background(), b.term, at, ds); err != nil {
		t.Fatal(err)
	}
}

// snapshot is every row of the board's run and task tables, for proving
// that a failed command wrote nothing.
func (b *bundle) snapshot(t *testing.T) []any {
	t.Helper()
	ctx := context.Background()
	var rows []any
	for _, sql := range []string{
		"SELECT run_id, state, updated_at FROM runs ORDER BY run_id",
		"SELECT " + board.TaskInstanceColumns + " FROM task_instances ORDER BY run_id, task_id",
	} {
		rs, err := b.pool.Query(ctx, sql)
		if err != nil {
			t.Fatal(err)
		}
		for rs.Next() {
			vals, err := rs.Values()
			if err != nil {
				t.Fatal(err)
			}
			rows = append(rows, vals)
		}
		rs.Close()
		if err := rs.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return rows
}

func (b *bundle) unchanged(t *testing.T, before []any) {
	t.Helper()
	if after := b.snapshot(t); !reflect.DeepEqual(before, after) {
		t.Fatalf("the board changed:\nbefore %v\nafter  %v", before, after)
	}
}

// lines splits output into lines with trailing spaces trimmed.
func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		out = append(out, strings.TrimRight(l, " "))
	}
	return out
}

// golden compares output with want line by line (trailing spaces aside).
func golden(t *testing.T, got, want string) {
	t.Helper()
	g, w := lines(got), lines(strings.TrimPrefix(want, "\n"))
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("output differs\n--- got\n%s\n--- want\n%s", strings.Join(g, "\n"), strings.Join(w, "\n"))
	}
}

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// session is what both demos share: the binaries, a directory of their own
// (cleaned of a previous demo's leftovers first), the board, and the event
// lines the reaperd replicas' logs turn into.
type session struct {
	start  time.Time
	bin    string // where reaperd, the plugins and the agent are
	dir    string
	dsn    string
	cfg    string // reaperd's configuration file, once prepared
	pool   *pgxpool.Pool
	store  *board.Store
	events chan string
	// injected counts the faults injected (report).
	injected int
	undo     []func() // run in reverse by close
}

func say(format string, args ...any) { fmt.Printf(format+"\n", args...) }

// at is the time since the demo started, for event lines.
func (s *session) at() float64 { return time.Since(s.start).Seconds() }

// open prepares a session in $TMPDIR/<name>-<uid> with the binaries in
// bin (openDir), then starts a throwaway PostgreSQL unless REAPER_DSN
// names one, and opens the board.
func open(ctx context.Context, name, bin string) (*session, error) {
	s, err := openDir(name, bin)
	if err != nil {
		return nil, err
	}
	dsn := os.Getenv("REAPER_DSN")
	if dsn == "" {
		say("starting a throwaway PostgreSQL from this machine's server binaries ...")
		srv, err := s.startDatabase(ctx, pgtest.Options{})
		if err == nil {
			err = srv.CreateDatabase(ctx, "reaper", "")
		}
		if err != nil {
			s.close()
			return nil, err
		}
		dsn = srv.DSN("reaper")
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		s.close()
		return nil, err
	}
	s.undo = append(s.undo, pool.Close)
	s.useBoard(dsn, pool)
	return s, nil
}

// openDir prepares a session in $TMPDIR/<name>-<uid> with the binaries in
// bin, cleaning what a previous demo left there first; close removes it.
func openDir(name, bin string) (*session, error) {
	s := &session{start: time.Now(), bin: bin, events: make(chan string, 1024)}
	s.dir = filepath.Join(os.TempDir(), fmt.Sprintf("%s-%d", name, os.Getuid()))
	if cleanup(s.dir) {
		say("cleaned up what a previous demo left behind")
	}
	_ = os.RemoveAll(s.logsDir()) // a failed demo's logs, kept until the next one
	if err := os.MkdirAll(filepath.Join(s.dir, "records"), 0o700); err != nil {
		return nil, err
	}
	_ = os.Chmod(s.dir, 0o755) // the database server's account needs to reach its directory
	s.undo = append(s.undo, func() { cleanup(s.dir) })
	return s, nil
}

// startDatabase starts a throwaway PostgreSQL in the session's directory
// (so that cleanup finds it after a crash); close stops it.
func (s *session) startDatabase(ctx context.Context, opts pgtest.Options) (*pgtest.Server, error) {
	opts.BaseDir = s.dir
	srv, err := pgtest.Start(ctx, opts)
	if err != nil {
		return nil, err
	}
	s.undo = append(s.undo, func() { _ = srv.Stop() })
	return srv, nil
}

// useBoard makes the database at dsn, through pool, the session's board.
func (s *session) useBoard(dsn string, pool *pgxpool.Pool) {
	s.dsn, s.pool = dsn, pool
	s.store = board.New(pool, board.Options{})
}

// logsDir is where a failed demo's logs are kept (the session's directory
// itself is removed).
func (s *session) logsDir() string { return s.dir + "-logs" }

// keepLogs copies the session's logs to logsDir and returns it, for a
// demo that failed.
func (s *session) keepLogs() string {
	out := s.logsDir()
	files, _ := filepath.Glob(filepath.Join(s.dir, "*.log"))
	if err := os.MkdirAll(out, 0o700); err != nil {
		return s.dir
	}
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil {
			_ = os.WriteFile(filepath.Join(out, filepath.Base(f)), b, 0o600)
		}
	}
	return out
}

// close undoes what the session started, newest first.
func (s *session) close() {
	for i := len(s.undo) - 1; i >= 0; i-- {
		s.undo[i]()
	}
	s.undo = nil
}

// env is the environment of reaperd and reaperctl: the file names the
// database.
func (s *session) env() []string { return append(os.Environ(), "REAPER_DSN=") }

// prepare writes the configuration and runs reaperd validate and migrate
// on it.
func (s *session) prepare(ctx context.Context, cfgPath, cfg string) error {
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return err
	}
	s.cfg = cfgPath
	for _, step := range []string{"validate", "migrate"} {
		cmd := exec.CommandContext(ctx, filepath.Join(s.bin, "reaperd"), step, "-config", cfgPath)
		cmd.Env = s.env()
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("reaperd %s: %w\n%s", step, err, out)
		}
		say("reaperd %s: %s", step, strings.TrimSpace(lastLine(string(out))))
	}
	return nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// replica is one reaperd process of the demo.
type replica struct {
	name    string // "" when the demo runs one
	cmd     *exec.Cmd
	done    chan struct{} // closed when it has exited
	leading atomic.Bool   // its log said it gained leadership (and not lost it since)
	ready   chan struct{} // closed once its attempt API is ready (or it exited)
	api     atomic.Value  // string: its attempt API's URL, once ready
}

// apiURL is the replica's attempt API URL; "" until it is ready.
func (r *replica) apiURL() string {
	u, _ := r.api.Load().(string)
	return u
}

// startReaperd starts reaperd run on cfgPath; its log goes to
// <dir>/<name or reaperd>.log and its decisions to the session's events.
// close stops it (SIGTERM, then SIGKILL).
func (s *session) startReaperd(cfgPath, name string) (*replica, error) {
	r := &replica{name: name, done: make(chan struct{}), ready: make(chan struct{})}
	r.cmd = exec.Command(filepath.Join(s.bin, "reaperd"), "run", "-config", cfgPath)
	r.cmd.Env = s.env()
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	logs, err := r.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := r.cmd.Start(); err != nil {
		return nil, err
	}
	logName := "reaperd.log"
	if name != "" {
		logName = name + ".log"
	}
	followed := make(chan struct{})
	go func() { defer close(followed); s.follow(logs, r, filepath.Join(s.dir, logName)) }()
	go func() { <-followed; _ = r.cmd.Wait(); close(r.done) }()
	s.undo = append(s.undo, r.stop)
	return r, nil
}

// stop ends the replica: SIGTERM, then SIGKILL after 15 s.
func (r *replica) stop() {
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(15 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
}

// follow turns a reaperd's JSON log into readable event lines (the
// leadership, the applied decisions of the reapers and the sweep, the
// runner's retries and re-places, the gate) and keeps the whole log in a
// file.
func (s *session) follow(rd io.Reader, r *replica, path string) {
	f, _ := os.Create(path)
	if f != nil {
		defer f.Close()
	}
	readyOnce := false
	defer func() {
		if !readyOnce {
			close(r.ready)
		}
	}()
	who := "reaperd"
	if r.name != "" {
		who = r.name
	}
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if f != nil {
			fmt.Fprintln(f, line)
		}
		var ev map[string]any
		if json.Unmarshal([]byte(line), &ev) != nil {
			continue
		}
		msg, _ := ev["@message"].(string)
		decision, _ := ev["decision"].(string)
		at := s.at()
		line = ""
		switch {
		case msg == "attempt api ready" && !readyOnce:
			readyOnce = true
			u, _ := ev["url"].(string)
			r.api.Store(u)
			close(r.ready)
		case msg == "gained leadership":
			r.leading.Store(true)
			line = fmt.Sprintf("%6.1fs  LEADER     %s leads (term %v); reapers wait out the settling grace", at, who, ev["term"])
		case strings.Contains(msg, "lease lost"), msg == "resigned leadership":
			r.leading.Store(false)
		case msg == "decision" && ev["applied"] == true:
			kind := "REAPED"
			if strings.HasPrefix(decision, "reconcile_") {
				kind = "SETTLED"
			}
			line = fmt.Sprintf("%6.1fs  %-9s  %-12v %-28s %s/%v try=%v epoch=%v%s",
				at, kind, ev["reaper"], decision, ev["run"], ev["task"], ev["try"], ev["epoch"], evidence(ev))
		case decision == sdk.LabelInfraReplace && ev["applied"] == true:
			line = fmt.Sprintf("%6.1fs  RE-PLACED  runner       %-28s %v -> %v", at, decision, ev["attempt"], ev["next"])
		case decision == sdk.LabelTaskRetry && ev["applied"] == true:
			line = fmt.Sprintf("%6.1fs  RETRY      runner       %-28s %v -> %v", at, decision, ev["attempt"], ev["next"])
		case strings.Contains(msg, "settling valve"):
			line = fmt.Sprintf("%6.1fs  WARN       %s", at, msg)
		}
		if line != "" {
			s.events <- line
		}
	}
}

// evidence is the part of a decision's evidence worth a glance: the Lite
// agent and task group, or why the sweep settled an attempt.
func evidence(ev map[string]any) string {
	switch {
	case ev["group"] != nil: // Lite
		return fmt.Sprintf(" (agent %v, group %v)", ev["agent"], ev["group"])
	case ev["detail"] != nil && ev["decision"] != sdk.LabelPodLost:
		return fmt.Sprintf(" (%v)", ev["detail"])
	}
	return ""
}

// watch polls the runs every 200 ms until every one has finished: it
// prints the event lines as they come and a progress line every 3 s, and
// hands inject the runs' task instances at every poll. It returns 0 once
// all have finished (the last event lines printed), 130 when interrupted,
// and 1 when alive reports false (no reaperd left) or the runs outlast
// limit.
func (s *session) watch(ctx context.Context, runs []string, limit time.Duration, alive func() bool,
	inject func([]board.TaskInstance)) int {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(limit)
	lastProgress := time.Time{}
	for {
		select {
		case <-ctx.Done():
			say("interrupted")
			return 130
		case ev := <-s.events:
			say("%s", ev)
			continue
		case <-tick.C:
		}
		if !alive() {
			fmt.Fprintln(os.Stderr, "demo: no reaperd is running any more; the logs are in", s.keepLogs())
			return 1
		}
		var all []board.TaskInstance
		done := true
		for _, id := range runs {
			tis, err := s.store.TaskInstances(ctx, id)
			if err != nil {
				done = false // the board may still be starting
				continue
			}
			all = append(all, tis...)
			if r, err := s.store.Run(ctx, id); err != nil || (r.State != sdk.RunSuccess && r.State != sdk.RunFailed) {
				done = false
			}
		}
		inject(all)
		if time.Since(lastProgress) >= 3*time.Second {
			lastProgress = time.Now()
			say("%6.1fs  progress   %s", s.at(), progress(all))
		}
		if done {
			time.Sleep(300 * time.Millisecond) // let the last log lines through
			s.drain()
			say("")
			for _, id := range runs {
				r, _ := s.store.Run(ctx, id)
				say("run %q finished %s after %.0fs", id, r.State, s.at())
			}
			return 0
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "demo: the runs did not finish in %s; the logs are in %s\n", limit, s.keepLogs())
			return 1
		}
	}
}

// explain prints what reaperctl explain says of a task: what an operator
// would ask next.
func (s *session) explain(ctx context.Context, run, task string) {
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, "reaperctl"), "explain", "-config", s.cfg, run, task)
	cmd.Env = s.env()
	if out, err := cmd.CombinedOutput(); err == nil {
		say("\n$ reaperctl explain %s %s\n%s", run, task, strings.TrimRight(string(out), "\n"))
	}
}

// report says a fault injected, counting it, or why it was not yet.
func (s *session) report(msg string, err error) {
	if err != nil {
		say("%6.1fs  (fault not injected yet: %v)", s.at(), err)
		return
	}
	s.injected++
	say("%6.1fs  FAULT      %s", s.at(), msg)
}

// drain prints the event lines waiting.
func (s *session) drain() {
	for len(s.events) > 0 {
		say("%s", <-s.events)
	}
}

// progress counts task instances by state.
func progress(tis []board.TaskInstance) string {
	counts := map[string]int{}
	for _, ti := range tis {
		counts[ti.State]++
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, counts[k])
	}
	return "tasks: " + strings.Join(parts, " ")
}

// outcome reads what a summary is computed from: the runs' task
// instances and the audit's applied decisions about them.
func (s *session) outcome(ctx context.Context, runs ...string) ([]board.TaskInstance, []decisionRow, error) {
	var tis []board.TaskInstance
	for _, id := range runs {
		t, err := s.store.TaskInstances(ctx, id)
		if err != nil {
			return nil, nil, err
		}
		tis = append(tis, t...)
	}
	ds, err := s.appliedDecisions(ctx, runs...)
	return tis, ds, err
}

// isReap reports whether label is a reaper's decision that fails or
// re-places an attempt (the kube demos' "reaped").
func isReap(label string) bool {
	switch label {
	case sdk.LabelPodLost, sdk.LabelDispatchLost, sdk.LabelStartExpired, sdk.LabelAgentLost,
		sdk.LabelCredentialCeiling, sdk.LabelWarmWorkerLost, sdk.LabelOrphanRun:
		return true
	}
	return false
}

// decisionRow is an applied decision of the audit.
type decisionRow struct {
	reaper, label string
	attempt       sdk.Attempt
	// mark is the reaper's mark a runner's decision acted on (its
	// evidence's "mark": an infra_replace names the label the attempt was
	// marked with), "" for any other.
	mark string
}

// appliedDecisions reads the applied decisions of the audit about runs.
func (s *session) appliedDecisions(ctx context.Context, runs ...string) ([]decisionRow, error) {
	rows, err := s.pool.Query(ctx, `SELECT reaper, label, run_id, task_id, coalesce(try_number, 0), coalesce(attempt_epoch, 0),
            coalesce(reap_evidence(evidence_packed, evidence)->>'mark', '')
        FROM reap_decisions WHERE run_id = ANY($1) AND applied ORDER BY id`, runs)
	if err != nil {
		return nil, fmt.Errorf("reading the audit: %w", err)
	}
	defer rows.Close()
	var out []decisionRow
	for rows.Next() {
		var d decisionRow
		var task *string
		if err := rows.Scan(&d.reaper, &d.label, &d.attempt.RunID, &task, &d.attempt.Try, &d.attempt.Epoch,
			&d.mark); err != nil {
			return nil, fmt.Errorf("reading the audit: %w", err)
		}
		if task != nil {
			d.attempt.TaskID = *task
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// attempts counts the executions a task instance has had: the first, and
// one more for every try and every re-placed epoch since.
func attempts(tis []board.TaskInstance) int {
	n := 0
	for _, ti := range tis {
		n += int(ti.Try) + int(ti.Epoch)
	}
	return n
}

// count is a line of the summary.
type count struct {
	label string
	n     int
}

// printSummary prints the summary table.
func (s *session) printSummary(counts []count) {
	say("")
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "SUMMARY\t")
	for _, c := range counts {
		fmt.Fprintf(w, "  %s\t%d\n", c.label, c.n)
	}
	fmt.Fprintf(w, "  wall time\t%.0fs\n", time.Since(s.start).Seconds())
	w.Flush()
}

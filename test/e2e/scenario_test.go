package e2e_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/cmd/reaperctl/ctl"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/lite/proc"
	"github.com/dexaflow/reaper/substrate/lite/records"
	"github.com/dexaflow/reaper/testkit/marked"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// The ladder every scenario runs with: the specification's order, shortened
// so that a scenario takes tens of seconds.
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
	// renewEvery is how often a replica tries to take or renew the lease
	// (the elector's default, lease / 3).
	renewEvery = lease / 3
)

// markEnv is the environment variable that marks every process of a
// scenario: reaperd passes its environment to plugins and agents, agents to
// tasks.
const markEnv = "REAPER_E2E_SCENARIO"

// runID is the one run each scenario submits.
const runID = "e2e"

// The three reapers of Lite, in the configured order.
const liteReapers = `reaper "dispatchlost" {}
reaper "agentlost" {}
reaper "orphanrun" {}
`

// scenario is one fault scenario: its own database, record directory, log
// directory and task files, its reaperd processes, the faults it injected
// and the figures it ends with.
type scenario struct {
	t     *testing.T
	num   int
	title string
	mon   *monitor
	mark  string

	dir, recordDir, logDir, taskDir string
	apiListen                       string // the attempt API address every replica shares
	release                         string // once it exists, the tasks waiting on it end
	dsn                             string
	pool                            *pgxpool.Pool
	store                           *board.Store
	records                         *records.Dir

	daemons []*daemon
	tasks   []taskSpec
	faults  []*fault
	harmed  map[sdk.Attempt]bool
	escaped []int // processes that left their task's group on purpose
	terms   map[int64]time.Time
	started time.Time
	row     *figures
	timing  timing
}

// timing is the part of the ladder and of the Lite stop a scenario may set
// apart from the suite's: most use the short suite values; the default-
// timing scenarios use the specification's interval and stop.
type timing struct {
	interval, grace, stopGrace, killWait time.Duration
}

// suiteTiming is the suite's short timing.
func suiteTiming() timing {
	return timing{interval: interval, grace: grace, stopGrace: stopGrace, killWait: killWait}
}

// defaultStopTiming is the specification's cycle (30 s) and orphan stop
// (SIGTERM, 10 s, SIGKILL, 5 s), with the shortest settling grace the
// ladder allows beside that interval (more than two intervals).
func defaultStopTiming() timing {
	return timing{interval: 30 * time.Second, grace: 65 * time.Second, stopGrace: 10 * time.Second, killWait: 5 * time.Second}
}

// taskSpec is one task of the scenario's run.
type taskSpec struct {
	id string
	// victim: the test harms its first attempt, which waits for the
	// release like a bystander, so that only the harm (or a double
	// execution) ends it; the attempts after it end after a second.
	victim bool
	// escape: the first attempt starts a process that leaves the task's
	// process group with setsid, and records its pid in <id>.escaped.
	escape bool
	// trapTerm: the first attempt's whole process group ignores SIGTERM,
	// so only SIGKILL ends it.
	trapTerm bool
}

func bystander(id string) taskSpec { return taskSpec{id: id} }
func victim(id string) taskSpec    { return taskSpec{id: id, victim: true} }
func trapping(id string) taskSpec  { return taskSpec{id: id, victim: true, trapTerm: true} }

// newScenario prepares a scenario on the board at dsn (already migrated).
func newScenario(t *testing.T, num int, title string, mon *monitor, dsn string) *scenario {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	s := &scenario{
		t: t, num: num, title: title, mon: mon,
		mark:    fmt.Sprintf("s%d-%s", num, hex.EncodeToString(b[:])),
		dir:     t.TempDir(),
		dsn:     dsn,
		harmed:  map[sdk.Attempt]bool{},
		terms:   map[int64]time.Time{},
		started: time.Now(),
		timing:  suiteTiming(),
	}
	s.row = book.add(num, title)
	s.row.track(t)
	s.recordDir = filepath.Join(s.dir, "records")
	// One attempt API address for every replica of the scenario (they share
	// it), kept across restarts so a restarted reaperd serves the agents
	// already running.
	s.apiListen = attemptapitest.FreeAddr(t)
	s.logDir = filepath.Join(s.dir, "logs")
	s.taskDir = filepath.Join(s.dir, "tasks")
	s.release = filepath.Join(s.dir, "release")
	for _, d := range []string{s.recordDir, s.logDir, s.taskDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	if s.records, err = records.Open(s.recordDir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.records.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Parsed as reaperd parses it: a DSN naming a primary and its standby
	// follows a promotion.
	cfg, err := board.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if s.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.pool.Close)
	s.store = board.New(s.pool, board.Options{})
	s.installHistory()
	mon.watch(s.taskDir)
	t.Cleanup(func() { mon.forget(s.taskDir) })
	// Cleanups run last registered first: the daemons' own (registered
	// later) run before these, the database is dropped after them.
	// Nothing carrying the scenario's marker may outlive it.
	t.Cleanup(s.sweep)
	t.Cleanup(func() {
		if t.Failed() {
			s.dump()
		}
	})
	return s
}

// config writes a configuration with the suite's ladder and the given
// reaper blocks, and returns its path.
func (s *scenario) config(reapers string) string {
	s.t.Helper()
	return s.configWith(reapers, leaderTiming{})
}

// leaderTiming is a replica's own leader block, apart from the suite's
// lease: a zero field takes the suite's value (renew: the elector's
// default, a third of the lease).
type leaderTiming struct {
	lease, renew time.Duration
}

// configWith is config with a leader block of the replica's own.
func (s *scenario) configWith(reapers string, lt leaderTiming) string {
	s.t.Helper()
	if lt.lease == 0 {
		lt.lease = lease
	}
	leaderBlock := fmt.Sprintf("  lease = %q\n", lt.lease)
	if lt.renew > 0 {
		leaderBlock += fmt.Sprintf("  renew = %q\n", lt.renew)
	}
	src := fmt.Sprintf(`edition    = "lite"
plugin_dir = %q

store {
  dsn = %q
}

leader "postgres" {
%s}

maintenance {
  interval = %q
}

ladder {
  heartbeat      = %q
  agent_lost     = %q
  settling_grace = %q
  dispatch_lost  = %q
  orphan_run     = %q
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
  stop_grace = %q
  kill_wait  = %q
}

runner {
  log_dir = %q
}

%s`, binDir, s.dsn, leaderBlock, s.timing.interval, heartbeat, agentLost, s.timing.grace, dispatchLost, orphanRun,
		s.apiListen, filepath.Join(s.dir, "attempt-api"),
		s.recordDir, s.timing.stopGrace, s.timing.killWait, s.logDir, reapers)
	path := filepath.Join(s.dir, fmt.Sprintf("reaperd-%d.hcl", len(s.daemons)+1))
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		s.t.Fatal(err)
	}
	return path
}

func (s *scenario) ctx() context.Context { return context.Background() }

// ownBoard starts a PostgreSQL server of the scenario's own, for a fault
// that takes the whole server (stopped, frozen), and makes a database
// holding the board's schema on it. The server is stopped when the
// scenario ends, after its processes.
func ownBoard(t *testing.T, prefix string) (*pgtest.Server, string) {
	t.Helper()
	return pgtest.NewOwnBoard(t, prefix)
}

// failoverBoard starts a primary of the scenario's own holding the board's
// schema and a streaming standby of it made with opts, and returns both
// and the DSN naming both (primary first), which every replica of the
// scenario and the scenario's own pool use: after the primary is killed
// and the standby promoted, their new connections reach the promoted one.
func failoverBoard(t *testing.T, opts pgtest.StandbyOptions) (primary, standby *pgtest.Server, dsn string) {
	t.Helper()
	primary, standby = pgtest.NewFailoverPair(t, "board", opts)
	return primary, standby, pgtest.FailoverDSN("board", primary, standby)
}

// promoted drops the scenario's own connections after its primary was
// killed and its standby promoted: the next reads of the scenario reach
// the promoted server.
func (s *scenario) promoted() { s.pool.Reset() }

// queryBound bounds each read of the suite's own on the board.
const queryBound = 10 * time.Second

// eventually polls cond every 100ms until it holds, failing the scenario
// when bound passes first. Bounds are far beyond the expected times; the
// poll ends as soon as the real processes get there.
func (s *scenario) eventually(bound time.Duration, what string, cond func() bool) {
	s.t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out after %s waiting for %s", bound, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// command is a task's shell command: a start line, the body, an end line.
func (s *scenario) command(ts taskSpec) string {
	q := func(p string) string { return "'" + p + "'" }
	file := q(filepath.Join(s.taskDir, ts.id+".log"))
	wait := "until [ -e " + q(s.release) + " ]; do sleep 0.3; done"
	body := wait
	if ts.victim {
		first := wait
		if ts.escape {
			esc := q(filepath.Join(s.taskDir, ts.id+".escaped"))
			first = "setsid sh -c 'echo $$ > \"$0\"; exec sleep 300' " + esc + " </dev/null >/dev/null 2>&1 & " + wait
		}
		if ts.trapTerm {
			first = "trap '' TERM; " + first
		}
		body = `if [ "$REAPER_EPOCH" = 0 ]; then ` + first + "; else sleep 1; fi"
	}
	return `echo "start $REAPER_EPOCH $$ $(date +%s.%N)" >> ` + file + "; " + body +
		`; echo "end $REAPER_EPOCH $$ $(date +%s.%N)" >> ` + file
}

// reaperctl runs one reaperctl command line in-process on the scenario's
// board.
func (s *scenario) reaperctl(config string, args ...string) (string, error) {
	var out bytes.Buffer
	full := append([]string{args[0], "-config", config}, args[1:]...)
	ctx, cancel := context.WithTimeout(s.ctx(), 3*queryBound)
	defer cancel()
	code := ctl.CLI{Getenv: func(string) string { return "" }}.Run(ctx, full, &out, &out)
	if code != 0 {
		return out.String(), fmt.Errorf("reaperctl %s: exit %d: %s", args[0], code, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// submit submits the scenario's run through reaperctl.
func (s *scenario) submit(config string, tasks ...taskSpec) {
	s.t.Helper()
	s.tasks = tasks
	ids := make([]string, len(tasks))
	args := []string{"submit", "-run", runID}
	var cmds []string
	for i, ts := range tasks {
		ids[i] = ts.id
		cmds = append(cmds, s.command(ts))
	}
	args = append(args, "-tasks", strings.Join(ids, ","), "--")
	args = append(args, cmds...)
	if _, err := s.reaperctl(config, args...); err != nil {
		s.t.Fatal(err)
	}
}

// first is the first attempt of a task.
func first(task string) sdk.Attempt { return sdk.Attempt{RunID: runID, TaskID: task, Try: 1, Epoch: 0} }

// waitRunning waits until the first attempt of task has started its
// command and heartbeated, and returns its execution.
func (s *scenario) waitRunning(task string) execution {
	s.t.Helper()
	var ex execution
	s.eventually(30*time.Second, task+" to start and heartbeat", func() bool {
		for _, e := range s.mon.executions(s.taskDir) {
			if e.Task == task && e.Epoch == 0 {
				ex = e
			}
		}
		if ex.PID == 0 {
			return false
		}
		ti, err := s.store.TaskInstance(s.ctx(), runID, task)
		return err == nil && ti.State == sdk.StateRunning && !ti.LastHeartbeatAt.IsZero() && ti.Epoch == 0
	})
	return ex
}

// fault is one injected fault, and the attempt whose reap shows the system
// recovered from it.
type fault struct {
	what string
	at   time.Time
	// target is the attempt whose reaping decision ends the recovery: the
	// attempt harmed (agent faults), or one harmed under or after a fault
	// of the control plane.
	target *sdk.Attempt
	// agent: the fault harmed target itself. Its threshold is agent_lost,
	// and a reaper acts only once the reaping leader has settled.
	agent bool
	// threshold is how long after the fault a reaper may act (control-plane
	// faults: the takeover and the settling grace, or agent_lost when
	// leadership is not lost).
	threshold time.Duration

	// Set by evaluate.
	reap      *decision
	deadline  time.Time
	recovered bool
}

// harmAgent kills the agent of task's first attempt with SIGKILL, and with
// group its task's whole process group too (the agent first, so that it
// never sees its task die).
func (s *scenario) harmAgent(task string, group bool, what string) *fault {
	s.t.Helper()
	a := first(task)
	rec, err := s.records.ReadAgent(a)
	if err != nil {
		s.t.Fatalf("read the agent record of %s: %v", a, err)
	}
	cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", rec.PID))
	if !bytes.Contains(cmd, []byte("reaper-agent")) || !bytes.Contains(cmd, []byte("-task="+task)) {
		s.t.Fatalf("pid %d of the record of %s is not its agent: %q", rec.PID, a, cmd)
	}
	var pgid int
	for _, e := range s.mon.executions(s.taskDir) {
		if e.Task == task && e.Epoch == 0 {
			pgid = e.PID
		}
	}
	if group && pgid <= 1 {
		s.t.Fatalf("no task group known for %s", a)
	}
	at := time.Now()
	if err := syscall.Kill(rec.PID, syscall.SIGKILL); err != nil {
		s.t.Fatalf("kill the agent of %s: %v", a, err)
	}
	if group {
		if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil {
			s.t.Fatalf("kill the task group of %s: %v", a, err)
		}
	}
	f := &fault{what: what, at: at, target: &a, agent: true, threshold: agentLost}
	s.faults = append(s.faults, f)
	s.harmed[a] = true
	s.t.Logf("%s: killed the agent %d of %s (its task group %d too: %v)", at.Format("15:04:05.000"), rec.PID, a, pgid, group)
	return f
}

// controlFault records a fault of the control plane itself, judged by the
// reap of target within threshold + one interval of at.
func (s *scenario) controlFault(what string, at time.Time, threshold time.Duration, target *sdk.Attempt) *fault {
	f := &fault{what: what, at: at, threshold: threshold, target: target}
	s.faults = append(s.faults, f)
	s.t.Logf("%s: %s", at.Format("15:04:05.000"), what)
	return f
}

// decision is one audit row.
type decision struct {
	At      time.Time
	Term    int64
	Reaper  string
	Label   string
	Applied bool
	Detail  string
	Attempt sdk.Attempt // zero for run or gate decisions
	Holder  string      // the replica that wrote it
}

// decisions reads the audit, oldest first; with a run/task filter when task
// is not empty.
func (s *scenario) decisions(task string) ([]decision, error) {
	q := `SELECT at, term, reaper, label, applied, detail, coalesce(run_id, ''), coalesce(task_id, ''),
	             coalesce(try_number, 0), coalesce(attempt_epoch, 0), coalesce(holder, '')
	        FROM reap_decisions`
	var args []any
	if task != "" {
		q += ` WHERE run_id = $1 AND task_id = $2`
		args = append(args, runID, task)
	}
	ctx, cancel := context.WithTimeout(s.ctx(), queryBound)
	defer cancel()
	rows, err := s.pool.Query(ctx, q+` ORDER BY id`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []decision
	for rows.Next() {
		var d decision
		if err := rows.Scan(&d.At, &d.Term, &d.Reaper, &d.Label, &d.Applied, &d.Detail,
			&d.Attempt.RunID, &d.Attempt.TaskID, &d.Attempt.Try, &d.Attempt.Epoch, &d.Holder); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// isReaper tells a reaper's decision from the runner's and the gate's.
// isReaper tells a reaper's decision from the runner's, the gate's, an
// operator's (reaperctl's submit, mark and release are audited) and the
// attempt API's.
func isReaper(d decision) bool {
	switch d.Reaper {
	case "runner", "gate", lifecycle.OperatorReaper, attemptapi.DecisionSource:
		return false
	}
	return true
}

// reapOf is the first applied reaper decision about exactly a.
func reapOf(ds []decision, a sdk.Attempt) *decision {
	for i, d := range ds {
		if d.Applied && isReaper(d) && d.Attempt == a {
			return &ds[i]
		}
	}
	return nil
}

// waitReaped waits for the first applied reaper decision about a.
func (s *scenario) waitReaped(a sdk.Attempt, bound time.Duration) decision {
	s.t.Helper()
	var got *decision
	s.eventually(bound, "the reap of "+a.String(), func() bool {
		ds, err := s.decisions(a.TaskID)
		if err != nil {
			return false
		}
		got = reapOf(ds, a)
		return got != nil
	})
	s.t.Logf("%s: %s reaped by %s as %s (term %d)", got.At.Format("15:04:05.000"), a, got.Reaper, got.Label, got.Term)
	return *got
}

// waitRecovered waits until a later attempt of task ran to its end.
func (s *scenario) waitRecovered(task string) execution {
	s.t.Helper()
	var ex execution
	s.eventually(40*time.Second, "a re-placed attempt of "+task+" to run to its end", func() bool {
		for _, e := range s.mon.executions(s.taskDir) {
			if e.Task == task && e.Epoch > 0 && !e.End.IsZero() {
				ex = e
				return true
			}
		}
		return false
	})
	return ex
}

// leaderNow reads the lease row and remembers when its term was gained.
func (s *scenario) leaderNow() (board.Lease, bool) {
	l, ok, err := s.store.CurrentLeader(s.ctx())
	if err != nil || !ok {
		return board.Lease{}, false
	}
	s.terms[l.Term] = l.AcquiredAt
	return l, true
}

// waitLeader waits until d holds the lease, and returns it.
func (s *scenario) waitLeader(d *daemon, bound time.Duration) board.Lease {
	s.t.Helper()
	var l board.Lease
	s.eventually(bound, d.name+" to lead", func() bool {
		var ok bool
		l, ok = s.leaderNow()
		return ok && d.holds(l.Holder) && l.Held(time.Now())
	})
	return l
}

// finish releases the tasks, waits for the run to end, and checks what
// every scenario promises: the attempts not harmed ran once to success and
// were never marked; no task ran twice at once; nothing is left running.
// It fills in the scenario's figures.
func (s *scenario) finish() {
	s.t.Helper()
	if err := os.WriteFile(s.release, nil, 0o600); err != nil {
		s.t.Fatal(err)
	}
	wedged := map[string]bool{}
	deadline := time.Now().Add(40 * time.Second)
	for {
		r, err := s.store.Run(s.ctx(), runID)
		if err == nil && (r.State == sdk.RunSuccess || r.State == sdk.RunFailed) {
			if r.State != sdk.RunSuccess {
				s.t.Errorf("run %s ended %s: %s", runID, r.State, r.ErrorMessage)
			}
			break
		}
		if time.Now().After(deadline) {
			s.t.Errorf("run %s not finished 40s after the tasks were released (state %q, err %v)", runID, r.State, err)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	tis, err := s.store.TaskInstances(s.ctx(), runID)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, ti := range tis {
		switch ti.State {
		case sdk.StateSuccess, sdk.StateFailed, sdk.StateSkipped, sdk.StateUpstreamFailed:
		default:
			wedged[ti.TaskID] = true
			s.t.Errorf("%s wedged in state %s", ti.Attempt, ti.State)
		}
	}

	// Every agent and task process ends on its own once its attempt has
	// reported; the processes that escaped their group stay, as documented.
	escaped := map[int]bool{}
	for _, pid := range s.escaped {
		escaped[pid] = true
	}
	// What runs besides the live daemons and their plugins (computed anew
	// each time: a plugin whose host is gone is a leftover).
	leftovers := func() []marked.Process {
		daemons := s.daemonProcesses()
		var out []marked.Process
		for _, p := range marked.Processes(markEnv, s.mark) {
			if !escaped[p.PID] && !daemons[p.PID] {
				out = append(out, p)
			}
		}
		return out
	}
	settle := func(bound time.Duration) []marked.Process {
		until := time.Now().Add(bound)
		for {
			left := leftovers()
			if len(left) == 0 || time.Now().After(until) {
				return left
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	settle(20 * time.Second) // the agents exit once they have reported
	for _, d := range s.daemons {
		if !d.exited() && !d.stop(20*time.Second) {
			s.t.Errorf("%s did not stop within 20s of SIGTERM", d.name)
		}
	}
	for _, p := range settle(5 * time.Second) {
		key := p.Task
		if key == "" {
			key = fmt.Sprintf("pid %d", p.PID)
		}
		wedged[key] = true
		s.t.Errorf("left running: pid %d (%s) of task %q", p.PID, p.Cmdline, p.Task)
	}

	execs := s.mon.executions(s.taskDir)
	for _, e := range execs {
		if s.harmed[first(e.Task)] {
			s.t.Logf("execution: %s", e)
		}
	}
	s.checkAttempts(tis, execs)
	doubles, what := overlaps(execs)
	for _, w := range what {
		s.t.Errorf("double execution: %s", w)
	}
	for _, e := range execs {
		if !e.ended() {
			wedged[e.Task] = true
			s.t.Errorf("execution still running: %s", e)
		}
	}
	ds, err := s.decisions("")
	if err != nil {
		s.t.Fatal(err)
	}
	falseReaps := s.falseReaps(ds)
	s.everyMarkAudited()
	recovered := s.evaluate(ds)
	if v, ok := s.judgeHistory(execs); ok {
		s.row.setHistory(v)
	}

	s.row.set(len(s.faults), recovered, falseReaps, doubles, len(wedged), time.Since(s.started))
}

// everyMarkAudited checks, once every replica stopped, the rule that each
// write a reaper applied that the board still shows has its decision in
// the audit.
func (s *scenario) everyMarkAudited() {
	s.t.Helper()
	lost, err := s.store.UnauditedMarks(s.ctx(), time.Time{})
	if err != nil {
		s.t.Errorf("check the audit of the marks: %v", err)
	}
	for _, m := range lost {
		s.t.Errorf("%s was marked %s on the board at %s, and no decision about it is in the audit",
			m.Attempt, m.Reason, m.At.Format("15:04:05.000"))
	}
}

// daemonProcesses are the live reaperd processes and their children (the
// plugins). A plugin whose host is gone is not one of them: it is a
// leftover.
func (s *scenario) daemonProcesses() map[int]bool {
	out := map[int]bool{}
	for _, d := range s.daemons {
		if !d.exited() {
			out[d.pid()] = true
		}
	}
	for _, p := range marked.Processes(markEnv, s.mark) {
		args := strings.Fields(p.Cmdline)
		if len(args) == 0 || filepath.Base(args[0]) == "reaper-agent" {
			continue // an agent is the runner's child, and no plugin
		}
		if info, err := proc.Stat(p.PID); err == nil && out[info.PPID] {
			out[p.PID] = true
		}
	}
	return out
}

// checkAttempts checks each task's end: an attempt not harmed ran exactly
// once, to its end line, and succeeded at try 1 epoch 0; a harmed one was
// re-placed on a new epoch that succeeded.
func (s *scenario) checkAttempts(tis []board.TaskInstance, execs []execution) {
	s.t.Helper()
	byTask := map[string][]execution{}
	for _, e := range execs {
		byTask[e.Task] = append(byTask[e.Task], e)
	}
	for _, ti := range tis {
		harmed := s.harmed[first(ti.TaskID)]
		if ti.State != sdk.StateSuccess {
			s.t.Errorf("%s ended %s (%s %s), want success", ti.Attempt, ti.State, ti.FailureReason, ti.ErrorMessage)
		}
		if ti.Try != 1 {
			s.t.Errorf("%s: try %d, want 1: a retry was spent", ti.Attempt, ti.Try)
		}
		runs := byTask[ti.TaskID]
		if !harmed {
			if ti.Epoch != 0 || ti.InfraUsed != 0 {
				s.t.Errorf("%s was not harmed but was re-placed (epoch %d, infra used %d)", ti.Attempt, ti.Epoch, ti.InfraUsed)
			}
			if len(runs) != 1 || runs[0].End.IsZero() {
				s.t.Errorf("task %s was not harmed but did not run exactly once to its end: %v", ti.TaskID, runs)
			}
			continue
		}
		if ti.Epoch < 1 {
			s.t.Errorf("%s was harmed but not re-placed", ti.Attempt)
		}
	}
}

// falseReaps counts the attempts and runs that a reaper applied a decision
// to without the test having harmed them.
func (s *scenario) falseReaps(ds []decision) int {
	wrong := map[string]bool{}
	for _, d := range ds {
		if !d.Applied || !isReaper(d) {
			continue
		}
		switch {
		case d.Attempt.TaskID == "" && d.Attempt.RunID != "":
			wrong["run "+d.Attempt.RunID] = true
			s.t.Errorf("false reap: %s applied %s to run %s: %s", d.Reaper, d.Label, d.Attempt.RunID, d.Detail)
		case d.Attempt.TaskID != "" && !s.harmed[d.Attempt]:
			wrong[d.Attempt.String()] = true
			s.t.Errorf("false reap: %s applied %s to %s, which was not harmed: %s", d.Reaper, d.Label, d.Attempt, d.Detail)
		}
	}
	return len(wrong)
}

// evaluate judges every fault against its recovery deadline and returns how
// many were recovered in time.
//
// The deadline is the fault's threshold plus one interval, measured from the
// fault to the reaping decision. For an agent fault the threshold is
// agent_lost, and since a reaper acts only once the leader of the reaping
// term has settled, the deadline is max(fault + agent_lost, term gained +
// grace) + interval. A control-plane fault has its own threshold (see
// controlFault) and is judged by the reap of the attempt harmed under or
// after it.
func (s *scenario) evaluate(ds []decision) int {
	s.t.Helper()
	s.leaderNow()
	recovered := 0
	for _, f := range s.faults {
		if f.target == nil {
			s.t.Errorf("fault %q has no attempt to judge its recovery by", f.what)
			continue
		}
		r := reapOf(ds, *f.target)
		if r == nil {
			s.t.Errorf("fault %q: %s was never reaped", f.what, f.target)
			continue
		}
		f.reap = r
		base := f.at.Add(f.threshold)
		if f.agent {
			if gained, ok := s.terms[r.Term]; ok && gained.Add(s.timing.grace).After(base) {
				base = gained.Add(s.timing.grace)
			}
		}
		f.deadline = base.Add(s.timing.interval)
		late := r.At.Sub(f.deadline)
		f.recovered = late <= 0
		if f.recovered {
			recovered++
		}
		verdict := "within the SLA"
		if !f.recovered {
			verdict = "LATE"
		}
		s.t.Logf("fault %q at %s: %s reaped %s after it, deadline %s after it: %s",
			f.what, f.at.Format("15:04:05.000"), f.target, r.At.Sub(f.at).Round(time.Millisecond),
			f.deadline.Sub(f.at).Round(time.Millisecond), verdict)
		// Lateness is a figure up to one more interval of scheduling jitter
		// on a loaded machine; beyond that, recovery is broken.
		if late > s.timing.interval {
			s.t.Errorf("fault %q: recovered %s past its deadline", f.what, late.Round(time.Millisecond))
		}
	}
	return recovered
}

// sweep kills whatever carries the scenario's marker: the machine is left
// as it was found, whatever happened.
func (s *scenario) sweep() {
	for _, d := range s.daemons {
		if !d.exited() {
			d.kill()
		}
	}
	marked.KillAll(markEnv, s.mark)
}

// dump logs what a failed scenario needs to be understood: each reaperd's
// last lines, the board as reaperctl shows it, each task's story, and the
// executions the monitor saw.
func (s *scenario) dump() {
	for _, d := range s.daemons {
		s.t.Logf("%s (pid %d) log tail:\n%s", d.name, d.pid(), d.tail(80))
	}
	cfg := filepath.Join(s.dir, "reaperd-1.hcl")
	if out, err := s.reaperctl(cfg, "status", "-v", runID); err == nil {
		s.t.Logf("reaperctl status -v %s:\n%s", runID, out)
	} else {
		s.t.Logf("reaperctl status: %v", err)
	}
	for _, ts := range s.tasks {
		if out, err := s.reaperctl(cfg, "explain", runID, ts.id); err == nil {
			s.t.Logf("reaperctl explain %s %s:\n%s", runID, ts.id, out)
		}
	}
	var b strings.Builder
	for _, e := range s.mon.executions(s.taskDir) {
		b.WriteString(e.String())
		b.WriteByte('\n')
	}
	s.t.Logf("executions:\n%s", b.String())
	for _, p := range marked.Processes(markEnv, s.mark) {
		s.t.Logf("still running: pid %d %s", p.PID, p.Cmdline)
	}
}

// waitAnyLeader waits until one of the scenario's live replicas holds the
// lease, and returns the lease and the replica.
func (s *scenario) waitAnyLeader(bound time.Duration) (board.Lease, *daemon) {
	s.t.Helper()
	var (
		l     board.Lease
		found *daemon
	)
	s.eventually(bound, "a replica to lead", func() bool {
		var ok bool
		if l, ok = s.leaderNow(); !ok || !l.Held(time.Now()) {
			return false
		}
		for _, d := range s.daemons {
			if !d.exited() && d.holds(l.Holder) {
				found = d
				return true
			}
		}
		return false
	})
	return l, found
}

// leaderless follows, one sample at a time, whether the board's lease is
// held, and keeps the longest stretch without a holder (from the first
// sample that found none to the first that found one again).
type leaderless struct {
	since   time.Time // zero while held
	longest time.Duration
}

// sample reads the lease once; an unreadable board counts as leaderless.
func (g *leaderless) sample(s *scenario) {
	now := time.Now()
	l, ok := s.leaderNow()
	switch held := ok && l.Held(now); {
	case !held && g.since.IsZero():
		g.since = now
	case held && !g.since.IsZero():
		g.longest = max(g.longest, now.Sub(g.since))
		g.since = time.Time{}
	}
}

// checkAppliedKept checks that every decision a replica logged as applied
// to an attempt (reaperd logs one once the board has applied its write)
// is in the board's audit, applied: nothing the board acknowledged was
// lost, whatever became of the server that acknowledged it.
func (s *scenario) checkAppliedKept() int {
	s.t.Helper()
	ds, err := s.decisions("")
	if err != nil {
		s.t.Fatal(err)
	}
	type key struct{ reaper, label, task string }
	audited := map[key]bool{}
	for _, d := range ds {
		if d.Applied {
			audited[key{d.Reaper, d.Label, d.Attempt.TaskID}] = true
		}
	}
	n := 0
	for _, d := range s.daemons {
		for _, l := range d.lines() {
			if l.ev.Message != "decision" || !l.ev.Applied || l.ev.Task == "" {
				continue
			}
			n++
			if !audited[key{l.ev.Reaper, l.ev.Decision, l.ev.Task}] {
				s.t.Errorf("%s reported %s applied by %s to %s (term %d) at %s; the board's audit has no such applied decision",
					d.name, l.ev.Decision, l.ev.Reaper, l.ev.Task, l.ev.Term, l.at.Format("15:04:05.000"))
			}
		}
	}
	return n
}

package reapers_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sys/unix"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/host/config"
	"github.com/dexaflow/reaper/host/cycle"
	"github.com/dexaflow/reaper/host/daemon"
	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/runner/literunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/substrate/lite/proc"
	"github.com/dexaflow/reaper/substrate/lite/records"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// hostConfig is the configuration every integration test boots the host
// from: the Lite edition with the specification's ladder (interval 30s,
// settling grace 180s, agent_lost 90s, dispatch_lost 3m, orphan_run 5m,
// credential ceiling 1h) and the reapers a test names. Only the clock is
// fake, so the real values cost nothing; the lease outlasts any test.
const hostConfig = `edition    = "lite"
plugin_dir = %q

store {
  dsn = %q
}

maintenance {
  interval = "30s"
}

leader "postgres" {
  lease = "24h"
}

attempt_api {
  listen = "127.0.0.1:0"
}

substrate "lite" {
  record_dir = %q
  stop_grace = "5s"
  kill_wait  = "5s"
}

%s
`

// unreachable mints credentials for an attempt API nobody listens on: an
// agent given one keeps retrying its RUNNING report and never starts its
// task.
func unreachable(t *testing.T) attempttoken.Issuer {
	t.Helper()
	kr, err := attempttoken.NewKeyring(attempttoken.Key{ID: "nowhere", Secret: bytes.Repeat([]byte("n"), 32)})
	if err != nil {
		t.Fatal(err)
	}
	return attempttoken.Issuer{Keys: func() *attempttoken.Keyring { return kr }, TTL: time.Hour, API: "https://127.0.0.1:1"}
}

// taskCommand is what the tests' agents run: a task that lives until it is
// stopped, and that leaves a file named after its task id in $WORK when it
// receives SIGTERM, taking a moment to exit after it (so a mark made before
// its group is gone would be seen while it still runs). Once its trap is
// set it leaves a file named after its attempt (readyFile): a SIGTERM
// before that would end the shell without the file.
const taskCommand = `trap 'touch "$WORK/$REAPER_TASK_ID.term"; sleep 0.3; exit 0' TERM; ` +
	`touch "$WORK/$REAPER_RUN_ID.$REAPER_TASK_ID.$REAPER_TRY.$REAPER_EPOCH.ready"; sleep 1000 & wait`

// readyFile is where taskCommand says, for attempt a, that its trap is set.
func readyFile(work string, a sdk.Attempt) string {
	return filepath.Join(work, fmt.Sprintf("%s.%s.%d.%d.ready", a.RunID, a.TaskID, a.Try, a.Epoch))
}

// world is one test's Lite deployment: a fresh board, a record directory and
// a spawner of real agents, and the host itself — reaperd's own daemon
// (package host/daemon) built from a parsed configuration: the real plugin
// binaries under their supervisors, the elector and the maintenance loop —
// driven one cycle at a time on a fake clock, under a leadership term its
// elector really acquired on the board.
type world struct {
	t       *testing.T
	ctx     context.Context
	dsn     string
	api     attempttoken.Issuer // the attempt API over this world's board
	pool    *pgxpool.Pool
	store   *board.Store
	w       *lifecycle.Writer
	dir     *records.Dir
	spawner *literunner.Spawner
	work    string // the tasks' scratch directory ($WORK)
	clock   *clock.Fake
	t0      time.Time // the fake time of the first cycle; leadership began then
	term    int64
	host    *daemon.Daemon
	logs    *lockedBuffer
}

func newWorld(t *testing.T, reaperBlocks string) *world {
	t.Helper()
	ctx := context.Background()
	w := &world{t: t, ctx: ctx, logs: &lockedBuffer{}, work: t.TempDir()}
	w.dsn = pgtest.NewDSN(t)
	pool, err := pgxpool.New(ctx, w.dsn)
	if err != nil {
		t.Fatalf("connect to the board: %v", err)
	}
	t.Cleanup(pool.Close)
	w.pool = pool
	w.store = board.New(pool, board.Options{})
	w.w = lifecycle.New(pool, lifecycle.Options{})
	w.api = attemptapitest.Start(t, w.w, attemptapitest.Options{}).Issuer

	// The fake clock starts at the wall clock's second, so the times the
	// agents write themselves are near the scenario's.
	w.t0 = time.Now().UTC().Truncate(time.Second)
	w.clock = clock.NewFake(w.t0)

	recordDir := filepath.Join(t.TempDir(), "records")
	if w.dir, err = records.Open(recordDir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.dir.Close() })
	w.spawner, err = literunner.NewSpawner(literunner.SpawnerConfig{
		AgentPath: filepath.Join(binDir, literunner.AgentBinary), Records: w.dir, LogDir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}

	src := fmt.Sprintf(hostConfig, binDir, w.dsn, recordDir, reaperBlocks)
	cfg, err := config.Parse(filepath.Join(t.TempDir(), "reaper.hcl"), []byte(src),
		config.Options{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatalf("parse the configuration: %v", err)
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "host", Output: w.logs, Level: hclog.Debug})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("host and plugin log:\n%s", w.logs.String())
		}
	})
	w.host, err = daemon.New(ctx, cfg, daemon.Options{Clock: w.clock, Logger: logger})
	if err != nil {
		t.Fatalf("start the host: %v", err)
	}
	t.Cleanup(w.host.Close)
	st := w.host.Campaign(ctx)
	if !st.Leading {
		t.Fatalf("the host did not gain leadership: %+v", st)
	}
	w.term = st.Term
	return w
}

// runCycle runs one maintenance cycle at the fake clock's time.
func (w *world) runCycle() cycle.Result {
	w.t.Helper()
	res := w.host.RunCycle(w.ctx)
	if !res.Leading {
		w.t.Fatalf("cycle at %s: not leading", res.Started)
	}
	return res
}

// advance moves the fake clock.
func (w *world) advance(d time.Duration) { w.clock.Advance(d) }

// now is the fake clock's time.
func (w *world) now() time.Time { return w.clock.Now() }

// --- rows -----------------------------------------------------------------

// createRun creates a running run, started at startedAt, with one Lite task
// instance per id (retries 1, so a retry rail can be taken).
func (w *world) createRun(runID string, startedAt time.Time, taskIDs ...string) {
	w.t.Helper()
	createRunOn(w.t, w.w, runID, startedAt, taskIDs...)
}

func createRunOn(t *testing.T, wr *lifecycle.Writer, runID string, startedAt time.Time, taskIDs ...string) {
	t.Helper()
	r := lifecycle.NewRun{RunID: runID, DagID: "dag_" + runID, State: sdk.RunRunning}
	for _, id := range taskIDs {
		r.Tasks = append(r.Tasks, lifecycle.NewTask{TaskID: id, Executor: sdk.ExecutorLite, Retries: 1,
			Command: taskCommand})
	}
	if err := wr.CreateRun(context.Background(), r, startedAt); err != nil {
		t.Fatal(err)
	}
}

// first is the first attempt of a task instance.
func first(runID, taskID string) sdk.Attempt {
	return sdk.Attempt{RunID: runID, TaskID: taskID, Try: 1, Epoch: 0}
}

// queue drives a fresh attempt to queued, queued at at, as the dispatcher
// does.
func (w *world) queue(a sdk.Attempt, at time.Time) {
	w.t.Helper()
	queueOn(w.t, w.w, a, at)
}

func queueOn(t *testing.T, wr *lifecycle.Writer, a sdk.Attempt, at time.Time) {
	t.Helper()
	ctx := context.Background()
	if ok, err := wr.Enqueue(ctx, a, at); err != nil || !ok {
		t.Fatalf("enqueue %s: ok=%v err=%v", a, ok, err)
	}
	if ok, err := wr.Queue(ctx, a, at); err != nil || !ok {
		t.Fatalf("queue %s: ok=%v err=%v", a, ok, err)
	}
}

// stamps are an attempt's timestamps as a scenario wants them; nil is NULL.
type stamps struct {
	queued, running, heartbeat, ended *time.Time
}

func at(t time.Time) *time.Time { return &t }

// stamp overwrites the attempt's timestamps. The agents stamp the wall
// clock's time as they go; the scenario then places each attempt where it
// needs it relative to the fake clock.
func (w *world) stamp(a sdk.Attempt, s stamps) {
	w.t.Helper()
	tag, err := w.pool.Exec(w.ctx, `UPDATE task_instances
        SET queued_at = $5, running_at = $6, last_heartbeat_at = $7, ended_at = $8
        WHERE run_id = $1 AND task_id = $2 AND try_number = $3 AND attempt_epoch = $4`,
		a.RunID, a.TaskID, a.Try, a.Epoch, s.queued, s.running, s.heartbeat, s.ended)
	if err != nil || tag.RowsAffected() != 1 {
		w.t.Fatalf("stamp %s: %v (%d rows)", a, err, tag.RowsAffected())
	}
}

// beat records a heartbeat of the attempt at the given time through the
// same guarded writer the agents use, and reports whether it was answered
// should_terminate.
func (w *world) beat(a sdk.Attempt, when time.Time) bool {
	w.t.Helper()
	stop, err := w.w.Heartbeat(w.ctx, a, when)
	if err != nil {
		w.t.Fatal(err)
	}
	return stop
}

func (w *world) ti(a sdk.Attempt) board.TaskInstance {
	w.t.Helper()
	ti, err := w.store.TaskInstance(w.ctx, a.RunID, a.TaskID)
	if err != nil {
		w.t.Fatal(err)
	}
	return normal(ti)
}

func (w *world) run(runID string) board.Run {
	w.t.Helper()
	r, err := w.store.Run(w.ctx, runID)
	if err != nil {
		w.t.Fatal(err)
	}
	r.StartedAt, r.EndedAt, r.UpdatedAt = r.StartedAt.UTC(), r.EndedAt.UTC(), r.UpdatedAt.UTC()
	return r
}

// normal puts every time of a row in UTC so rows read at different moments
// compare equal when nothing changed.
func normal(ti board.TaskInstance) board.TaskInstance {
	for _, p := range []*time.Time{&ti.QueuedAt, &ti.RunningAt, &ti.LastHeartbeatAt, &ti.ReleasedAt, &ti.EndedAt,
		&ti.InfraMarkedAt, &ti.InfraConfirmedAt, &ti.DispatchUnavailableSince, &ti.HeldAt, &ti.UpdatedAt} {
		*p = p.UTC()
	}
	return ti
}

// settled is the part of a row a reap decides.
type settled struct {
	State, Kind, Reason            string
	Marked, Confirmed, Held, Ended time.Time
}

func settledOf(ti board.TaskInstance) settled {
	return settled{State: ti.State, Kind: ti.LastFailureKind, Reason: ti.FailureReason,
		Marked: ti.InfraMarkedAt, Confirmed: ti.InfraConfirmedAt, Held: ti.HeldAt, Ended: ti.EndedAt}
}

func (s settled) String() string {
	f := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.Format("15:04:05")
	}
	return fmt.Sprintf("state=%s kind=%q reason=%q marked=%s confirmed=%s held=%s ended=%s",
		s.State, s.Kind, s.Reason, f(s.Marked), f(s.Confirmed), f(s.Held), f(s.Ended))
}

// expectSettled fails t unless the attempt's row is exactly want.
func (w *world) expectSettled(t *testing.T, a sdk.Attempt, want settled) {
	t.Helper()
	if got := settledOf(w.ti(a)); got != want {
		t.Errorf("%s:\n got  %s\n want %s", a.TaskID, got, want)
	}
}

// infraMark is the row of an attempt a Lite reaper failed on the infra
// rail at at: confirmed as made, held when the policy holds.
func infraMark(reason string, when time.Time, held bool) settled {
	s := settled{State: sdk.StateFailed, Kind: sdk.FailureInfra, Reason: reason, Marked: when, Confirmed: when, Ended: when}
	if held {
		s.Held = when
	}
	return s
}

// taskFailure is the row of an attempt failed as a task failure at at.
func taskFailure(reason string, when time.Time) settled {
	return settled{State: sdk.StateFailed, Kind: sdk.FailureTask, Reason: reason, Ended: when}
}

// expectUntouched fails t unless the row is exactly as it was.
func (w *world) expectUntouched(t *testing.T, before board.TaskInstance) {
	t.Helper()
	if after := w.ti(before.Attempt); after != before {
		t.Errorf("%s was written:\n before %+v\n after  %+v", before.TaskID, before, after)
	}
}

// expectStaleReportsRefused checks what the old agent of a reaped attempt
// is told: its RUNNING, heartbeat and terminal report are each answered
// should_terminate, and none of them changes the row.
func (w *world) expectStaleReportsRefused(t *testing.T, a sdk.Attempt) {
	t.Helper()
	before := w.ti(a)
	when := w.now()
	running, err := w.w.Running(w.ctx, a, when)
	if err != nil {
		t.Fatal(err)
	}
	beat, err := w.w.Heartbeat(w.ctx, a, when)
	if err != nil {
		t.Fatal(err)
	}
	report, err := w.w.Report(w.ctx, a, lifecycle.TerminalReport{State: sdk.StateSuccess}, when)
	if err != nil {
		t.Fatal(err)
	}
	if !running || !beat || !report {
		t.Errorf("%s: stale RUNNING/heartbeat/report answered should_terminate = %v/%v/%v; want all true",
			a.TaskID, running, beat, report)
	}
	w.expectUntouched(t, before)
}

// --- decisions ------------------------------------------------------------

// Evidence keys the assertions read (the reapers' shared kit is internal to
// plugins/, so its constants are spelled out here).
const (
	evLiveness   = "liveness"
	evSignal     = "signal"
	evStop       = "stop"
	evOrphan     = "orphan"
	evNoopReason = "noop_reason"
	evAttached   = "attached"
	evPolicy     = "policy"
)

// verdict is a decision as the assertions compare it.
type verdict struct {
	Reaper, Label string
	Subject       string // the task id, or the run id of a run-level decision
	Applied       bool
}

func (v verdict) String() string {
	return fmt.Sprintf("%s/%s/%s applied=%v", v.Reaper, v.Label, v.Subject, v.Applied)
}

func subject(a sdk.Attempt) string {
	if a.TaskID != "" {
		return a.TaskID
	}
	return a.RunID
}

func verdictsOf(ds []sdk.Decision) []verdict {
	out := make([]verdict, 0, len(ds))
	for _, d := range ds {
		out = append(out, verdict{Reaper: d.Reaper, Label: d.Label, Subject: subject(d.Attempt), Applied: d.Applied})
	}
	return sorted(out)
}

func sorted(vs []verdict) []verdict {
	slices.SortFunc(vs, func(a, b verdict) int { return strings.Compare(a.String(), b.String()) })
	return vs
}

// audited reads the audit rows stamped at the given cycle time.
func (w *world) audited(t *testing.T, when time.Time) []verdict {
	t.Helper()
	rows, err := w.pool.Query(w.ctx, `SELECT reaper, label, coalesce(task_id, coalesce(run_id, '')), applied, term
        FROM reap_decisions WHERE at = $1 ORDER BY id`, when)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []verdict
	for rows.Next() {
		var (
			v    verdict
			term int64
		)
		if err := rows.Scan(&v.Reaper, &v.Label, &v.Subject, &v.Applied, &term); err != nil {
			t.Fatal(err)
		}
		if term != w.term {
			t.Errorf("decision %s audited under term %d, want %d", v, term, w.term)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return sorted(out)
}

// expectVerdicts fails t unless got and want hold the same decisions.
func expectVerdicts(t *testing.T, what string, got, want []verdict) {
	t.Helper()
	want = sorted(slices.Clone(want))
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n got  %v\n want %v", what, got, want)
	}
}

// expectCycle checks one cycle's decisions, as returned by the loop and as
// audited on the board.
func (w *world) expectCycle(t *testing.T, name string, res cycle.Result, want ...verdict) {
	t.Helper()
	expectVerdicts(t, name+": decisions returned", verdictsOf(res.Decisions), want)
	expectVerdicts(t, name+": decisions audited", w.audited(t, res.Started), want)
}

// expectGateOpened checks the leader-settling gate of a reaper's first
// two cycles: it held the first (c1), deciding reap_settling_skip only,
// and let the second (c2) through, started at open.
func (w *world) expectGateOpened(t *testing.T, c1, c2 cycle.Result, open time.Time) {
	t.Helper()
	w.expectCycle(t, "first cycle", c1, verdict{"gate", sdk.LabelSettlingSkip, "", false})
	if !c2.Started.Equal(open) || !c2.Gate.Open {
		t.Errorf("second cycle at %s: gate %+v; want open at %s", c2.Started, c2.Gate, open)
	}
}

// metered reads dexaflow_scheduler_decisions_total: the count of each
// decision type counted at least once (dry_run="false").
func (w *world) metered(t *testing.T) map[string]int {
	t.Helper()
	mfs, err := w.host.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, mf := range mfs {
		if mf.GetName() != "dexaflow_scheduler_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if n := int(m.GetCounter().GetValue()); n > 0 && labels["dry_run"] == "false" {
				out[labels["decision_type"]] = n
			}
		}
	}
	return out
}

// decisionOf returns the only decision with the label about the subject.
func decisionOf(t *testing.T, res cycle.Result, label, subj string) sdk.Decision {
	t.Helper()
	var found []sdk.Decision
	for _, d := range res.Decisions {
		if d.Label == label && subject(d.Attempt) == subj {
			found = append(found, d)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d decisions %s about %s, want 1", len(found), label, subj)
	}
	return found[0]
}

// --- agents ---------------------------------------------------------------

// agentProc is one real reaper-agent and, once recorded, its task's group.
type agentProc struct {
	a           sdk.Attempt
	pid         int
	log         string
	exited      chan struct{} // closed once the agent has exited and been reaped
	pgid        int           // 0 until the task's group is recorded
	leaderStart uint64
	traps       bool // runs taskCommand: awaitTask also waits for its trap
}

// spawn starts a real agent for the attempt, reporting to the attempt API
// the issuer names (w.api: this world's board) with a credential it mints,
// running taskCommand with heartbeats an hour apart: the scenario writes
// every timestamp the reapers judge by itself. The agent and its task group
// are killed when the test ends.
func (w *world) spawn(a sdk.Attempt, to attempttoken.Issuer) *agentProc {
	w.t.Helper()
	p := w.spawnCommand(a, to, taskCommand)
	p.traps = true
	return p
}

func (w *world) spawnCommand(a sdk.Attempt, to attempttoken.Issuer, command string) *agentProc {
	w.t.Helper()
	return w.spawnWith(a, to, command, 0)
}

// spawnWith is spawnCommand with the agent's pre-start retry bounded by
// startRetry (0: the agent's default).
func (w *world) spawnWith(a sdk.Attempt, to attempttoken.Issuer, command string, startRetry time.Duration) *agentProc {
	w.t.Helper()
	cred, err := to.Mint(a, time.Now())
	if err != nil {
		w.t.Fatal(err)
	}
	ag, err := w.spawner.Spawn(w.ctx, literunner.SpawnRequest{
		Invocation: agent.Invocation{
			Attempt:    a,
			Command:    command,
			Reporter:   agent.ReporterAPI,
			Heartbeat:  time.Hour,
			StartRetry: startRetry,
			LogLevel:   "debug",
		},
		Env: append(cred.Env, "WORK="+w.work),
	})
	if err != nil {
		w.t.Fatal(err)
	}
	p := &agentProc{a: a, pid: ag.PID, log: ag.Log, exited: make(chan struct{})}
	go func() { // the test is the agent's parent: reap it when it exits
		defer close(p.exited)
		_, _ = ag.Wait()
	}()
	w.t.Cleanup(func() {
		if p.groupVerified() {
			_, _ = proc.SignalGroup(p.pgid, unix.SIGKILL)
		}
		select {
		case <-p.exited:
		default:
			_, _ = proc.Signal(p.pid, unix.SIGKILL)
			<-p.exited
		}
		if w.t.Failed() {
			logs, _ := os.ReadFile(p.log)
			w.t.Logf("agent %s (pid %d) log:\n%s", a.TaskID, p.pid, logs)
		}
	})
	return p
}

// awaitTask waits, bounded, until the agent has reported RUNNING and
// recorded its task's group.
func (w *world) awaitTask(p *agentProc) {
	w.t.Helper()
	var rec records.GroupRecord
	eventually(w.t, "the task group of "+p.a.TaskID, func() bool {
		var err error
		rec, err = w.dir.ReadGroup(p.a)
		return err == nil
	})
	p.pgid, p.leaderStart = rec.PGID, rec.LeaderStart
	if p.traps {
		eventually(w.t, "the SIGTERM trap of "+p.a.TaskID, func() bool {
			_, err := os.Stat(readyFile(w.work, p.a))
			return err == nil
		})
	}
}

// killAgent kills the agent alone with SIGKILL and waits until it is gone.
// Its task group, if it has one, runs on as an orphan.
func (w *world) killAgent(p *agentProc) {
	w.t.Helper()
	if err := unix.Kill(p.pid, unix.SIGKILL); err != nil {
		w.t.Fatalf("kill agent %d: %v", p.pid, err)
	}
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		w.t.Fatalf("agent %d outlived SIGKILL", p.pid)
	}
}

// killGroup kills the task's whole group with SIGKILL and waits until no
// process of it runs.
func (w *world) killGroup(p *agentProc) {
	w.t.Helper()
	if _, err := proc.SignalGroup(p.pgid, unix.SIGKILL); err != nil {
		w.t.Fatal(err)
	}
	eventually(w.t, "the group of "+p.a.TaskID+" to exit", func() bool { return !p.groupRunning(w.t) })
}

// groupRunning reports whether any process of the recorded group runs.
func (p *agentProc) groupRunning(t *testing.T) bool {
	t.Helper()
	running, err := proc.GroupRunning(p.pgid)
	if err != nil {
		t.Fatal(err)
	}
	return running
}

// groupVerified reports whether the recorded leader still leads its group,
// the only case the test's clean-up signals it (a group id can be reused
// once the group is gone).
func (p *agentProc) groupVerified() bool {
	if p.pgid == 0 {
		return false
	}
	info, err := proc.Stat(p.pgid)
	return err == nil && !info.Zombie && info.Start == p.leaderStart && info.PGID == p.pgid
}

func (p *agentProc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stopSignalled reports whether the task received SIGTERM (its trap left a
// file behind).
func (w *world) stopSignalled(p *agentProc) bool {
	_, err := os.Stat(filepath.Join(w.work, p.a.TaskID+".term"))
	return err == nil
}

// markWatch watches an attempt's row while a cycle runs and notes, the
// moment it first sees the row leave its state, whether the attempt's task
// group still ran then.
type markWatch struct {
	done        chan struct{}
	cancel      context.CancelFunc
	sawMark     bool
	groupAtMark bool
	watchErr    error
}

func (w *world) watchMark(p *agentProc, state string) *markWatch {
	ctx, cancel := context.WithCancel(w.ctx)
	m := &markWatch{done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(m.done)
		for ctx.Err() == nil {
			var st string
			err := w.pool.QueryRow(ctx, `SELECT state FROM task_instances WHERE run_id = $1 AND task_id = $2`,
				p.a.RunID, p.a.TaskID).Scan(&st)
			if err != nil {
				if ctx.Err() == nil {
					m.watchErr = err
				}
				return
			}
			if st != state {
				m.sawMark = true
				m.groupAtMark, m.watchErr = proc.GroupRunning(p.pgid)
				return
			}
			time.Sleep(time.Millisecond) // polling the board, not waiting for a threshold
		}
	}()
	return m
}

// stop waits, bounded, for the watch to see the row move (a pass that
// marked has moved it by the time it returns, but the watch may not have
// looked since), then ends it.
func (m *markWatch) stop() {
	select {
	case <-m.done:
	case <-time.After(5 * time.Second):
	}
	m.cancel()
	<-m.done
}

// eventually polls cond until it holds or a bound far beyond what real
// processes need passes. It waits for processes and files, never for a
// threshold: the clock is fake.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
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

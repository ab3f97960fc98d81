package cycle_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	pgboard "github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	hostaudit "github.com/dexaflow/reaper/host/audit"
	"github.com/dexaflow/reaper/host/cycle"
	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/host/loader"
	"github.com/dexaflow/reaper/host/metrics"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/testkit/byhand"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// pluginDir holds the test reaper plugin, built once for this package.
var pluginDir string

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "reaper-cycle-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	pluginDir = dir
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "reaper-marker"), "../loader/testdata/testreaper")
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build test plugin:", err)
		return 1
	}
	return pgtest.Run(m)
}

// world is a real board (PostgreSQL) with one running attempt whose agent
// went silent, the loop over it leading and settled, and one reaper: the
// test plugin, a real process over go-plugin, in the mode given.
type world struct {
	clock   *clock.Fake
	store   *pgboard.Store
	exec    *blockingExec
	loop    *cycle.Loop
	attempt sdk.Attempt
	since   time.Time
	term    int64
	lead    *byhand.Lead
	reaper  sdk.Reaper
	lw      *lifecycle.Writer
	metrics *metrics.Metrics
	info    sdk.Info // the plugin's, as launched
}

// blockingExec answers every attempt dead, and holds each teardown until
// the call's context ends (a teardown slower than the pass's share).
type blockingExec struct {
	*substrate
	tearing chan sdk.Attempt
	// sweep, when set, is the reconcile sweep.
	sweep func(ctx context.Context, req sdk.SweepRequest, board sdk.Board) (sdk.SweepResult, error)
}

func (e *blockingExec) Sweep(ctx context.Context, req sdk.SweepRequest, board sdk.Board) (sdk.SweepResult, error) {
	if e.sweep != nil {
		return e.sweep(ctx, req, board)
	}
	return e.substrate.Sweep(ctx, req, board)
}

func (e *blockingExec) Liveness(_ context.Context, req sdk.LivenessRequest) ([]sdk.AttemptLiveness, error) {
	out := make([]sdk.AttemptLiveness, len(req.Attempts))
	for i, a := range req.Attempts {
		out[i] = sdk.AttemptLiveness{Attempt: a, State: sdk.Dead}
	}
	return out, nil
}

func (e *blockingExec) Teardown(ctx context.Context, req sdk.TeardownRequest) ([]sdk.TeardownOutcome, error) {
	e.tearing <- *req.Attempt
	<-ctx.Done()
	return nil, ctx.Err()
}

func newWorld(t *testing.T, mode string, auditor func(*pgboard.Store) cycle.Auditor) *world {
	t.Helper()
	ctx := context.Background()
	w := &world{clock: clock.NewFake(t0), since: t0.Add(-time.Hour)}
	pool := pgtest.NewDB(t)
	w.store = pgboard.New(pool, pgboard.Options{})
	lease, ok, err := w.store.TryAcquire(ctx, "test", time.Hour, t0.Add(-time.Minute))
	if err != nil || !ok {
		t.Fatalf("acquire leadership: ok=%v err=%v", ok, err)
	}
	lw := lifecycle.New(pool, lifecycle.Options{})
	if err := lw.CreateRun(ctx, lifecycle.NewRun{RunID: "run", DagID: "dag", State: sdk.RunRunning,
		Tasks: []lifecycle.NewTask{{TaskID: "task", Executor: sdk.ExecutorLite}}}, t0.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	w.term, w.lw = lease.Term, lw
	w.attempt = sdk.Attempt{RunID: "run", TaskID: "task", Try: 1}
	for _, step := range []func() (bool, error){
		func() (bool, error) { return lw.Enqueue(ctx, w.attempt, t0.Add(-11*time.Minute)) },
		func() (bool, error) { return lw.Queue(ctx, w.attempt, t0.Add(-11*time.Minute)) },
		func() (bool, error) {
			stop, err := lw.Running(ctx, w.attempt, t0.Add(-10*time.Minute))
			return !stop, err
		},
		func() (bool, error) {
			stop, err := lw.Heartbeat(ctx, w.attempt, t0.Add(-5*time.Minute))
			return !stop, err
		},
	} {
		if ok, err := step(); err != nil || !ok {
			t.Fatalf("drive the attempt to running: ok=%v err=%v", ok, err)
		}
	}

	ld := &loader.Loader{Dir: pluginDir, Logger: hclog.NewNullLogger()}
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	p, err := ld.Launch(lctx, loader.Spec{Kind: sdk.KindReaper, Name: "marker"})
	if err != nil {
		t.Fatalf("launch: %v", err)
	}
	t.Cleanup(p.Kill)
	if err := p.Base().Configure(lctx, sdk.ConfigureRequest{Edition: ladder.EditionLite,
		Values: sdk.Values{"mode": mode}, Ladder: ladder.Defaults()}); err != nil {
		t.Fatalf("configure: %v", err)
	}

	w.exec = &blockingExec{substrate: &substrate{synced: true}, tearing: make(chan sdk.Attempt, 1)}
	var aud cycle.Auditor = w.store
	if auditor != nil {
		aud = auditor(w.store)
	}
	lead := byhand.NewLead(leader.Status{Leading: true, Term: lease.Term, Since: t0.Add(-ladder.Defaults().SettlingGrace)})
	w.lead, w.reaper, w.metrics, w.info = lead, p.Reaper(), metrics.New(), p.Info
	w.loop = cycle.New(cycle.Config{Ladder: ladder.Defaults(), Edition: ladder.EditionLite, Clock: w.clock, Metrics: w.metrics},
		lead, w.store, aud, &byhand.Static[sdk.Substrate]{V: w.exec},
		[]cycle.Reaper{{Name: "agentlost", Plugin: &byhand.Static[sdk.Reaper]{V: p.Reaper()}, MarkReasons: p.Info.MarkReasons,
			Labels: p.Info.DecisionLabels}})
	return w
}

// marked asserts the attempt was marked on the board.
func (w *world) marked(t *testing.T) {
	t.Helper()
	ti, err := w.store.TaskInstance(context.Background(), "run", "task")
	if err != nil {
		t.Fatal(err)
	}
	if ti.State != sdk.StateFailed || ti.FailureReason != sdk.LabelAgentLost {
		t.Fatalf("the attempt was not marked: %s, %q", ti.State, ti.FailureReason)
	}
}

// audited asserts the rule: no applied mark on the board without its
// decision; and that the attempt's decision says how it was audited.
func (w *world) audited(t *testing.T, recovered string) {
	t.Helper()
	ctx := context.Background()
	if lost, err := w.store.UnauditedMarks(ctx, w.since); err != nil || len(lost) != 0 {
		t.Fatalf("marks on the board without their decision: %v (err %v)", lost, err)
	}
	recs, err := w.store.DecisionsFor(ctx, "run", "task", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Applied && r.Label == sdk.LabelAgentLost && r.Attempt == w.attempt {
			if r.Evidence[hostaudit.EvRecovered] != recovered || r.Reaper != "agentlost" {
				t.Fatalf("decision %+v: recovered by %q, want %q", r, r.Evidence[hostaudit.EvRecovered], recovered)
			}
			return
		}
	}
	t.Fatalf("no applied agent_lost decision about %s in the audit: %+v", w.attempt, recs)
}

// Every applied mark has its decision audited, however the pass that made
// it ended: the host keeps what its board applied for the pass and audits
// any write whose decision never reached it.
func TestAppliedMarkIsAlwaysAudited(t *testing.T) {
	t.Parallel()

	t.Run("PassCutByItsBudgetAfterItsMark", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t, "mark_teardown", nil)
		done := make(chan cycle.Result)
		go func() { done <- w.loop.RunOnce(context.Background()) }()
		<-w.exec.tearing // marked; its decision waits for the teardown
		w.clock.Advance(ladder.Defaults().MaintenanceInterval)
		res := <-done
		if len(res.Overruns) == 0 {
			t.Fatalf("the pass was not cut: %+v", res)
		}
		w.marked(t)
		w.audited(t, "host")
	})

	t.Run("LoopStoppedAfterTheMark", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t, "mark_teardown", nil)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan cycle.Result)
		go func() { done <- w.loop.RunOnce(ctx) }()
		<-w.exec.tearing
		cancel() // shutdown, or the leadership deposed
		<-done
		w.marked(t)
		w.audited(t, "host")
	})

	t.Run("PluginDiesBetweenItsMarksAndItsDecisions", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t, "mark_crash", nil)
		res := w.loop.RunOnce(context.Background())
		if len(res.Reaped) != 0 {
			t.Fatalf("a crashed pass reported as done: %+v", res)
		}
		w.marked(t)
		w.audited(t, "host")
	})

	t.Run("PassThatRecordsItsDecisionIsNotAuditedTwice", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t, "normal", nil)
		res := w.loop.RunOnce(context.Background())
		if len(res.Reaped) != 1 {
			t.Fatalf("the pass did not complete: %+v", res)
		}
		w.marked(t)
		w.audited(t, "")
		recs, err := w.store.DecisionsFor(context.Background(), "run", "task", 0)
		if err != nil || len(recs) != 1 {
			t.Fatalf("audit %+v (err %v), want the pass's one decision", recs, err)
		}
	})
}

// flaky is the audit failing its first writes (the database briefly out of
// reach): failing says how many more fail.
type flaky struct {
	cycle.Auditor
	mu      sync.Mutex
	failing int
}

func (f *flaky) RecordDecisions(ctx context.Context, term int64, at time.Time, ds []sdk.Decision) error {
	f.mu.Lock()
	fail := f.failing > 0
	f.failing--
	f.mu.Unlock()
	if fail {
		return errors.New("connection refused")
	}
	return f.Auditor.RecordDecisions(ctx, term, at, ds)
}

// A decision whose audit write failed is kept and written at the next
// cycle, once, in its pass's term and time: an audit error loses nothing.
func TestAuditWriteErrorIsRetriedNextCycle(t *testing.T) {
	t.Parallel()
	var aud *flaky
	w := newWorld(t, "normal", func(s *pgboard.Store) cycle.Auditor {
		aud = &flaky{Auditor: s, failing: 1}
		return aud
	})
	if res := w.loop.RunOnce(context.Background()); len(res.Reaped) != 1 {
		t.Fatalf("the pass did not complete: %+v", res)
	}
	w.marked(t)
	if lost, err := w.store.UnauditedMarks(context.Background(), w.since); err != nil || len(lost) != 1 {
		t.Fatalf("unaudited after the failed write: %v (err %v), want the mark", lost, err)
	}
	w.clock.Advance(ladder.Defaults().MaintenanceInterval)
	w.loop.RunOnce(context.Background())
	w.audited(t, "")
	recs, err := w.store.DecisionsFor(context.Background(), "run", "task", 0)
	if err != nil || len(recs) != 1 || !recs[0].At.Equal(t0) {
		t.Fatalf("audit %+v (err %v), want the pass's one decision, at the pass's time", recs, err)
	}
}

// The sweep's writes are audited however the sweep ends: one cut off by the
// reconcile budget after it confirmed an infra mark returns no result, and
// the host audits the confirmation from its ledger.
func TestAppliedSweepWriteIsAlwaysAudited(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t, "normal", nil)
	// A provisional infra mark, audited as it should be.
	m := sdk.Mark{Attempt: w.attempt, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
		Reason: sdk.LabelAgentLost, Message: "agent_lost: silent", Term: w.term, At: t0.Add(-time.Minute)}
	if res, err := w.store.Mark(ctx, []sdk.Mark{m}); err != nil || !res[0].Applied {
		t.Fatalf("mark: %+v %v", res, err)
	}
	if err := w.store.RecordDecisions(ctx, w.term, m.At, []sdk.Decision{{Reaper: "agentlost",
		Label: sdk.LabelAgentLost, Attempt: w.attempt, Applied: true}}); err != nil {
		t.Fatal(err)
	}
	confirmed := make(chan struct{})
	w.exec.sweep = func(ctx context.Context, req sdk.SweepRequest, board sdk.Board) (sdk.SweepResult, error) {
		res, err := board.ConfirmInfra(ctx, []sdk.Confirm{{Attempt: w.attempt, Term: req.Term, At: req.Now}})
		if err != nil || !res[0].Applied {
			return sdk.SweepResult{}, fmt.Errorf("confirm: %+v %v", res, err)
		}
		close(confirmed)
		<-ctx.Done() // more pods to settle than the budget allows
		return sdk.SweepResult{}, ctx.Err()
	}
	done := make(chan cycle.Result)
	go func() { done <- w.loop.RunOnce(ctx) }()
	<-confirmed
	w.clock.Advance(ladder.Defaults().MaintenanceInterval)
	res := <-done
	if res.Swept || len(res.Overruns) == 0 {
		t.Fatalf("the sweep was not cut: %+v", res)
	}
	recs, err := w.store.DecisionsFor(ctx, "run", "task", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Label == sdk.LabelReconcileInfraConfirmed && r.Applied && r.Reaper == "substrate" &&
			r.Evidence[hostaudit.EvRecovered] == "host" {
			return
		}
	}
	t.Fatalf("the confirmation is not in the audit: %+v", recs)
}

// A leader killed between its marks and their audit leaves marks on the
// board with no decision; the next term audits them from the board, once,
// when its gate opens (a deposed leader still alive has written its own by
// then), before it reaps.
func TestMarkLeftUnauditedByADeadLeaderIsAuditedByTheNext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t, "normal", nil)
	m := sdk.Mark{Attempt: w.attempt, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
		Reason: sdk.LabelAgentLost, Message: "agent_lost: silent for 5m", Term: w.term, At: t0.Add(-time.Minute)}
	if res, err := w.store.Mark(ctx, []sdk.Mark{m}); err != nil || !res[0].Applied {
		t.Fatalf("mark: %+v %v", res, err)
	}
	// (the leader that made it died here, its audit unwritten)
	for i := 0; i < 2; i++ {
		w.loop.RunOnce(ctx)
		w.clock.Advance(ladder.Defaults().MaintenanceInterval)
	}
	w.audited(t, "board")
	recs, err := w.store.DecisionsFor(ctx, "run", "task", 0)
	if err != nil || len(recs) != 1 || recs[0].Evidence[hostaudit.EvMessage] != m.Message {
		t.Fatalf("audit %+v (err %v), want the mark's one decision, from its row", recs, err)
	}
}

// So is a sweep's write: a leader killed between the sweep's settlement and
// its audit (the sweep's decisions come back only with its result) leaves
// the settlement on the board, and the next term audits it under the
// sweep's name, with the settlement's label, even once the attempt has been
// re-placed.
func TestSweepWriteLeftUnauditedByADeadLeaderIsAuditedByTheNext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t, "normal", nil)
	at := t0.Add(-time.Minute)
	res, err := w.store.Settle(ctx, []sdk.Settlement{{Attempt: w.attempt, Outcome: sdk.OutcomeInfra,
		Reason: sdk.ReasonPodDisrupted, Message: "pod_disrupted: pod deleted while its task ran",
		FromStates: []string{sdk.StateRunning}, Term: w.term, At: at}})
	if err != nil || !res[0].Applied {
		t.Fatalf("settle: %+v %v", res, err)
	}
	// (the leader that made it died here, its audit unwritten; the planner
	// re-placed the task)
	if r, err := w.lw.Replace(ctx, w.attempt, at.Add(time.Second)); err != nil || !r.Applied {
		t.Fatalf("re-place: %+v %v", r, err)
	}
	w.loop.RunOnce(ctx)
	if lost, err := w.store.UnauditedMarks(ctx, w.since); err != nil || len(lost) != 0 {
		t.Fatalf("writes on the board without their decision: %v (err %v)", lost, err)
	}
	recs, err := w.store.DecisionsFor(ctx, "run", "task", 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []pgboard.AuditRecord
	for _, r := range recs {
		if r.Attempt == w.attempt {
			got = append(got, r)
		}
	}
	if len(got) != 1 || got[0].Label != sdk.LabelReconcileSettled || !got[0].Applied || got[0].Reaper != "substrate" ||
		got[0].Evidence[hostaudit.EvRecovered] != "board" || !got[0].At.Equal(at) {
		t.Fatalf("audit of the first attempt %+v, want one reconcile_settled decision recovered from the board at %v", got, at)
	}
}

// A leader deposed while it still owes the audit writes what it owes at its
// next cycle all the same, under the term and at the time of the pass that
// decided it: the audit says what that term did, whoever leads now.
func TestAuditOwedByADeposedLeaderIsWrittenUnderItsTerm(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "normal", func(s *pgboard.Store) cycle.Auditor {
		return &flaky{Auditor: s, failing: 1}
	})
	if res := w.loop.RunOnce(context.Background()); len(res.Reaped) != 1 {
		t.Fatalf("the pass did not complete: %+v", res)
	}
	w.marked(t)
	w.lead.Set(leader.Status{Leading: false, Term: w.term + 1})
	w.clock.Advance(ladder.Defaults().MaintenanceInterval)
	if res := w.loop.RunOnce(context.Background()); res.Leading {
		t.Fatalf("the deposed replica reported leading: %+v", res)
	}
	w.audited(t, "")
	recs, err := w.store.DecisionsFor(context.Background(), "run", "task", 0)
	if err != nil || len(recs) != 1 || recs[0].Term != w.term || !recs[0].At.Equal(t0) {
		t.Fatalf("audit %+v (err %v), want the pass's one decision, under its term %d at the pass's time", recs, err, w.term)
	}
}

package literunner_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/runner/literunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/testkit/eventually"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// agentPath is the reaper-agent binary TestMain builds. TestMain sets it
// once, before any test runs.
var agentPath string

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "runner-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer os.RemoveAll(dir)
	agentPath = filepath.Join(dir, literunner.AgentBinary)
	build := exec.Command("go", "build", "-o", agentPath, "github.com/dexaflow/reaper/cmd/reaper-agent")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building reaper-agent:", err)
		return 2
	}
	return pgtest.Run(m)
}

// bundle is one test's world: a fresh board, a fake clock, a runner over
// both, and a scratch directory for the tasks.
type bundle struct {
	w      *lifecycle.Writer
	store  *board.Store
	clk    *clock.Fake
	runner *literunner.Runner
	term   int64
	work   string
	logs   *lockedBuffer
	valve  time.Duration
	// agentLogs is the runner's LogDir: each agent's own log is there.
	agentLogs string
}

type opts struct {
	maxParallel int
	maxRuns     int
	agentPath   string
	onResult    func(literunner.Result)
	// leading: the leadership Run asks (nil: none; only RunOnce is used).
	leading func(now time.Time) (int64, bool)
	// credentials: default an attempt API of the test's own, started with
	// api (nil: attemptapitest's defaults).
	credentials literunner.Minter
	api         *attemptapitest.Options
	heartbeat   time.Duration
	pools       map[string]int
	recovery    lifecycle.RecoveryBudget
}

func setup(t *testing.T, o opts) *bundle {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	store := board.New(pool, board.Options{})
	// Close to the wall clock, which the agents stamp their reports with.
	clk := clock.NewFake(time.Now().UTC().Truncate(time.Second))
	lease, ok, err := store.TryAcquire(ctx, "test", 24*time.Hour, clk.Now().Add(-time.Minute))
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if o.agentPath == "" {
		o.agentPath = agentPath
	}
	tmp := t.TempDir()
	logs := &lockedBuffer{}
	agentLogs := filepath.Join(tmp, "logs")
	w := lifecycle.New(pool, lifecycle.Options{})
	lad := ladder.Defaults()
	if o.credentials == nil {
		var ao attemptapitest.Options
		if o.api != nil {
			ao = *o.api
		}
		o.credentials = attemptapitest.Start(t, w, ao).Issuer
	}
	r, err := literunner.New(literunner.Config{
		AgentPath:     o.agentPath,
		RecordDir:     filepath.Join(tmp, "records"),
		LogDir:        agentLogs,
		Credentials:   o.credentials,
		Heartbeat:     o.heartbeat,
		MaxParallel:   o.maxParallel,
		MaxActiveRuns: o.maxRuns,
		Pools:         o.pools,
		Recovery:      o.recovery,
		Ladder:        lad,
		OnResult:      o.onResult,
		Leading:       o.leading,
		Clock:         clk,
		Logger:        hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Debug}),
	}, w)
	if err != nil {
		t.Fatal(err)
	}
	// Runs before the database is dropped: every agent has exited first.
	t.Cleanup(func() {
		if !eventually.Until(30*time.Second, func() bool { return r.ReapAgents() == 0 }) {
			t.Errorf("agents still running at the end of the test")
		}
		if err := r.Close(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("runner log:\n%s", logs.String())
		}
	})
	return &bundle{w: w, store: store, clk: clk, runner: r, term: lease.Term, work: t.TempDir(), logs: logs,
		valve: lad.InfraConfirmValve, agentLogs: agentLogs}
}

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

// task is a Lite task running command.
func task(id, command string, retries int32) lifecycle.NewTask {
	return lifecycle.NewTask{TaskID: id, Executor: sdk.ExecutorLite, Command: command, Retries: retries}
}

// mkRun creates a running run of tasks at the fake now.
func (b *bundle) mkRun(t *testing.T, runID string, tasks ...lifecycle.NewTask) {
	t.Helper()
	err := b.w.CreateRun(context.Background(), lifecycle.NewRun{RunID: runID, DagID: "dag", Tasks: tasks}, b.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
}

// cycle runs one cycle at the fake now.
func (b *bundle) cycle(t *testing.T) literunner.Result {
	t.Helper()
	res, err := b.runner.RunOnce(context.Background(), b.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// totals adds up counts over cycles.
type totals struct {
	scheduled, dispatched, retried, replaced, failed, finalized int
	labels                                                      []string
	runsStarted                                                 []string
	dispatchLatencies, finalizeLatencies                        int
}

func (tt *totals) add(res literunner.Result) {
	tt.scheduled += res.Scheduled
	tt.dispatched += res.Dispatched
	tt.retried += res.Retried
	tt.replaced += res.Replaced
	tt.failed += res.Failed
	tt.finalized += res.Finalized
	tt.runsStarted = append(tt.runsStarted, res.RunsStarted...)
	tt.dispatchLatencies += len(res.DispatchLatencies)
	tt.finalizeLatencies += len(res.FinalizeLatencies)
	for _, d := range res.Decisions {
		tt.labels = append(tt.labels, d.Label)
	}
}

// untilRunEnds runs cycles until the run is no longer running, polling the
// real agents for at most 30 s; after each cycle it calls check, if any.
func (b *bundle) untilRunEnds(t *testing.T, runID string, tt *totals, check func()) board.Run {
	t.Helper()
	var run board.Run
	if eventually.Until(30*time.Second, func() bool {
		tt.add(b.cycle(t))
		if check != nil {
			check()
		}
		var err error
		if run, err = b.w.Run(context.Background(), runID); err != nil {
			t.Fatal(err)
		}
		return run.State != sdk.RunRunning
	}, eventually.Every(20*time.Millisecond)) {
		return run
	}
	tis, _ := b.w.TaskInstances(context.Background(), runID)
	var rows []string
	for _, ti := range tis {
		rows = append(rows, show(ti))
	}
	t.Fatalf("run %s still running after 30s: %v", runID, rows)
	return run
}

func (b *bundle) ti(t *testing.T, runID, taskID string) board.TaskInstance {
	t.Helper()
	ti, err := b.w.TaskInstance(context.Background(), runID, taskID)
	if err != nil {
		t.Fatal(err)
	}
	return ti
}

// show prints a row's fields (the embedded attempt's String would hide them).
func show(ti board.TaskInstance) string {
	return fmt.Sprintf("%s state=%s kind=%q reason=%q retries=%d infra=%d/%d queued=%v running=%v confirmed=%v held=%v msg=%q",
		ti.Attempt, ti.State, ti.LastFailureKind, ti.FailureReason, ti.Retries, ti.InfraUsed, ti.InfraBudget,
		!ti.QueuedAt.IsZero(), !ti.RunningAt.IsZero(), !ti.InfraConfirmedAt.IsZero(), !ti.HeldAt.IsZero(), ti.ErrorMessage)
}

func (b *bundle) run(t *testing.T, runID string) board.Run {
	t.Helper()
	run, err := b.w.Run(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	return run
}

// runningWithoutAgent drives a's task instance to running through the
// writers, as an agent would have, without starting any process.
func (b *bundle) runningWithoutAgent(t *testing.T, a sdk.Attempt) {
	t.Helper()
	ctx := context.Background()
	now := b.clk.Now()
	if ok, err := b.w.Enqueue(ctx, a, now); err != nil || !ok {
		t.Fatal("enqueue", ok, err)
	}
	if ok, err := b.w.Queue(ctx, a, now); err != nil || !ok {
		t.Fatal("queue", ok, err)
	}
	if stop, err := b.w.Running(ctx, a, now); err != nil || stop {
		t.Fatal("running", stop, err)
	}
	if stop, err := b.w.Heartbeat(ctx, a, now); err != nil || stop {
		t.Fatal("heartbeat", stop, err)
	}
}

// markInfra makes an agent_lost infra mark on the running attempt a at the
// fake now, the way the agentlost reaper does.
func (b *bundle) markInfra(t *testing.T, a sdk.Attempt, confirm, hold bool) {
	t.Helper()
	res, err := b.store.Mark(context.Background(), []sdk.Mark{{
		Attempt: a, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
		Reason: sdk.LabelAgentLost, Message: "agent_lost: silent", Confirm: confirm, Hold: hold,
		Term: b.term, At: b.clk.Now(),
	}})
	if err != nil || !res[0].Applied {
		t.Fatal(res, err)
	}
}

func hasLabel(res literunner.Result, label string, applied bool) bool {
	for _, d := range res.Decisions {
		if d.Label == label && d.Applied == applied && d.Reaper == literunner.Name {
			return true
		}
	}
	return false
}

func TestRunToCompletion(t *testing.T) {
	t.Parallel()

	t.Run("TasksRunAsAgentsATaskFailureIsRetriedAndTheRunFinishesFailed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, opts{})
		b.mkRun(t, "run", task("a", "true", 0), task("b", "exit 3", 1), task("c", "sleep 0.1", 0))
		var tt totals
		run := b.untilRunEnds(t, "run", &tt, nil)

		if run.State != sdk.RunFailed || run.EndedAt.IsZero() {
			t.Fatalf("run %+v", run)
		}
		for _, c := range []struct {
			id    string
			state string
			try   int32
		}{{"a", sdk.StateSuccess, 1}, {"b", sdk.StateFailed, 2}, {"c", sdk.StateSuccess, 1}} {
			ti := b.ti(t, "run", c.id)
			if ti.State != c.state || ti.Try != c.try || ti.Epoch != 0 {
				t.Errorf("%s: state %s try %d epoch %d, want %s try %d epoch 0", c.id, ti.State, ti.Try, ti.Epoch, c.state, c.try)
			}
		}
		b2 := b.ti(t, "run", "b")
		if b2.LastFailureKind != sdk.FailureTask || b2.Retries != 0 {
			t.Errorf("b: kind %q retries %d", b2.LastFailureKind, b2.Retries)
		}
		if tt.scheduled != 4 || tt.dispatched != 4 || tt.retried != 1 || tt.finalized != 1 || tt.replaced != 0 || tt.failed != 0 {
			t.Errorf("totals %+v", tt)
		}
		if want := []string{sdk.LabelTaskRetry, sdk.LabelRunFinalizedFailed}; !slices.Equal(tt.labels, want) {
			t.Errorf("decisions %v, want %v", tt.labels, want)
		}
	})

	t.Run("ARunAsAGraph", func(t *testing.T) {
		// a, then b (fails, no retries) and c (after a), then d (after b
		// and c): d never runs, settled upstream_failed with its decision;
		// c runs only once a has ended; the run finishes failed.
		t.Parallel()
		b := setup(t, opts{})
		after := func(nt lifecycle.NewTask, ups ...string) lifecycle.NewTask { nt.Upstreams = ups; return nt }
		b.mkRun(t, "run", task("a", "sleep 0.2", 0), after(task("b", "exit 3", 0), "a"),
			after(task("c", "true", 0), "a"), after(task("d", "true", 0), "b", "c"))
		var tt totals
		if run := b.untilRunEnds(t, "run", &tt, nil); run.State != sdk.RunFailed {
			t.Fatalf("run %+v", run)
		}
		a, c, d := b.ti(t, "run", "a"), b.ti(t, "run", "c"), b.ti(t, "run", "d")
		if c.State != sdk.StateSuccess || c.RunningAt.Before(a.EndedAt) {
			t.Errorf("c %s running at %v, a ended at %v", c.State, c.RunningAt, a.EndedAt)
		}
		if d.State != sdk.StateUpstreamFailed || !d.QueuedAt.IsZero() || d.ErrorMessage != "upstream failed: b" {
			t.Errorf("d %s queued %v message %q, want upstream_failed by b, never queued", d.State, d.QueuedAt, d.ErrorMessage)
		}
		if tt.dispatched != 3 {
			t.Errorf("%d dispatched, want a, b and c", tt.dispatched)
		}
		if want := []string{sdk.LabelUpstreamFailed, sdk.LabelRunFinalizedFailed}; !slices.Equal(tt.labels, want) {
			t.Errorf("decisions %v, want %v", tt.labels, want)
		}
	})

	t.Run("ARunWhoseTasksAllSucceedFinishesSuccess", func(t *testing.T) {
		t.Parallel()
		b := setup(t, opts{})
		b.mkRun(t, "run", task("a", "true", 0), task("b", "sleep 0.1", 0))
		var tt totals
		if run := b.untilRunEnds(t, "run", &tt, nil); run.State != sdk.RunSuccess {
			t.Fatalf("run %+v", run)
		}
	})
}

// The run start cap: queued runs start one at a time with a cap of one,
// oldest first, each once the one before it has finished; every dispatch
// and every finalization is measured.
func TestRunStartCap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, opts{maxRuns: 1})
	for i, id := range []string{"second", "first", "third"} {
		// Created in the order first, second, third.
		at := b.clk.Now().Add(time.Duration([]int{1, 0, 2}[i]) * time.Second)
		err := b.w.CreateRun(ctx, lifecycle.NewRun{RunID: id, DagID: "dag", State: sdk.RunQueued,
			Tasks: []lifecycle.NewTask{task("a", "true", 0)}}, at)
		if err != nil {
			t.Fatal(err)
		}
	}
	var tt totals
	res := b.cycle(t)
	tt.add(res)
	if len(res.RunsStarted) != 1 || res.RunsStarted[0] != "first" || res.RunsWaiting != 2 {
		t.Fatalf("first tick: started %v, waiting %d", res.RunsStarted, res.RunsWaiting)
	}
	running := func() {
		n := 0
		for _, id := range []string{"first", "second", "third"} {
			if run, err := b.w.Run(ctx, id); err == nil && run.State == sdk.RunRunning {
				n++
			}
		}
		if n > 1 {
			t.Fatalf("%d runs running under a cap of 1", n)
		}
	}
	for _, id := range []string{"first", "second", "third"} {
		if run := b.untilRunEnds(t, id, &tt, running); run.State != sdk.RunSuccess {
			t.Fatalf("%s: %+v", id, run)
		}
	}
	if got := strings.Join(tt.runsStarted, ","); got != "first,second,third" {
		t.Fatalf("runs started in the order %s", got)
	}
	if tt.dispatchLatencies != 3 || tt.finalizeLatencies != 3 {
		t.Fatalf("measured %d dispatches and %d finalizations, want 3 and 3", tt.dispatchLatencies, tt.finalizeLatencies)
	}
}

func TestInfraMarks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("AConfirmedMarkIsReplacedOnANewEpochWithRetriesUntouched", func(t *testing.T) {
		t.Parallel()
		b := setup(t, opts{})
		b.mkRun(t, "run", lifecycle.NewTask{TaskID: "a", Executor: sdk.ExecutorLite, Command: "true", Retries: 2, InfraBudget: 2})
		a := sdk.Attempt{RunID: "run", TaskID: "a", Try: 1}
		b.runningWithoutAgent(t, a)
		b.markInfra(t, a, true, false)

		res := b.cycle(t)
		if res.Replaced != 1 || res.Dispatched != 1 || !hasLabel(res, sdk.LabelInfraReplace, true) {
			t.Fatalf("result %+v", res)
		}
		ti := b.ti(t, "run", "a")
		// Queued by the runner; its agent may have moved it on already.
		if ti.Try != 1 || ti.Epoch != 1 || ti.Retries != 2 || ti.InfraUsed != 1 || ti.QueuedAt.IsZero() || ti.State == sdk.StateNone {
			t.Fatalf("re-placed row %s", show(ti))
		}
		var tt totals
		if run := b.untilRunEnds(t, "run", &tt, nil); run.State != sdk.RunSuccess {
			t.Fatalf("run %+v", run)
		}
		ti = b.ti(t, "run", "a")
		if ti.State != sdk.StateSuccess || ti.Try != 1 || ti.Epoch != 1 || ti.Retries != 2 {
			t.Fatalf("final row %s", show(ti))
		}
	})

	t.Run("ASpentBudgetFailsTheTaskForGood", func(t *testing.T) {
		t.Parallel()
		b := setup(t, opts{})
		b.mkRun(t, "run", lifecycle.NewTask{TaskID: "a", Executor: sdk.ExecutorLite, Command: "true", Retries: 2,
			InfraBudget: lifecycle.NoInfraBudget})
		a := sdk.Attempt{RunID: "run", TaskID: "a", Try: 1}
		b.runningWithoutAgent(t, a)
		b.markInfra(t, a, true, false)

		res := b.cycle(t)
		if res.Failed != 1 || res.Replaced != 0 || res.Dispatched != 0 || res.Finalized != 1 ||
			!hasLabel(res, sdk.LabelInfraBudgetSpent, true) {
			t.Fatalf("result %+v", res)
		}
		ti := b.ti(t, "run", "a")
		if ti.State != sdk.StateFailed || ti.LastFailureKind != sdk.FailureInfra || ti.FailureReason != sdk.LabelInfraBudgetSpent ||
			ti.Retries != 0 || ti.Epoch != 0 || ti.InfraConfirmedAt.IsZero() {
			t.Fatalf("failed row %s", show(ti))
		}
		if run := b.run(t, "run"); run.State != sdk.RunFailed {
			t.Fatalf("run %+v", run)
		}
		if res := b.cycle(t); res.Changed() {
			t.Fatalf("a second cycle changed something: %+v", res)
		}
	})

	t.Run("AHeldAttemptIsNeverReplacedUntilItsHoldIsReleased", func(t *testing.T) {
		t.Parallel()
		b := setup(t, opts{})
		b.mkRun(t, "run", task("a", "true", 0))
		a := sdk.Attempt{RunID: "run", TaskID: "a", Try: 1}
		b.runningWithoutAgent(t, a)
		b.markInfra(t, a, true, true)
		before := b.ti(t, "run", "a")

		for _, step := range []time.Duration{0, b.valve + time.Minute, time.Hour} {
			b.clk.Advance(step)
			if res := b.cycle(t); res.Changed() || res.Waiting != 0 {
				t.Fatalf("a cycle %s later moved the held attempt: %+v", step, res)
			}
		}
		if ti := b.ti(t, "run", "a"); ti.Epoch != before.Epoch || ti.State != sdk.StateFailed || !ti.UpdatedAt.Equal(before.UpdatedAt) {
			t.Fatalf("held row changed: %s", show(ti))
		}
		if run := b.run(t, "run"); run.State != sdk.RunRunning {
			t.Fatalf("a run with a held attempt was finished: %+v", run)
		}

		if ok, err := b.w.ReleaseHold(ctx, a, "ops", b.clk.Now()); err != nil || !ok {
			t.Fatal(ok, err)
		}
		res := b.cycle(t)
		if res.Replaced != 1 || !hasLabel(res, sdk.LabelInfraReplace, true) {
			t.Fatalf("after release: %+v", res)
		}
		var tt totals
		if run := b.untilRunEnds(t, "run", &tt, nil); run.State != sdk.RunSuccess {
			t.Fatalf("run %+v", run)
		}
	})

	t.Run("AnUnconfirmedMarkWaitsForTheConfirmationValve", func(t *testing.T) {
		t.Parallel()
		b := setup(t, opts{})
		b.mkRun(t, "run", task("a", "true", 0))
		a := sdk.Attempt{RunID: "run", TaskID: "a", Try: 1}
		b.runningWithoutAgent(t, a)
		b.markInfra(t, a, false, false)

		b.clk.Advance(b.valve - time.Second)
		res := b.cycle(t)
		if res.Changed() || res.Waiting != 1 {
			t.Fatalf("inside the valve: %+v", res)
		}
		if ti := b.ti(t, "run", "a"); ti.Epoch != 0 || ti.State != sdk.StateFailed {
			t.Fatalf("row moved inside the valve: %s", show(ti))
		}

		b.clk.Advance(time.Second)
		res = b.cycle(t)
		if res.Replaced != 1 || !hasLabel(res, sdk.LabelInfraConfirmValveOpen, true) || !hasLabel(res, sdk.LabelInfraReplace, true) {
			t.Fatalf("at the valve: %+v", res)
		}
		if ti := b.ti(t, "run", "a"); ti.Epoch != 1 || ti.InfraUsed != 1 {
			t.Fatalf("row after the valve: %s", show(ti))
		}
		var tt totals
		if run := b.untilRunEnds(t, "run", &tt, nil); run.State != sdk.RunSuccess {
			t.Fatalf("run %+v", run)
		}
	})
}

func TestDispatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("MaxParallelBoundsQueuedPlusRunningAttempts", func(t *testing.T) {
		t.Parallel()
		b := setup(t, opts{maxParallel: 1})
		b.mkRun(t, "run", task("a", "sleep 0.2", 0), task("b", "sleep 0.2", 0), task("c", "sleep 0.2", 0))

		res := b.cycle(t)
		if res.Scheduled != 3 || res.Dispatched != 1 {
			t.Fatalf("first cycle %+v", res)
		}
		if res := b.cycle(t); res.Dispatched != 0 {
			t.Fatalf("second cycle dispatched past the bound: %+v", res)
		}
		tt := totals{dispatched: 1}
		run := b.untilRunEnds(t, "run", &tt, func() {
			n, err := b.w.CountActive(ctx, sdk.ExecutorLite)
			if err != nil {
				t.Fatal(err)
			}
			if n > 1 {
				t.Fatalf("%d attempts active, bound 1", n)
			}
		})
		if run.State != sdk.RunSuccess || tt.dispatched != 3 {
			t.Fatalf("run %+v, dispatched %d", run, tt.dispatched)
		}
	})

	t.Run("AnAgentThatCannotStartFailsTheDispatchWithoutRunningTheTask", func(t *testing.T) {
		t.Parallel()
		// An agent binary that is gone by the time of the dispatch.
		gone := filepath.Join(t.TempDir(), literunner.AgentBinary)
		data, err := os.ReadFile(agentPath)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(gone, data, 0o700); err != nil {
			t.Fatal(err)
		}
		b := setup(t, opts{agentPath: gone})
		if err := os.Remove(gone); err != nil {
			t.Fatal(err)
		}
		marker := filepath.Join(b.work, "ran")
		b.mkRun(t, "run", task("a", "touch "+marker, 2))

		res := b.cycle(t)
		if res.Dispatched != 0 || res.Failed != 1 || res.Finalized != 1 || !hasLabel(res, sdk.LabelDispatchFailed, true) {
			t.Fatalf("result %+v", res)
		}
		ti := b.ti(t, "run", "a")
		if ti.State != sdk.StateFailed || ti.LastFailureKind != sdk.FailureInfra || ti.FailureReason != sdk.LabelDispatchFailed ||
			ti.Retries != 0 || !ti.RunningAt.IsZero() || ti.QueuedAt.IsZero() || ti.Try != 1 {
			t.Fatalf("row %s", show(ti))
		}
		if run := b.run(t, "run"); run.State != sdk.RunFailed {
			t.Fatalf("run %+v", run)
		}
		if _, err := os.Stat(marker); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("the task ran: %v", err)
		}
		if n := b.runner.ReapAgents(); n != 0 {
			t.Fatalf("%d agents left", n)
		}
		if res := b.cycle(t); res.Changed() {
			t.Fatalf("a second cycle changed something: %+v", res)
		}
	})
}

func TestRun(t *testing.T) {
	t.Parallel()

	t.Run("CyclesOnlyWhileLeadingAndStopsOnCancelLeavingAgentsRunning", func(t *testing.T) {
		t.Parallel()
		results := make(chan literunner.Result, 4)
		asked, answers := make(chan time.Time), make(chan bool)
		ctx, cancel := context.WithCancel(context.Background())
		var b *bundle
		b = setup(t, opts{onResult: func(res literunner.Result) { results <- res }, leading: func(now time.Time) (int64, bool) {
			select {
			case asked <- now:
			case <-ctx.Done():
				return 0, false
			}
			select {
			case yes := <-answers:
				return b.term, yes
			case <-ctx.Done():
				return 0, false
			}
		}})
		marker := filepath.Join(b.work, "done")
		b.mkRun(t, "run", task("a", "sleep 0.3; touch "+marker, 0))

		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := b.runner.Run(ctx); err != nil {
				t.Error(err)
			}
		}()
		t.Cleanup(func() { cancel(); <-done })

		// Wait for Run's ticker before moving the clock.
		waitCtx, waitCancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer waitCancel()
		if err := b.clk.BlockUntil(waitCtx, 1); err != nil {
			t.Fatalf("Run never started its ticker: %v", err)
		}
		b.clk.Advance(literunner.IntervalDefault)
		<-asked
		answers <- false
		b.clk.Advance(literunner.IntervalDefault)
		<-asked
		answers <- true
		res := <-results
		if res.Scheduled != 1 || res.Dispatched != 1 {
			t.Fatalf("leading cycle %+v", res)
		}
		if ti := b.ti(t, "run", "a"); ti.QueuedAt.IsZero() {
			t.Fatalf("not dispatched: %s", show(ti))
		}
		select {
		case extra := <-results:
			t.Fatalf("a cycle ran while not leading: %+v", extra)
		default:
		}

		cancel()
		<-done
		// The agent outlives the loop: its task finishes and reports.
		if !eventually.Until(30*time.Second, func() bool { return b.ti(t, "run", "a").State == sdk.StateSuccess },
			eventually.Every(20*time.Millisecond)) {
			t.Fatalf("the agent did not finish after Run stopped: %s", show(b.ti(t, "run", "a")))
		}
		if _, err := os.Stat(marker); err != nil {
			t.Fatalf("the task did not run to its end: %v", err)
		}
	})
}

func TestNew(t *testing.T) {
	t.Parallel()
	w := lifecycle.New(nil, lifecycle.Options{})

	t.Run("RefusesAConfigurationWithoutCredentials", func(t *testing.T) {
		t.Parallel()
		if _, err := literunner.New(literunner.Config{AgentPath: agentPath, RecordDir: t.TempDir() + "/r"}, w); err == nil {
			t.Fatal("no error")
		}
	})
	t.Run("RefusesANegativeMaxParallel", func(t *testing.T) {
		t.Parallel()
		_, err := literunner.New(literunner.Config{AgentPath: agentPath, RecordDir: t.TempDir() + "/r", Credentials: attempttoken.Issuer{}, MaxParallel: -1}, w)
		if err == nil {
			t.Fatal("no error")
		}
	})
	t.Run("RefusesAMissingAgentBinary", func(t *testing.T) {
		t.Parallel()
		_, err := literunner.New(literunner.Config{AgentPath: t.TempDir() + "/nope", RecordDir: t.TempDir() + "/r", Credentials: attempttoken.Issuer{}}, w)
		if err == nil {
			t.Fatal("no error")
		}
	})
	t.Run("RunRefusesToCycleWithoutLeadership", func(t *testing.T) {
		t.Parallel()
		r, err := literunner.New(literunner.Config{AgentPath: agentPath, RecordDir: t.TempDir() + "/r", Credentials: attempttoken.Issuer{}}, w)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if err := r.Run(t.Context()); err == nil || !strings.Contains(err.Error(), "Leading") {
			t.Fatalf("Run without Config.Leading: %v", err)
		}
	})
}

// A runner whose leader was deposed (another replica took the board's
// lead) writes nothing and starts no agent: its cycle's writes are fenced
// by its term and it stops at the first one refused. The new leader's
// runner then dispatches the task.
func TestADeposedLeadersRunnerWritesNothingAndStartsNoAgent(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	ctx := context.Background()
	b.mkRun(t, "run", task("a", "true", 0))
	if ok, err := b.store.Resign(ctx, b.term, "test"); err != nil || !ok {
		t.Fatalf("resigning: %v, %v", ok, err)
	}
	lease, ok, err := b.store.TryAcquire(ctx, "other", time.Hour, b.clk.Now())
	if err != nil || !ok {
		t.Fatalf("the takeover: %v, %v", ok, err)
	}
	res, err := b.runner.RunOnceFenced(ctx, b.clk.Now(), b.term)
	if !errors.Is(err, lifecycle.ErrDeposed) {
		t.Fatalf("the deposed term's cycle: %v; want it ended as deposed", err)
	}
	ti, err := b.w.TaskInstance(ctx, "run", "a")
	if err != nil {
		t.Fatal(err)
	}
	if res.Changed() || ti.State != sdk.StateNone {
		t.Fatalf("the deposed term's cycle wrote: %+v, row %+v", res, ti)
	}
	res, err = b.runner.RunOnceFenced(ctx, b.clk.Now(), lease.Term)
	if err != nil || res.Dispatched != 1 {
		t.Fatalf("the new term's cycle: %+v, %v; want the task dispatched", res, err)
	}
}

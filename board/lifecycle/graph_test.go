package lifecycle_test

import (
	"context"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
)

// after is a Lite task with upstreams.
func after(id string, upstreams ...string) lifecycle.NewTask {
	t := lite(id, 0)
	t.Upstreams = upstreams
	return t
}

func TestCheckGraph(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		tasks []lifecycle.NewTask
		want  string // "" : a graph
	}{
		{"NoUpstreams", []lifecycle.NewTask{lite("a", 0), lite("b", 0)}, ""},
		{"Diamond", []lifecycle.NewTask{after("d", "b", "c"), after("b", "a"), after("c", "a"), lite("a", 0)}, ""},
		{"EmptyID", []lifecycle.NewTask{lite("a", 0), lite("", 0)}, "task 2 has an empty id"},
		{"Duplicate", []lifecycle.NewTask{lite("a", 0), lite("a", 0)}, `task "a": declared twice`},
		{"UnknownUpstream", []lifecycle.NewTask{lite("extract", 0), after("load", "extrct")},
			`task "load": upstream "extrct" is not a task of the run`},
		{"Self", []lifecycle.NewTask{after("a", "a")}, `task "a": names itself as an upstream`},
		{"NamedTwice", []lifecycle.NewTask{lite("a", 0), after("b", "a", "a")}, `task "b": names upstream "a" twice`},
		{"TwoCycle", []lifecycle.NewTask{after("a", "b"), after("b", "a")},
			`task "a": its upstreams form a cycle (each waits for the next): a -> b -> a`},
		{"CycleBehindAPath", []lifecycle.NewTask{after("start", "x"), after("x", "y"), after("y", "z"), after("z", "x")},
			`task "x": its upstreams form a cycle (each waits for the next): x -> y -> z -> x`},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := lifecycle.CheckGraph(c.tasks)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("got %v, want an error with %q", err, c.want)
			}
		})
	}
	t.Run("ALongChainIsWalkedWithoutRecursion", func(t *testing.T) {
		tasks := []lifecycle.NewTask{lite("t0", 0)}
		for i := 1; i < 10000; i++ {
			tasks = append(tasks, after("t"+itoa(i), "t"+itoa(i-1)))
		}
		if err := lifecycle.CheckGraph(tasks); err != nil {
			t.Fatal(err)
		}
		tasks[0].Upstreams = []string{"t9999"}
		if err := lifecycle.CheckGraph(tasks); err == nil || !strings.Contains(err.Error(), "cycle") {
			t.Fatalf("a 10,000-task cycle: %v", err)
		}
	})
	t.Run("TooManyEdges", func(t *testing.T) {
		var tasks []lifecycle.NewTask
		var ids []string
		for i := 0; i < 400; i++ {
			ids = append(ids, "u"+itoa(i))
			tasks = append(tasks, lite("u"+itoa(i), 0))
		}
		for i := 0; i < 251; i++ {
			tasks = append(tasks, after("d"+itoa(i), ids...))
		}
		if err := lifecycle.CheckGraph(tasks); err == nil || !strings.Contains(err.Error(), "more than 100000 upstreams") {
			t.Fatalf("100,400 edges: %v", err)
		}
	})
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestCreateRunRefusesWhatIsNoGraph: the board writes nothing of a run
// whose upstreams CheckGraph refuses.
func TestCreateRunRefusesWhatIsNoGraph(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	err := b.w.CreateRun(ctx, lifecycle.NewRun{RunID: "r", DagID: "d",
		Tasks: []lifecycle.NewTask{after("a", "b"), after("b", "a")}}, base)
	if err == nil || !strings.Contains(err.Error(), "cycle") {
		t.Fatalf("a cycle: %v", err)
	}
	if _, err := b.w.Run(ctx, "r"); err == nil {
		t.Fatal("the refused run was written")
	}
	// The database refuses a task naming itself even past the writer.
	b.mkRun(t, "ok", sdk.RunRunning, lite("a", 0))
	if _, err := b.store.Pool().Exec(ctx, `UPDATE task_instances SET upstreams = '{a}' WHERE run_id = 'ok'`); err == nil {
		t.Fatal("a task naming itself was stored")
	}
}

// fromScheduled drives a scheduled attempt to running, then to state
// (running, or an outcome it reports).
func (b *bundle) fromScheduled(t *testing.T, a sdk.Attempt, state string, at time.Time) {
	t.Helper()
	ctx := context.Background()
	if ok, err := b.w.Queue(ctx, a, at); err != nil || !ok {
		t.Fatalf("queue %s: %v %v", a, ok, err)
	}
	if stop, err := b.w.Running(ctx, a, at); err != nil || stop {
		t.Fatalf("running %s: %v %v", a, stop, err)
	}
	if state == sdk.StateRunning {
		return
	}
	if stop, err := b.w.Report(ctx, a, lifecycle.TerminalReport{State: state}, at); err != nil || stop {
		t.Fatalf("report %s %s: %v %v", a, state, stop, err)
	}
}

// graphState reads the states of a run's task instances by task id.
func (b *bundle) graphState(t *testing.T, runID string) map[string]string {
	t.Helper()
	tis, err := b.w.TaskInstances(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, ti := range tis {
		out[ti.TaskID] = ti.State
	}
	return out
}

func (b *bundle) enqueue(t *testing.T) []string {
	t.Helper()
	got, err := b.w.EnqueueNew(context.Background(), sdk.ExecutorLite, 0, base)
	if err != nil {
		t.Fatal(err)
	}
	return attemptKeys(got)
}

func (b *bundle) settleBlocked(t *testing.T) []lifecycle.Blocked {
	t.Helper()
	got, err := b.w.SettleBlocked(context.Background(), sdk.ExecutorLite, 0, base)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestRunsAsGraphs: a task is scheduled once every upstream succeeded; it
// waits while an upstream runs, waits on a rail or carries a provisional
// infra mark; an override of the mark lets it run; one upstream failed for
// good settles it upstream_failed (and that its own downstream); a skipped
// upstream skips it.
func TestRunsAsGraphs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	at := base.Add(-10 * time.Minute)

	t.Run("ScheduledOnceEveryUpstreamSucceeded", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		as := b.mkRun(t, "r", sdk.RunRunning, lite("a", 0), lite("b", 0), after("c", "a", "b"), after("d", "c"))
		if got, want := b.enqueue(t), []string{"r/a", "r/b"}; !reflect.DeepEqual(got, want) {
			t.Fatalf("first schedule %v, want %v", got, want)
		}
		b.fromScheduled(t, as["a"], sdk.StateSuccess, at)
		b.fromScheduled(t, as["b"], sdk.StateRunning, at)
		if got := b.enqueue(t); len(got) != 0 {
			t.Fatalf("scheduled %v while upstream b runs", got)
		}
		if got := b.settleBlocked(t); len(got) != 0 {
			t.Fatalf("settled %v while upstream b runs", got)
		}
		stop, err := b.w.Report(ctx, as["b"], lifecycle.TerminalReport{State: sdk.StateSuccess}, at.Add(time.Minute))
		if err != nil || stop {
			t.Fatal(stop, err)
		}
		if got, want := b.enqueue(t), []string{"r/c"}; !reflect.DeepEqual(got, want) {
			t.Fatalf("after both upstreams succeeded %v, want %v", got, want)
		}
		if st := b.graphState(t, "r")["d"]; st != sdk.StateNone {
			t.Fatalf("d is %s before c ran", st)
		}
		if ok, err := b.w.Enqueue(ctx, as["d"], base); err != nil || ok {
			t.Fatalf("the single enqueue scheduled d before c ran: %v %v", ok, err)
		}
	})

	t.Run("WaitsOnARetryAndOnAProvisionalMarkRunsAfterItsOverride", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		as := b.mkRun(t, "r", sdk.RunRunning, lite("retry", 1), lite("marked", 0), after("down", "retry", "marked"))
		b.to(t, as["retry"], sdk.StateFailed, at)
		b.to(t, as["marked"], sdk.StateRunning, at)
		res, err := b.store.Mark(ctx, []sdk.Mark{{Attempt: as["marked"], FromStates: []string{sdk.StateRunning},
			Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost, Message: "agent_lost: silent", Term: b.term, At: at}})
		if err != nil || !res[0].Applied {
			t.Fatal(res, err)
		}
		if got := b.enqueue(t); len(got) != 0 {
			t.Fatalf("scheduled %v behind a failure with retries left and a provisional mark", got)
		}
		if got := b.settleBlocked(t); len(got) != 0 {
			t.Fatalf("settled %v behind a failure with retries left and a provisional mark", got)
		}
		// The retry runs and succeeds; the mark is overridden from the
		// attempt's durable record.
		rel, err := b.w.Retry(ctx, as["retry"], base)
		if err != nil || !rel.Applied {
			t.Fatal(rel, err)
		}
		retried := rel.Attempt
		b.to(t, retried, sdk.StateSuccess, base.Add(-time.Minute))
		ov, err := b.store.OverrideInfra(ctx, []sdk.Override{{Attempt: as["marked"], MarkedAfter: at.Add(-time.Minute),
			Term: b.term, At: base}})
		if err != nil || !ov[0].Applied {
			t.Fatal(ov, err)
		}
		if got, want := b.enqueue(t), []string{"r/down"}; !reflect.DeepEqual(got, want) {
			t.Fatalf("after the retry and the override %v, want %v", got, want)
		}
	})

	t.Run("AnUpstreamFailedForGoodSettlesItsDownstreamAndTheirs", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		as := b.mkRun(t, "r", sdk.RunRunning, lite("bad", 0), lite("slow", 0), after("down", "bad", "slow"),
			after("downer", "down"), after("side", "slow"))
		b.to(t, as["bad"], sdk.StateFailed, at)
		b.to(t, as["slow"], sdk.StateRunning, at)
		got := b.settleBlocked(t)
		if len(got) != 1 || got[0].TaskID != "down" || got[0].State != sdk.StateUpstreamFailed ||
			!reflect.DeepEqual(got[0].Failed, []string{"bad"}) {
			t.Fatalf("first pass %+v, want down upstream_failed by bad", got)
		}
		got = b.settleBlocked(t)
		if len(got) != 1 || got[0].TaskID != "downer" || !reflect.DeepEqual(got[0].Failed, []string{"down"}) {
			t.Fatalf("second pass %+v, want downer upstream_failed by down", got)
		}
		ti, err := b.w.TaskInstance(ctx, "r", "down")
		if err != nil {
			t.Fatal(err)
		}
		if ti.EndedAt.IsZero() || ti.ErrorMessage != "upstream failed: bad" {
			t.Fatalf("down ended %v, message %q", ti.EndedAt, ti.ErrorMessage)
		}
		if st := b.graphState(t, "r")["side"]; st != sdk.StateNone {
			t.Fatalf("side (behind the running slow) is %s", st)
		}
		// The run is not finished while slow runs; then it fails, naming
		// every task that did not succeed.
		if fin, err := b.w.FinishSettledRuns(ctx, 0, base); err != nil || len(fin) != 0 {
			t.Fatalf("finished %v while slow runs: %v", fin, err)
		}
		stop, err := b.w.Report(ctx, as["slow"], lifecycle.TerminalReport{State: sdk.StateSuccess}, base)
		if err != nil || stop {
			t.Fatal(stop, err)
		}
		if got := b.enqueue(t); !reflect.DeepEqual(got, []string{"r/side"}) {
			t.Fatalf("after slow: %v", got)
		}
		b.fromScheduled(t, sdk.Attempt{RunID: "r", TaskID: "side", Try: 1}, sdk.StateSuccess, base.Add(time.Minute))
		fin, err := b.w.FinishSettledRuns(ctx, 0, base.Add(2*time.Minute))
		if err != nil || len(fin) != 1 || fin[0].State != sdk.RunFailed ||
			!reflect.DeepEqual(fin[0].Unsuccessful, []string{"bad", "down", "downer"}) {
			t.Fatalf("finish %+v, %v", fin, err)
		}
	})

	t.Run("AnInfraFailureMadeTerminalFailsItsDownstreamAConfirmedMarkDoesNot", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		as := b.mkRun(t, "r", sdk.RunRunning, lite("confirmed", 0), lite("spent", 0),
			after("c1", "confirmed"), after("s1", "spent"))
		b.to(t, as["confirmed"], "infra", at)
		b.to(t, as["spent"], "infra", at)
		if got := b.settleBlocked(t); len(got) != 0 {
			t.Fatalf("settled %v behind confirmed marks, which the runner re-places", got)
		}
		ok, err := b.w.Fail(ctx, as["spent"], []string{sdk.StateFailed}, lifecycle.Failure{Kind: sdk.MarkInfra,
			Reason: sdk.LabelInfraBudgetSpent, Terminal: true, Confirm: true}, at)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		got := b.settleBlocked(t)
		if len(got) != 1 || got[0].TaskID != "s1" || got[0].State != sdk.StateUpstreamFailed {
			t.Fatalf("after the budget was spent %+v, want s1 upstream_failed", got)
		}
	})

	t.Run("ASkippedUpstreamSkipsItsDownstream", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		as := b.mkRun(t, "r", sdk.RunRunning, lite("skip", 0), lite("ok", 0), after("down", "skip", "ok"))
		b.to(t, as["skip"], sdk.StateSkipped, at)
		b.to(t, as["ok"], sdk.StateSuccess, at)
		got := b.settleBlocked(t)
		if len(got) != 1 || got[0].State != sdk.StateSkipped || !reflect.DeepEqual(got[0].Skipped, []string{"skip"}) {
			t.Fatalf("%+v, want down skipped by skip", got)
		}
		fin, err := b.w.FinishSettledRuns(ctx, 0, base)
		if err != nil || len(fin) != 1 || fin[0].State != sdk.RunSuccess {
			t.Fatalf("a run of successes and skips finished %+v, %v", fin, err)
		}
	})

	t.Run("ADeposedLeaderSettlesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		as := b.mkRun(t, "r", sdk.RunRunning, lite("bad", 0), after("down", "bad"))
		b.to(t, as["bad"], sdk.StateFailed, at)
		w := lifecycle.New(b.store.Pool(), lifecycle.Options{})
		fenced := w.Fenced(b.term + 1)
		if _, err := fenced.SettleBlocked(ctx, sdk.ExecutorLite, 0, base); err == nil {
			t.Fatal("a stale term settled blocked tasks without an error")
		}
		if st := b.graphState(t, "r")["down"]; st != sdk.StateNone {
			t.Fatalf("down is %s after a deposed settle", st)
		}
	})
}

// TestPoolUsage: the slots in use are the queued and running attempts'
// pool_slots, by pool, of running runs only; silent ones are counted apart;
// a run's max_active_tasks counts its queued and running task instances.
func TestPoolUsage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	at := base.Add(-10 * time.Minute)
	inPool := func(id, pool string, slots int32) lifecycle.NewTask {
		nt := lite(id, 0)
		nt.Pool, nt.PoolSlots = pool, slots
		return nt
	}
	as := b.mkRun(t, "r", sdk.RunRunning, inPool("q", "db", 2), inPool("run", "db", 3), inPool("quiet", "db", 1),
		inPool("sched", "db", 1), inPool("done", "db", 5), lite("plain", 0))
	b.to(t, as["q"], sdk.StateQueued, at)
	b.to(t, as["run"], sdk.StateRunning, base.Add(-time.Minute))
	b.to(t, as["quiet"], sdk.StateRunning, at)
	b.to(t, as["sched"], sdk.StateScheduled, at)
	b.to(t, as["done"], sdk.StateSuccess, at)
	b.to(t, as["plain"], sdk.StateRunning, at)
	// A finished run's attempts hold nothing.
	old := b.mkRun(t, "old", sdk.RunRunning, inPool("x", "db", 7))
	b.to(t, old["x"], sdk.StateRunning, at)
	if _, err := b.store.Pool().Exec(ctx, `UPDATE runs SET state = 'failed', ended_at = $1 WHERE run_id = 'old'`, at); err != nil {
		t.Fatal(err)
	}
	use, err := b.w.PoolUsage(ctx, base.Add(-5*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	want := []lifecycle.PoolUse{
		{Pool: "db", Queued: 2, Running: 4, Silent: 1, Waiting: 1},
		{Pool: lifecycle.DefaultPool, Running: 1, Silent: 1},
	}
	if !reflect.DeepEqual(use, want) {
		t.Fatalf("use %+v, want %+v", use, want)
	}

	err = b.w.CreateRun(ctx, lifecycle.NewRun{RunID: "bounded", DagID: "d", MaxActiveTasks: 2,
		Tasks: []lifecycle.NewTask{lite("a", 0), lite("b", 0), lite("c", 0)}}, at)
	if err != nil {
		t.Fatal(err)
	}
	b.to(t, sdk.Attempt{RunID: "bounded", TaskID: "a", Try: 1}, sdk.StateRunning, at)
	runs, err := b.w.BoundedRuns(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := runs["bounded"]; got != (lifecycle.RunUse{Max: 2, Active: 1}) || len(runs) != 1 {
		t.Fatalf("bounded runs %+v", runs)
	}
	got, err := b.w.ListScheduledOpen(ctx, sdk.ExecutorLite, nil, 0, []string{"db"}, []string{"bounded"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Fatalf("listed %v from a closed pool and a closed run", keys(got))
	}
	b.to(t, sdk.Attempt{RunID: "bounded", TaskID: "b", Try: 1}, sdk.StateScheduled, at)
	got, err = b.w.ListScheduledOpen(ctx, sdk.ExecutorLite, nil, 0, []string{"db"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(keys(got), []string{"bounded/b"}) || got[0].Pool != lifecycle.DefaultPool || got[0].PoolSlots != 1 {
		t.Fatalf("listed %v", got)
	}
	if _, err := b.store.Pool().Exec(ctx, `UPDATE task_instances SET pool_slots = 0 WHERE run_id = 'r' AND task_id = 'q'`); err == nil {
		t.Fatal("a task of 0 slots was stored")
	}
}

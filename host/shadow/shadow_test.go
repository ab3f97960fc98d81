package shadow_test

import (
	"context"
	"testing"
	"time"

	pgboard "github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	hostaudit "github.com/dexaflow/reaper/host/audit"
	"github.com/dexaflow/reaper/host/cycle"
	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/host/metrics"
	"github.com/dexaflow/reaper/host/shadow"
	"github.com/dexaflow/reaper/plugins/agentlost"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/testkit/byhand"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// deadPods is a kube substrate whose sweep finds nothing and that reads
// every attempt's pod dead.
type deadPods struct{ sdk.Substrate }

func (deadPods) Sweep(context.Context, sdk.SweepRequest, sdk.Board) (sdk.SweepResult, error) {
	return sdk.SweepResult{}, nil
}

func (deadPods) Synced(context.Context) (bool, error) { return true, nil }

func (deadPods) Liveness(_ context.Context, req sdk.LivenessRequest) ([]sdk.AttemptLiveness, error) {
	out := make([]sdk.AttemptLiveness, len(req.Attempts))
	for i, a := range req.Attempts {
		out[i] = sdk.AttemptLiveness{Attempt: a, State: sdk.Dead, Agent: sdk.Dead, Detail: "no pod"}
	}
	return out, nil
}

// shadowWorld is a real board with three kube attempts silent past
// agent_lost, a dry-run agentlost in a loop that scores shadow decisions,
// and a fake clock.
type shadowWorld struct {
	clock   *clock.Fake
	store   *pgboard.Store
	lw      *lifecycle.Writer
	term    int64
	loop    *cycle.Loop
	shadows *shadow.Service
	metrics *metrics.Metrics
}

// runOnce runs a cycle of the loop, then the scorer.
func (w *shadowWorld) runOnce(ctx context.Context) shadow.Result {
	w.loop.RunOnce(ctx)
	return w.shadows.RunOnce(ctx)
}

func newShadowWorld(t *testing.T) *shadowWorld {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	w := &shadowWorld{clock: clock.NewFake(t0), store: pgboard.New(pool, pgboard.Options{}),
		lw: lifecycle.New(pool, lifecycle.Options{}), metrics: metrics.New()}
	lease, ok, err := w.store.TryAcquire(ctx, "test", 72*time.Hour, t0.Add(-time.Minute))
	if err != nil || !ok {
		t.Fatalf("acquire leadership: ok=%v err=%v", ok, err)
	}
	w.term = lease.Term
	tasks := []lifecycle.NewTask{}
	for _, id := range []string{"comesback", "lost", "open", "overridden"} {
		tasks = append(tasks, lifecycle.NewTask{TaskID: id, Executor: sdk.ExecutorKube})
	}
	if err := w.lw.CreateRun(ctx, lifecycle.NewRun{RunID: "r", DagID: "dag", State: sdk.RunRunning, Tasks: tasks},
		t0.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	for _, tk := range tasks {
		a := sdk.Attempt{RunID: "r", TaskID: tk.TaskID, Try: 1}
		for _, step := range []func() (bool, error){
			func() (bool, error) { return w.lw.Enqueue(ctx, a, t0.Add(-21*time.Minute)) },
			func() (bool, error) { return w.lw.Queue(ctx, a, t0.Add(-21*time.Minute)) },
			func() (bool, error) { stop, err := w.lw.Running(ctx, a, t0.Add(-20*time.Minute)); return !stop, err },
			func() (bool, error) { stop, err := w.lw.Heartbeat(ctx, a, t0.Add(-10*time.Minute)); return !stop, err },
		} {
			if ok, err := step(); err != nil || !ok {
				t.Fatalf("drive %s to running: ok=%v err=%v", a, ok, err)
			}
		}
	}
	r := agentlost.New(nil)
	if err := r.Configure(ctx, sdk.ConfigureRequest{Edition: ladder.EditionKube, Ladder: ladder.Defaults()}); err != nil {
		t.Fatal(err)
	}
	info, err := r.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lead := byhand.NewLead(leader.Status{Leading: true, Term: lease.Term, Since: t0.Add(-time.Hour)})
	w.loop = cycle.New(cycle.Config{Ladder: ladder.Defaults(), Edition: ladder.EditionKube, Clock: w.clock,
		Metrics: w.metrics},
		lead, w.store, w.store, &byhand.Static[sdk.Substrate]{V: deadPods{}},
		[]cycle.Reaper{{Name: agentlost.Name, DryRun: true, Plugin: &byhand.Static[sdk.Reaper]{V: r},
			MarkReasons: info.MarkReasons, Labels: info.DecisionLabels}})
	w.shadows = shadow.New(shadow.Config{Clock: w.clock, Metrics: w.metrics, Reapers: []string{agentlost.Name}},
		lead, w.store)
	return w
}

// verdicts reads reaper_shadow_verdicts_total of agentlost's label and
// verdict.
func (w *shadowWorld) verdicts(t *testing.T, label, verdict string) float64 {
	t.Helper()
	return w.verdictsOfReaper(t, agentlost.Name, label, verdict)
}

// verdictsOfReaper reads reaper_shadow_verdicts_total of a reaper's label
// and verdict.
func (w *shadowWorld) verdictsOfReaper(t *testing.T, reaper, label, verdict string) float64 {
	t.Helper()
	fams, err := w.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "reaper_shadow_verdicts_total" {
			continue
		}
		for _, mt := range f.GetMetric() {
			got := map[string]string{}
			for _, lp := range mt.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			if got["reaper"] == reaper && got["label"] == label && got["verdict"] == verdict {
				return mt.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// verdictsOf reads the verdicts written on task's decisions, oldest first.
func (w *shadowWorld) verdictsOf(t *testing.T, task string) []string {
	t.Helper()
	recs, err := w.store.DecisionsFor(context.Background(), "r", task, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range recs {
		if r.Reaper == agentlost.Name && r.Label == sdk.LabelAgentLost {
			out = append(out, r.Verdict.Word)
		}
	}
	return out
}

// A dry-run agentlost decides each silent attempt lost and writes nothing;
// what the board shows of each attempt afterwards scores the decision.
func TestShadowVerdicts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newShadowWorld(t)

	// The live path of another replica marked "overridden" (provisional on
	// kube) and audited it.
	overridden := sdk.Attempt{RunID: "r", TaskID: "overridden", Try: 1}
	if res, err := w.store.Mark(ctx, []sdk.Mark{{Attempt: overridden, FromStates: []string{sdk.StateRunning},
		Kind: sdk.MarkInfra, Reason: sdk.LabelPodLost, Term: w.term, At: t0.Add(-time.Second)}}); err != nil || !res[0].Applied {
		t.Fatalf("live mark: %+v %v", res, err)
	}
	if err := w.store.RecordDecisions(ctx, w.term, t0.Add(-time.Second), []sdk.Decision{{Reaper: "podlost",
		Label: sdk.LabelPodLost, Attempt: overridden, Applied: true,
		Evidence: map[string]string{"edition": ladder.EditionKube, "policy": "replace"}}}); err != nil {
		t.Fatal(err)
	}

	t.Run("NoTruthYet_Pending", func(t *testing.T) {
		res := w.runOnce(ctx)
		if len(res.Verdicts) != 0 {
			t.Fatalf("verdicts before any truth: %+v", res.Verdicts)
		}
		for _, task := range []string{"comesback", "lost", "open"} {
			if got := w.verdictsOf(t, task); len(got) != 1 || got[0] != "" {
				t.Fatalf("%s: dry-run decisions %q, want one unscored", task, got)
			}
		}
	})

	// Between the cycles: one attempt heartbeats, the live path (another
	// reaper's applied mark, confirmed by the sweep) settles another lost.
	comesback := sdk.Attempt{RunID: "r", TaskID: "comesback", Try: 1}
	if stop, err := w.lw.Heartbeat(ctx, comesback, t0.Add(time.Minute)); err != nil || stop {
		t.Fatalf("heartbeat: stop=%v err=%v", stop, err)
	}
	lost := sdk.Attempt{RunID: "r", TaskID: "lost", Try: 1}
	res, err := w.store.Mark(ctx, []sdk.Mark{{Attempt: lost, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
		Reason: sdk.LabelPodLost, Message: "pod_lost", Term: w.term, At: t0.Add(time.Minute)}})
	if err != nil || !res[0].Applied {
		t.Fatalf("live mark: %+v %v", res, err)
	}
	// The sweep reads the overridden attempt's durable SUCCESS record.
	if res, err := w.store.OverrideInfra(ctx, []sdk.Override{{Attempt: overridden, MarkedAfter: t0.Add(-time.Hour),
		EndedAt: t0.Add(-30 * time.Second), Term: w.term, At: t0.Add(time.Minute)}}); err != nil || !res[0].Applied {
		t.Fatalf("override: %+v %v", res, err)
	}
	w.clock.Advance(2 * time.Minute)

	t.Run("AttemptHeartbeatsAfterTheDecision_WouldHaveKilledLiveWork", func(t *testing.T) {
		res := w.runOnce(ctx)
		if got := w.verdictsOf(t, "comesback"); len(got) != 1 || got[0] != sdk.VerdictWouldHaveKilledLiveWork {
			t.Fatalf("verdicts %q", got)
		}
		if n := w.verdicts(t, sdk.LabelAgentLost, sdk.VerdictWouldHaveKilledLiveWork); n != 1 {
			t.Fatalf("reaper_shadow_verdicts_total{verdict=would_have_killed_live_work} = %v, want 1", n)
		}
		var by string
		for _, v := range res.Verdicts {
			if v.Attempt == comesback {
				by = v.Evidence[hostaudit.VevBy]
			}
		}
		if by != "heartbeat" {
			t.Fatalf("the verdict says it was settled by %q, want heartbeat: %+v", by, res.Verdicts)
		}
	})
	t.Run("AttemptSettledLostByTheLivePath_Right", func(t *testing.T) {
		if got := w.verdictsOf(t, "lost"); len(got) != 1 || got[0] != sdk.VerdictRight {
			t.Fatalf("verdicts %q", got)
		}
		if n := w.verdicts(t, sdk.LabelAgentLost, sdk.VerdictRight); n != 1 {
			t.Fatalf("reaper_shadow_verdicts_total{verdict=right} = %v, want 1", n)
		}
	})
	t.Run("LiveMarkOverriddenByDurableSuccess_WouldHaveKilledLiveWork", func(t *testing.T) {
		recs, err := w.store.DecisionsFor(ctx, "r", "overridden", 0)
		if err != nil || len(recs) != 1 || recs[0].Verdict.Word != sdk.VerdictWouldHaveKilledLiveWork ||
			recs[0].Verdict.Evidence[hostaudit.VevBy] != "override" {
			t.Fatalf("decisions %+v, %v", recs, err)
		}
		if n := w.verdictsOfReaper(t, "podlost", sdk.LabelPodLost, sdk.VerdictWouldHaveKilledLiveWork); n != 1 {
			t.Fatalf("reaper_shadow_verdicts_total{reaper=podlost} = %v, want 1", n)
		}
	})
	t.Run("StillOpenWithinTheHorizon_Pending", func(t *testing.T) {
		// Silent still: the second cycle decided it lost again.
		if got := w.verdictsOf(t, "open"); len(got) != 2 || got[0] != "" || got[1] != "" {
			t.Fatalf("verdicts %q, want two unscored", got)
		}
	})
	t.Run("StillOpenPastTheHorizon_Unresolved", func(t *testing.T) {
		w.clock.Advance(hostaudit.ShadowHorizonDefault)
		w.runOnce(ctx)
		got := w.verdictsOf(t, "open")
		if len(got) != 3 || got[0] != sdk.VerdictUnresolved || got[1] != sdk.VerdictUnresolved || got[2] != "" {
			t.Fatalf("verdicts %q, want the two past the horizon unresolved and the new one unscored", got)
		}
		if n := w.verdicts(t, sdk.LabelAgentLost, sdk.VerdictUnresolved); n != 2 {
			t.Fatalf("reaper_shadow_verdicts_total{verdict=unresolved} = %v, want 2", n)
		}
	})
	t.Run("DeposedTerm_NothingScored", func(t *testing.T) {
		before := w.verdictsOf(t, "comesback")
		// Another replica takes the lease; this loop still believes it leads.
		w.clock.Advance(time.Minute)
		if _, err := w.store.Resign(ctx, w.term, "test"); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := w.store.TryAcquire(ctx, "other", time.Hour, w.clock.Now()); err != nil || !ok {
			t.Fatalf("take over: ok=%v err=%v", ok, err)
		}
		if stop, err := w.lw.Heartbeat(ctx, comesback, w.clock.Now()); err != nil || stop {
			t.Fatalf("heartbeat: stop=%v err=%v", stop, err)
		}
		res := w.runOnce(ctx)
		if len(res.Verdicts) != 0 {
			t.Fatalf("a deposed term scored: %+v", res.Verdicts)
		}
		if after := w.verdictsOf(t, "comesback"); len(after) != len(before) || after[len(after)-1] != "" {
			t.Fatalf("verdicts %q, then %q", before, after)
		}
	})
}

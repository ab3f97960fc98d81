package cycle_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	hostaudit "github.com/dexaflow/reaper/host/audit"
	"github.com/dexaflow/reaper/host/cycle"
	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/host/metrics"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/testkit/byhand"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// substrate is an in-process substrate whose sweep can be made to block.
type substrate struct {
	sdk.Substrate // unused methods panic
	synced        bool
	sweepBlocks   bool // block until ctx is done
	ignoreCtx     chan struct{}
	started       chan struct{}
	mu            sync.Mutex
	sweeps        int
	calls         *callLog         // when set, each sweep is noted in it
	overrides     map[string]int64 // when set, what each sweep reports it overrode
	during        func()           // when set, runs inside each sweep (a slow one moves the clock)
	decisions     []sdk.Decision   // with overrides: what each sweep reports it decided
}

// callLog notes, in order, the calls made on the in-process substrate and
// reapers of one test.
type callLog struct {
	mu    sync.Mutex
	calls []string
}

func (c *callLog) add(call string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, call)
}

func (c *callLog) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.calls
	c.calls = nil
	return out
}

func (s *substrate) Sweep(ctx context.Context, _ sdk.SweepRequest, _ sdk.Board) (sdk.SweepResult, error) {
	s.mu.Lock()
	s.sweeps++
	s.mu.Unlock()
	s.calls.add("sweep")
	if s.during != nil {
		s.during()
	}
	if s.started != nil {
		s.started <- struct{}{}
	}
	if s.ignoreCtx != nil {
		<-s.ignoreCtx
		return sdk.SweepResult{}, nil
	}
	if s.sweepBlocks {
		<-ctx.Done()
		return sdk.SweepResult{}, ctx.Err()
	}
	if s.overrides != nil {
		return sdk.SweepResult{Overrides: s.overrides, Decisions: append([]sdk.Decision(nil), s.decisions...)}, nil
	}
	return sdk.SweepResult{Overrides: map[string]int64{sdk.LabelAgentLost: 1}}, nil
}

func (s *substrate) Synced(context.Context) (bool, error) { return s.synced, nil }

func (s *substrate) Liveness(context.Context, sdk.LivenessRequest) ([]sdk.AttemptLiveness, error) {
	return nil, nil
}

func (s *substrate) StopOrphan(context.Context, sdk.StopRequest) (sdk.StopResult, error) {
	return sdk.StopResult{Stopped: true}, nil
}

// reaper records its passes and returns one decision per pass; it marks
// one attempt through whatever board it is given.
type reaper struct {
	sdk.Reaper
	name   string
	mu     sync.Mutex
	passes []sdk.Pass
	fail   error
	hang   chan struct{} // when set, a pass signals here and blocks until its ctx is done
	alive  int           // decisions about live attempts a pass records first, 100 at a time
	calls  *callLog      // when set, each pass is noted in it
	during func()        // when set, runs at the end of each pass (a slow one moves the clock)
}

func (r *reaper) Reap(ctx context.Context, pass sdk.Pass, board sdk.Board, exec sdk.Executions, sink sdk.Sink) (sdk.PassResult, error) {
	r.mu.Lock()
	r.passes = append(r.passes, pass)
	r.mu.Unlock()
	r.calls.add("reap " + r.name)
	if r.fail != nil {
		return sdk.PassResult{}, r.fail
	}
	if r.hang != nil {
		r.hang <- struct{}{}
		<-ctx.Done()
		return sdk.PassResult{}, ctx.Err()
	}
	for i := 0; i < r.alive; i += 100 {
		ds := make([]sdk.Decision, min(100, r.alive-i))
		for k := range ds {
			ds[k] = sdk.Decision{Label: sdk.LabelAgentLostProcessAlive,
				Attempt: sdk.Attempt{RunID: "live", TaskID: fmt.Sprintf("t%05d", i+k), Try: 1}}
		}
		if err := sink.Record(ctx, ds); err != nil {
			return sdk.PassResult{}, err
		}
	}
	a := sdk.Attempt{RunID: "r", TaskID: r.name, Try: 1}
	res, err := board.Mark(ctx, []sdk.Mark{{Attempt: a, FromStates: []string{sdk.StateRunning}, Term: pass.Term}})
	if err != nil {
		return sdk.PassResult{}, err
	}
	if _, err := exec.StopOrphan(ctx, sdk.StopRequest{Attempt: a}); err != nil {
		return sdk.PassResult{}, err
	}
	if err := sink.Record(ctx, []sdk.Decision{{Label: sdk.LabelAgentLost, Attempt: a, Applied: res[0].Applied}}); err != nil {
		return sdk.PassResult{}, err
	}
	if r.during != nil {
		r.during()
	}
	return sdk.PassResult{State: append(append([]byte{}, pass.State...), '.')}, nil
}

func (r *reaper) passCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.passes)
}

// board records marks; everything else is unused here.
type board struct {
	sdk.Board
	mu    sync.Mutex
	marks []sdk.Mark
}

func (b *board) Mark(_ context.Context, ms []sdk.Mark) ([]sdk.MarkResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.marks = append(b.marks, ms...)
	out := make([]sdk.MarkResult, len(ms))
	for i, m := range ms {
		out[i] = sdk.MarkResult{Attempt: m.Attempt, Applied: true}
	}
	return out, nil
}

type audit struct {
	mu   sync.Mutex
	rows []sdk.Decision
}

func (a *audit) RecordDecisions(_ context.Context, _ int64, _ time.Time, ds []sdk.Decision) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rows = append(a.rows, ds...)
	return nil
}

type bundle struct {
	clock   *clock.Fake
	lead    *byhand.Lead
	sub     *substrate
	reapers []*reaper
	plugins []*byhand.Static[sdk.Reaper]
	board   *board
	audit   *audit
	loop    *cycle.Loop
	metrics *metrics.Metrics
}

func setup(t *testing.T, dryRun bool, names ...string) *bundle {
	t.Helper()
	b := &bundle{
		clock: clock.NewFake(t0), lead: &byhand.Lead{}, sub: &substrate{synced: true},
		board: &board{}, audit: &audit{}, metrics: metrics.New(),
	}
	var rs []cycle.Reaper
	for _, n := range names {
		r := &reaper{name: n}
		b.reapers = append(b.reapers, r)
		p := &byhand.Static[sdk.Reaper]{V: r}
		b.plugins = append(b.plugins, p)
		rs = append(rs, cycle.Reaper{Name: n, Plugin: p, Labels: []string{sdk.LabelAgentLost, sdk.LabelAgentLostProcessAlive}})
	}
	b.loop = cycle.New(cycle.Config{
		Ladder: ladder.Defaults(), Edition: ladder.EditionLite, DryRun: dryRun,
		Clock: b.clock, Metrics: b.metrics,
	}, b.lead, b.board, b.audit, &byhand.Static[sdk.Substrate]{V: b.sub}, rs)
	return b
}

func labels(ds []sdk.Decision) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Label
	}
	return out
}

func TestGateInTheLoop(t *testing.T) {
	t.Run("FollowerNeverReaps", func(t *testing.T) {
		b := setup(t, false, "agentlost")
		res := b.loop.RunOnce(context.Background())
		if res.Leading || b.sub.sweeps != 0 || b.reapers[0].passCount() != 0 {
			t.Fatalf("a follower swept or reaped: %+v", res)
		}
	})

	t.Run("HoldsForGraceRecordingASkipEachCycle", func(t *testing.T) {
		b := setup(t, false, "agentlost")
		b.lead.Set(leader.Status{Leading: true, Term: 1, Since: t0})
		for i := 0; i < 6; i++ { // 0s .. 150s: inside the 180s grace
			res := b.loop.RunOnce(context.Background())
			if res.Gate.Open || len(res.Decisions) != 1 || res.Decisions[0].Label != sdk.LabelSettlingSkip {
				t.Fatalf("cycle %d: %+v", i, res)
			}
			b.clock.Advance(30 * time.Second)
		}
		if n := b.reapers[0].passCount(); n != 0 {
			t.Fatalf("reaped %d times inside the grace", n)
		}
		res := b.loop.RunOnce(context.Background()) // 180s
		if !res.Gate.Open || len(res.Reaped) != 1 {
			t.Fatalf("did not open at the grace: %+v", res)
		}
		if len(b.audit.rows) != 7 {
			t.Fatalf("audit rows = %d, want 6 skips and 1 decision", len(b.audit.rows))
		}
	})

	t.Run("ValveOpensAtTwiceGraceWhenNeverSynced", func(t *testing.T) {
		b := setup(t, false, "agentlost")
		b.sub.synced = false
		b.lead.Set(leader.Status{Leading: true, Term: 1, Since: t0})
		b.clock.Advance(359 * time.Second)
		if res := b.loop.RunOnce(context.Background()); res.Gate.Open {
			t.Fatalf("valve opened before 2 x grace: %+v", res)
		}
		for i := 0; i < 3; i++ {
			b.clock.Advance(30 * time.Second)
			res := b.loop.RunOnce(context.Background())
			if !res.Gate.Valve || len(res.Reaped) != 1 || res.Decisions[0].Label != sdk.LabelSettlingValveOpen {
				t.Fatalf("cycle %d: %+v", i, res)
			}
		}
	})

	t.Run("LosingAndRegainingLeadershipResetsTheGate", func(t *testing.T) {
		b := setup(t, false, "agentlost")
		b.lead.Set(leader.Status{Leading: true, Term: 1, Since: t0})
		b.clock.Advance(180 * time.Second)
		if res := b.loop.RunOnce(context.Background()); !res.Gate.Open {
			t.Fatalf("term 1 did not settle: %+v", res)
		}
		b.lead.Set(leader.Status{Leading: false, Term: 1, Since: t0})
		b.clock.Advance(30 * time.Second)
		b.loop.RunOnce(context.Background())
		b.lead.Set(leader.Status{Leading: true, Term: 3, Since: b.clock.Now()})
		b.clock.Advance(30 * time.Second)
		res := b.loop.RunOnce(context.Background())
		if res.Gate.Open || res.Term != 3 || labels(res.Decisions)[0] != sdk.LabelSettlingSkip {
			t.Fatalf("re-election did not reset the gate: %+v", res)
		}
	})
}

func TestCycle(t *testing.T) {
	settled := func(t *testing.T, b *bundle) {
		t.Helper()
		b.lead.Set(leader.Status{Leading: true, Term: 1, Since: t0})
		b.clock.Advance(180 * time.Second)
	}

	t.Run("ReapersRunInOrderWithTheirStateCarried", func(t *testing.T) {
		b := setup(t, false, "dispatchlost", "agentlost", "orphanrun")
		settled(t, b)
		for i := 0; i < 2; i++ {
			res := b.loop.RunOnce(context.Background())
			if got := res.Reaped; len(got) != 3 || got[0] != "dispatchlost" || got[2] != "orphanrun" {
				t.Fatalf("reaped %v", got)
			}
		}
		p := b.reapers[1].passes[1]
		if string(p.State) != "." || p.Term != 1 || !p.Now.Equal(b.clock.Now()) || p.DryRun {
			t.Fatalf("second pass = %+v", p)
		}
		// The second of three reapers gets half of what is left of the budget.
		if !p.Deadline.Equal(p.Now.Add(15 * time.Second)) {
			t.Fatalf("deadline %v after the pass's start, want its share (15s)", p.Deadline.Sub(p.Now))
		}
	})

	// A pass's decisions are all metered and audited, and its write covered
	// by its own decision, while the cycle's result keeps only the first
	// ResultDecisions of them and counts the rest.
	t.Run("AMassPassIsMeteredAndAuditedNotAllHeld", func(t *testing.T) {
		b := setup(t, false, "agentlost")
		settled(t, b)
		b.reapers[0].alive = 1500
		res := b.loop.RunOnce(context.Background())
		if len(res.Reaped) != 1 || res.DecisionCount != 1501 || len(res.Decisions) != cycle.ResultDecisions {
			t.Fatalf("reaped %v, %d decisions counted, %d kept", res.Reaped, res.DecisionCount, len(res.Decisions))
		}
		b.audit.mu.Lock()
		rows := len(b.audit.rows)
		lostOnly := 0
		for _, d := range b.audit.rows {
			if d.Label == sdk.LabelAgentLost && d.Applied && d.Evidence[hostaudit.EvRecovered] == "" {
				lostOnly++
			}
		}
		b.audit.mu.Unlock()
		if rows != 1501 || lostOnly != 1 {
			t.Fatalf("%d audit rows (want 1501), %d of them the reaper's own applied agent_lost (want 1: no host-made one)", rows, lostOnly)
		}
		if n := decisionsMetered(t, b.metrics, sdk.LabelAgentLostProcessAlive); n != 1500 {
			t.Fatalf("%v %s decisions metered, want 1500", n, sdk.LabelAgentLostProcessAlive)
		}
	})

	t.Run("ReconcileOverrunDoesNotStarveTheReapPhase", func(t *testing.T) {
		b := setup(t, false, "agentlost")
		settled(t, b) // the first sweep would settle; make the very first one hang
		b.sub.sweepBlocks = true
		b.sub.started = make(chan struct{}, 1)
		b.sub.synced = true
		done := make(chan cycle.Result)
		go func() { done <- b.loop.RunOnce(context.Background()) }()
		<-b.sub.started
		b.clock.Advance(30 * time.Second) // the reconcile budget runs out
		res := <-done
		if len(res.Overruns) != 1 || res.Overruns[0] != "reconcile" || res.Swept {
			t.Fatalf("overruns %v swept %v", res.Overruns, res.Swept)
		}
		// No sweep completed in this term, so the gate holds (valve at 360s)...
		if res.Gate.Open {
			t.Fatalf("gate opened without a sweep: %+v", res.Gate)
		}
		// ...until the valve: then a hung sweep still leaves the reap phase
		// its own full budget.
		b.clock.Advance(150 * time.Second)
		go func() { done <- b.loop.RunOnce(context.Background()) }()
		<-b.sub.started
		b.clock.Advance(30 * time.Second)
		res = <-done
		if !res.Gate.Valve || len(res.Reaped) != 1 {
			t.Fatalf("reap phase starved: %+v", res)
		}
	})

	t.Run("OverrunTicksAreCoalesced", func(t *testing.T) {
		b := setup(t, false, "agentlost")
		b.lead.Set(leader.Status{Leading: true, Term: 1, Since: t0})
		b.sub.ignoreCtx = make(chan struct{})
		b.sub.started = make(chan struct{}, 10)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		stopped := make(chan struct{})
		go func() { b.loop.Run(ctx); close(stopped) }()
		if err := b.clock.BlockUntil(ctx, 1); err != nil { // the loop's ticker is registered
			t.Fatal(err)
		}
		b.clock.Advance(30 * time.Second) // tick 1: the cycle starts and hangs
		<-b.sub.started
		b.clock.Advance(100 * time.Second) // ticks at 60, 90, 120 fall due meanwhile
		b.sub.ignoreCtx <- struct{}{}      // cycle 1 ends
		<-b.sub.started                    // one coalesced tick starts cycle 2 at once
		b.sub.ignoreCtx <- struct{}{}      // cycle 2 ends
		select {
		case <-b.sub.started:
			t.Fatal("a third cycle ran without a new tick: ticks were queued, not coalesced")
		case <-time.After(200 * time.Millisecond):
		}
		cancel()
		<-stopped
	})

	t.Run("PassErrorIsRecordedAndOtherReapersStillRun", func(t *testing.T) {
		b := setup(t, false, "dispatchlost", "agentlost", "orphanrun")
		b.reapers[0].fail = errors.New("boom")
		settled(t, b)
		res := b.loop.RunOnce(context.Background())
		if len(res.Reaped) != 2 || res.Reaped[0] != "agentlost" {
			t.Fatalf("reaped %v", res.Reaped)
		}
		if labels(res.Decisions)[0] != sdk.LabelPassError {
			t.Fatalf("decisions %v", labels(res.Decisions))
		}
	})

	t.Run("AHungReaperCostsOnlyItsShareAndIsRecycled", func(t *testing.T) {
		b := setup(t, false, "hung", "agentlost", "orphanrun")
		b.reapers[0].hang = make(chan struct{}, 1)
		settled(t, b)
		done := make(chan cycle.Result)
		go func() { done <- b.loop.RunOnce(context.Background()) }()
		<-b.reapers[0].hang
		b.clock.Advance(10 * time.Second) // its share: a third of the 30s budget
		res := <-done
		if got := res.Reaped; len(got) != 2 || got[0] != "agentlost" || got[1] != "orphanrun" {
			t.Fatalf("reapers after the hung one: %v", got)
		}
		if labels(res.Decisions)[0] != sdk.LabelPluginUnavailable {
			t.Fatalf("decisions %v", labels(res.Decisions))
		}
		p := b.reapers[1].passes[0]
		if !p.Deadline.Equal(p.Now.Add(10 * time.Second)) {
			t.Fatalf("second reaper's deadline %v after its start, want its share of what was left (10s)", p.Deadline.Sub(p.Now))
		}
		if b.plugins[0].Recycled != 1 || b.plugins[1].Recycled != 0 {
			t.Fatalf("recycled %d and %d times, want the hung one once", b.plugins[0].Recycled, b.plugins[1].Recycled)
		}
	})

	t.Run("AHungLastReaperIsRecycledWhenThePhaseBudgetEnds", func(t *testing.T) {
		b := setup(t, false, "agentlost", "hung")
		b.reapers[1].hang = make(chan struct{}, 1)
		settled(t, b)
		done := make(chan cycle.Result)
		go func() { done <- b.loop.RunOnce(context.Background()) }()
		<-b.reapers[1].hang
		b.clock.Advance(30 * time.Second) // its share is all that was left of the phase
		res := <-done
		if b.plugins[1].Recycled != 1 || labels(res.Decisions)[len(res.Decisions)-1] != sdk.LabelPluginUnavailable {
			t.Fatalf("recycled %d times, decisions %v", b.plugins[1].Recycled, labels(res.Decisions))
		}
	})

	t.Run("DryRunWritesAndStopsNothingEvenIfThePluginTries", func(t *testing.T) {
		b := setup(t, true, "agentlost")
		settled(t, b)
		res := b.loop.RunOnce(context.Background())
		if len(b.board.marks) != 0 {
			t.Fatalf("dry run wrote %d marks", len(b.board.marks))
		}
		d := res.Decisions[len(res.Decisions)-1]
		if !d.DryRun || d.Applied || !b.reapers[0].passes[0].DryRun {
			t.Fatalf("decision %+v, pass dry-run %v", d, b.reapers[0].passes[0].DryRun)
		}
		if len(b.audit.rows) == 0 || !b.audit.rows[len(b.audit.rows)-1].DryRun {
			t.Fatalf("dry-run decision not audited as such: %+v", b.audit.rows)
		}
	})
}

// decisionsMetered reads the decisions counter of the label.
func decisionsMetered(t *testing.T, m *metrics.Metrics, label string) float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, f := range fams {
		if f.GetName() != "dexaflow_scheduler_decisions_total" {
			continue
		}
		for _, mt := range f.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if lp.GetName() == "decision_type" && lp.GetValue() == label {
					total += mt.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

package cycle_test

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/host/cycle"
	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/testkit/byhand"
)

// logLines collects a JSON hclog logger's lines, from several goroutines.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// entries parses each line written so far.
func (l *logLines) entries(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.buf.String()), "\n") {
		if line == "" {
			continue
		}
		e := map[string]any{}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, e)
	}
	return out
}

// logged rebuilds b's loop with a logger that writes every level, as JSON,
// to the returned lines.
func logged(b *bundle, names ...string) *logLines {
	logs := &logLines{}
	var rs []cycle.Reaper
	for i, n := range names {
		rs = append(rs, cycle.Reaper{Name: n, Plugin: b.plugins[i], Labels: []string{sdk.LabelAgentLost}})
	}
	b.loop = cycle.New(cycle.Config{
		Ladder: ladder.Defaults(), Edition: ladder.EditionLite, Clock: b.clock, Metrics: b.metrics,
		Logger: hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Trace, JSONFormat: true}),
	}, b.lead, b.board, b.audit, &byhand.Static[sdk.Substrate]{V: b.sub}, rs)
	return logs
}

// settle makes b's loop the leader since t0, the grace passed.
func settle(b *bundle) {
	b.lead.Set(leader.Status{Leading: true, Term: 1, Since: t0})
	b.clock.Advance(180 * time.Second)
}

// The specification's cycle: the reconcile sweep first, then the reapers in
// their configured order, every cycle; the order is the loop's own, not
// timers lining up.
func TestTheSweepRunsBeforeTheReapersInsideOneCycle(t *testing.T) {
	names := []string{"dispatchlost", "podlost", "agentlost", "warmworker", "orphanrun"}
	b := setup(t, false, names...)
	calls := &callLog{}
	b.sub.calls = calls
	for _, r := range b.reapers {
		r.calls = calls
	}
	settle(b)
	want := []string{"sweep"}
	for _, n := range names {
		want = append(want, "reap "+n)
	}
	for i := 0; i < 3; i++ {
		res := b.loop.RunOnce(context.Background())
		if !res.Swept || len(res.Reaped) != len(names) {
			t.Fatalf("cycle %d: swept %v, reaped %v", i, res.Swept, res.Reaped)
		}
		if got := calls.take(); !slices.Equal(got, want) {
			t.Fatalf("cycle %d called %v, want %v", i, got, want)
		}
		b.clock.Advance(30 * time.Second)
	}
}

// levelsOf lists the entries at a level whose message contains msg.
func levelsOf(entries []map[string]any, msg string) []string {
	var out []string
	for _, e := range entries {
		if m, _ := e["@message"].(string); strings.Contains(m, msg) {
			lvl, _ := e["@level"].(string)
			out = append(out, lvl)
		}
	}
	return out
}

func errorsIn(entries []map[string]any) []string {
	var out []string
	for _, e := range entries {
		if e["@level"] == "error" {
			out = append(out, e["@message"].(string))
		}
	}
	return out
}

// A phase that outlives its budget of one interval is a load signal: one
// WARN naming the budget, no ERROR, and not an error of the cycle (the
// sweep still counts as done, the pass as run, no error decision).
func TestPhaseOverrunIsAWarnNeverAnError(t *testing.T) {
	t.Run("SlowSweepThatFinishes", func(t *testing.T) {
		b := setup(t, false, "agentlost")
		logs := logged(b, "agentlost")
		settle(b)
		b.sub.during = func() { b.clock.Advance(31 * time.Second) }
		res := b.loop.RunOnce(context.Background())
		if !slices.Equal(res.Overruns, []string{"reconcile"}) || !res.Swept || len(res.Reaped) != 1 {
			t.Fatalf("overruns %v, swept %v, reaped %v: want a reconcile overrun that is not a failure",
				res.Overruns, res.Swept, res.Reaped)
		}
		overrunLogged(t, logs, "reconcile phase overran its budget")
		noErrorDecision(t, res)
	})

	t.Run("SlowReapPassThatFinishes", func(t *testing.T) {
		b := setup(t, false, "agentlost")
		logs := logged(b, "agentlost")
		settle(b)
		b.reapers[0].during = func() { b.clock.Advance(31 * time.Second) }
		res := b.loop.RunOnce(context.Background())
		if !slices.Equal(res.Overruns, []string{"reap"}) || !slices.Equal(res.Reaped, []string{"agentlost"}) {
			t.Fatalf("overruns %v, reaped %v: want a reap overrun whose pass still counts", res.Overruns, res.Reaped)
		}
		overrunLogged(t, logs, "reap phase overran its budget")
		noErrorDecision(t, res)
	})

	t.Run("HungSweepCutAtItsBudget", func(t *testing.T) {
		b := setup(t, false, "agentlost")
		logs := logged(b, "agentlost")
		settle(b)
		b.sub.sweepBlocks = true
		b.sub.started = make(chan struct{}, 1)
		done := make(chan cycle.Result)
		go func() { done <- b.loop.RunOnce(context.Background()) }()
		<-b.sub.started
		b.clock.Advance(30 * time.Second)
		res := <-done
		if !slices.Equal(res.Overruns, []string{"reconcile"}) {
			t.Fatalf("overruns %v", res.Overruns)
		}
		overrunLogged(t, logs, "reconcile phase overran its budget")
		noErrorDecision(t, res)
	})
}

func overrunLogged(t *testing.T, logs *logLines, msg string) {
	t.Helper()
	entries := logs.entries(t)
	if got := levelsOf(entries, msg); !slices.Equal(got, []string{"warn"}) {
		t.Fatalf("%q logged at %v, want once at warn", msg, got)
	}
	// JSON renders a duration in nanoseconds.
	for _, e := range entries {
		if m, _ := e["@message"].(string); strings.Contains(m, msg) && e["budget"] != float64(30*time.Second) {
			t.Fatalf("the overrun's WARN does not name the budget: %v", e)
		}
	}
	if errs := errorsIn(entries); len(errs) != 0 {
		t.Fatalf("an overrun logged at ERROR: %q", errs)
	}
}

func noErrorDecision(t *testing.T, res cycle.Result) {
	t.Helper()
	for _, d := range res.Decisions {
		if d.Label == sdk.LabelPassError || d.Label == sdk.LabelPluginUnavailable {
			t.Fatalf("an overrun recorded %s: %+v", d.Label, d)
		}
	}
}

// What the sweep reports it overrode (a durable SUCCESS over a provisional
// infra mark) is counted in dexaflow_reconcile_infra_override_total, by the
// mark it overrode.
func TestSweepOverridesAreCountedByMark(t *testing.T) {
	b := setup(t, false, "agentlost")
	b.sub.overrides = map[string]int64{sdk.LabelPodLost: 2, sdk.LabelDispatchLost: 1}
	settle(b)
	for i := 0; i < 2; i++ {
		if res := b.loop.RunOnce(context.Background()); !res.Swept {
			t.Fatalf("cycle %d did not sweep", i)
		}
		b.clock.Advance(30 * time.Second)
	}
	got := overridesMetered(t, b)
	want := map[string]float64{sdk.LabelPodLost: 4, sdk.LabelDispatchLost: 2}
	if len(got) != len(want) || got[sdk.LabelPodLost] != want[sdk.LabelPodLost] || got[sdk.LabelDispatchLost] != want[sdk.LabelDispatchLost] {
		t.Fatalf("dexaflow_reconcile_infra_override_total = %v, want %v", got, want)
	}

	// The substrate is a plugin too: its words become metric labels and
	// audit rows only when the host knows them. An override of a mark no
	// reaper declared is metered under a fixed label; a decision under a
	// reaper's name, or a label no sweep records, is refused.
	t.Run("OnlyKnownMarksAndTheSweepsOwnLabels", func(t *testing.T) {
		b := setup(t, false, "agentlost")
		a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}
		b.sub.overrides = map[string]int64{sdk.LabelPodLost: 1, "made_up_mark_" + strings.Repeat("x", 200): 3}
		b.sub.decisions = []sdk.Decision{
			{Label: sdk.LabelReconcileSettled, Attempt: a, Applied: true},
			{Reaper: "agentlost", Label: sdk.LabelReconcileInfraConfirmed, Attempt: a, Applied: true},
			{Label: "made_up_label", Attempt: a, Applied: true},
		}
		settle(b)
		res := b.loop.RunOnce(context.Background())
		if !res.Swept {
			t.Fatalf("the cycle did not sweep: %+v", res)
		}
		want := []string{sdk.LabelReconcileSettled, sdk.LabelBoardRefusedForeignReaper, sdk.LabelBoardRefusedUndeclaredLabel}
		var got []string
		for _, d := range res.Decisions {
			if d.Reaper == "substrate" {
				got = append(got, d.Label)
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("the sweep's decisions %v, want %v", got, want)
		}
		if got := overridesMetered(t, b); len(got) != 2 || got[sdk.LabelPodLost] != 1 || got["undeclared"] != 3 {
			t.Fatalf("dexaflow_reconcile_infra_override_total = %v, want pod_lost 1 and undeclared 3", got)
		}
	})

	t.Run("AFailedSweepCountsNone", func(t *testing.T) {
		b := setup(t, false, "agentlost")
		settle(b)
		b.sub.sweepBlocks = true
		b.sub.started = make(chan struct{}, 1)
		done := make(chan cycle.Result)
		go func() { done <- b.loop.RunOnce(context.Background()) }()
		<-b.sub.started
		b.clock.Advance(30 * time.Second)
		<-done
		if got := overridesMetered(t, b); len(got) != 0 {
			t.Fatalf("a sweep cut off counted overrides: %v", got)
		}
	})
}

// overridesMetered reads dexaflow_reconcile_infra_override_total by mark.
func overridesMetered(t *testing.T, b *bundle) map[string]float64 {
	t.Helper()
	fams, err := b.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "dexaflow_reconcile_infra_override_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "mark" {
					out[lp.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

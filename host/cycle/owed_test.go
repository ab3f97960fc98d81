package cycle_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	pgboard "github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/host/cycle"
	"github.com/dexaflow/reaper/host/metrics"
	"github.com/dexaflow/reaper/host/owed"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/testkit/byhand"
)

// withOwed runs a cycle of loop, then a run of the owed teardowns, and
// returns the cycle's result with the retries' decisions and overrun, as
// the daemon's RunCycle does.
func withOwed(ctx context.Context, loop *cycle.Loop, o *owed.Service) cycle.Result {
	res := loop.RunOnce(ctx)
	paid := o.RunOnce(ctx)
	res.Decisions = append(res.Decisions, paid.Decisions...)
	res.DecisionCount += len(paid.Decisions)
	if paid.Overran {
		res.Overruns = append(res.Overruns, "teardown")
	}
	return res
}

// A teardown the pass's share cut short is owed; its retry runs after the
// reapers, under a budget of its own, and a retry that overruns it is a
// WARN that cost the reapers nothing.
func TestOwedTeardownRetries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := ladder.Defaults()
	w := newWorld(t, "mark_teardown", nil)
	m := metrics.New()
	sub := &byhand.Static[sdk.Substrate]{V: w.exec}
	paying := owed.New(owed.Config{Interval: l.MaintenanceInterval, Clock: w.clock, Metrics: m,
		Declared: map[string][]string{"agentlost": w.info.DecisionLabels}}, w.lead, w.store, sub, w.store)
	paying.TestSignals.Init(t)
	w.loop = cycle.New(cycle.Config{Ladder: l, Edition: ladder.EditionLite, Clock: w.clock, Owed: paying, Metrics: m},
		w.lead, w.store, w.store, sub,
		[]cycle.Reaper{{Name: "agentlost", Plugin: &byhand.Static[sdk.Reaper]{V: w.reaper}, MarkReasons: w.info.MarkReasons,
			Labels: w.info.DecisionLabels}})

	run := func() cycle.Result {
		done := make(chan cycle.Result)
		go func() { done <- withOwed(ctx, w.loop, paying) }()
		for {
			select {
			case <-w.exec.tearing:
				w.clock.Advance(l.MaintenanceInterval) // the teardown hangs past every budget
			case res := <-done:
				return res
			}
		}
	}

	t.Run("TeardownCutShort_Owed", func(t *testing.T) {
		run() // the pass is cut off at its share, its teardown with it
		w.marked(t)
		// The host's side of the cut teardown answers the plugin's
		// cancellation on the broker's goroutine, maybe after the cycle.
		paying.TestSignals.Owed.WaitOrTimeout()
		rows, err := w.store.OwedTeardownsFor(ctx, "run", "task")
		if err != nil || len(rows) != 1 || rows[0].Tries != 1 || rows[0].Reaper != "agentlost" ||
			rows[0].Label != sdk.LabelAgentLostPodDeleteErr {
			t.Fatalf("owed rows %+v, %v", rows, err)
		}
	})
	t.Run("RetryOverrunsItsBudget_AfterTheReapersAndWarned", func(t *testing.T) {
		w.clock.Advance(l.MaintenanceInterval) // the retry is due
		res := run()
		if !slices.Contains(res.Overruns, "teardown") || slices.Contains(res.Overruns, "reap") {
			t.Fatalf("overruns %v", res.Overruns)
		}
		if !slices.Contains(res.Reaped, "agentlost") {
			t.Fatalf("the reapers were starved: %+v", res)
		}
		var failed bool
		for _, d := range res.Decisions {
			failed = failed || (d.Label == sdk.LabelAgentLostPodDeleteErr && d.Attempt == w.attempt && !d.Applied)
		}
		if !failed {
			t.Fatalf("the failed retry was not decided: %+v", res.Decisions)
		}
		rows, err := w.store.OwedTeardownsFor(ctx, "run", "task")
		if err != nil || len(rows) != 1 || rows[0].Tries != 2 {
			t.Fatalf("owed rows %+v, %v", rows, err)
		}
		// Audited like any decision.
		recs, err := w.store.DecisionsFor(ctx, "run", "task", 0)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, r := range recs {
			if r.Label == sdk.LabelAgentLostPodDeleteErr {
				n++
			}
		}
		if n < 1 {
			t.Fatalf("no %s in the audit: %+v", sdk.LabelAgentLostPodDeleteErr, recs)
		}
	})
	t.Run("NotLeading_NothingTried", func(t *testing.T) {
		st := w.lead.Status(time.Time{})
		st.Leading = false
		w.lead.Set(st)
		w.clock.Advance(time.Hour)
		res := withOwed(ctx, w.loop, paying) // a retry would block on tearing: none may start
		if res.Leading {
			t.Fatal("leading")
		}
		rows, err := w.store.OwedTeardownsFor(ctx, "run", "task")
		if err != nil || len(rows) != 1 || rows[0].Tries != 2 {
			t.Fatalf("owed rows %+v, %v", rows, err)
		}
	})
}

// A teardown owed for an attempt that is still its task's live current
// attempt (a reaper tore down what it had not marked) is never tried: the
// host defers it and says so each time it is due.
func TestOwedTeardownOfALiveAttemptNeverTried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := ladder.Defaults()
	w := newWorld(t, "mark_teardown", nil)
	sub := &byhand.Static[sdk.Substrate]{V: w.exec}
	paying := owed.New(owed.Config{Interval: l.MaintenanceInterval, Clock: w.clock}, w.lead, w.store, sub, w.store)
	loop := cycle.New(cycle.Config{Ladder: l, Edition: ladder.EditionLite, Clock: w.clock, Owed: paying, Metrics: metrics.New()},
		w.lead, w.store, w.store, sub, nil)
	a := w.attempt
	if _, err := w.store.OweTeardown(ctx, pgboard.TeardownFailure{RunID: a.RunID, Attempt: &a, Reaper: "thirdparty",
		Label: sdk.LabelTeardownOwedError, Reason: "its_own", Error: "timeout", At: w.clock.Now(), Term: w.term},
		pgboard.TeardownBackoff{Base: l.MaintenanceInterval, Cap: owed.BackoffCapDefault}); err != nil {
		t.Fatal(err)
	}
	w.clock.Advance(l.MaintenanceInterval)
	res := withOwed(ctx, loop, paying)
	if len(w.exec.tearing) != 0 {
		t.Fatal("the live attempt was torn down")
	}
	var deferred bool
	for _, d := range res.Decisions {
		deferred = deferred || (d.Label == sdk.LabelTeardownOwedError && d.Attempt == a && !d.Applied && d.Reaper == "thirdparty")
	}
	if !deferred {
		t.Fatalf("no deferral decided: %+v", res.Decisions)
	}
	rows, err := w.store.OwedTeardownsFor(ctx, a.RunID, a.TaskID)
	if err != nil || len(rows) != 1 || rows[0].Tries != 2 || !strings.HasPrefix(rows[0].LastError, "not tried") {
		t.Fatalf("owed rows %+v, %v", rows, err)
	}
	if ti, err := w.store.TaskInstance(ctx, a.RunID, a.TaskID); err != nil || ti.State != sdk.StateRunning {
		t.Fatalf("the attempt: %+v, %v", ti, err)
	}
}

package board_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// The rule the test suites check at the end of a scenario: every write a
// reaper applied (a mark, an orphan run's reap) has an applied decision in
// the audit. UnauditedMarks names each one that has not, and forgets it
// once its decision is written.
func TestUnauditedMarks_EveryAppliedMarkHasItsDecision(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.run(t, "run", "lost", "alive", "noop")
	lost, alive, noop := first("run", "lost"), first("run", "alive"), first("run", "noop")
	for _, a := range []sdk.Attempt{lost, alive, noop} {
		b.running(t, a, base.Add(-10*time.Minute), base.Add(-5*time.Minute))
	}
	mark := func(a sdk.Attempt) sdk.Mark {
		return sdk.Mark{Attempt: a, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
			Reason: sdk.LabelAgentLost, Message: "agent_lost: silent", Term: b.term, At: base}
	}
	res, err := b.store.Mark(ctx, []sdk.Mark{mark(lost), mark(noop)})
	if err != nil || !res[0].Applied || !res[1].Applied {
		t.Fatalf("marks: %+v, %v", res, err)
	}
	check := func(want ...sdk.Attempt) {
		t.Helper()
		got, err := b.store.UnauditedMarks(ctx, base.Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if len(want) == 0 && len(got) == 0 {
			return
		}
		attempts := make([]sdk.Attempt, len(got))
		for i, m := range got {
			attempts[i] = m.Attempt
		}
		if !reflect.DeepEqual(attempts, want) {
			t.Fatalf("unaudited %v, want %v", got, want)
		}
	}
	check(lost, noop)
	if got, _ := b.store.UnauditedMarks(ctx, base.Add(-time.Hour)); got[0].Reason != sdk.LabelAgentLost ||
		got[0].Message != "agent_lost: silent" || !got[0].At.Equal(base) {
		t.Fatalf("unaudited mark %+v, want its reason, message and time", got[0])
	}

	// A decision that did not apply (a deferral) does not audit a mark;
	// one that applied does.
	if err := b.store.RecordDecisions(ctx, b.term, base, []sdk.Decision{
		{Reaper: "agentlost", Label: sdk.LabelAgentLostProcessAlive, Attempt: noop},
		{Reaper: "agentlost", Label: sdk.LabelAgentLost, Attempt: lost, Applied: true},
	}); err != nil {
		t.Fatal(err)
	}
	check(noop)

	// Marks older than since are not looked at.
	if got, err := b.store.UnauditedMarks(ctx, base.Add(time.Second)); err != nil || len(got) != 0 {
		t.Fatalf("unaudited since after the marks: %v, %v", got, err)
	}

	// An orphan run's reap is a write of a reaper too.
	b.run(t, "quiet", "task")
	a := first("quiet", "task")
	b.running(t, a, base.Add(-time.Hour), base.Add(-50*time.Minute))
	if stop, err := b.w.Report(ctx, a, lifecycleSuccess, base.Add(-40*time.Minute)); err != nil || stop {
		t.Fatal(stop, err)
	}
	rr, err := b.store.ReapRun(ctx, sdk.RunReap{RunID: "quiet", OlderThan: base.Add(-5 * time.Minute), Term: b.term,
		At: base, Message: sdk.LabelOrphanRun + ": nothing live"})
	if err != nil || !rr.Applied {
		t.Fatalf("reap run: %+v, %v", rr, err)
	}
	check(sdk.Attempt{RunID: "quiet"}, noop) // ordered by run
	if err := b.store.RecordDecisions(ctx, b.term, base, []sdk.Decision{
		{Reaper: "agentlost", Label: sdk.LabelAgentLost, Attempt: noop, Applied: true},
		{Reaper: "orphanrun", Label: sdk.LabelOrphanRun, Attempt: sdk.Attempt{RunID: "quiet"}, Applied: true},
	}); err != nil {
		t.Fatal(err)
	}
	check()
}

// A mark whose reason is a plugin's own word (its Info's MarkReasons) is
// found only when the caller declares the word: the built-in reasons are
// always searched, nothing else is.
func TestUnauditedMarks_DeclaredReasons(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.run(t, "run", "parked")
	a := first("run", "parked")
	b.running(t, a, base.Add(-10*time.Minute), base.Add(-5*time.Minute))
	res, err := b.store.Mark(ctx, []sdk.Mark{{Attempt: a, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
		Reason: "parked_expired", Message: "parked_expired: a third party's mark", Term: b.term, At: base}})
	if err != nil || !res[0].Applied {
		t.Fatalf("mark: %+v, %v", res, err)
	}
	if got, err := b.store.UnauditedMarks(ctx, base.Add(-time.Hour)); err != nil || len(got) != 0 {
		t.Fatalf("undeclared: unaudited %v, %v; want none", got, err)
	}
	got, err := b.store.UnauditedMarks(ctx, base.Add(-time.Hour), "parked_expired", sdk.LabelAgentLost)
	if err != nil || len(got) != 1 || got[0].Attempt != a || got[0].Reason != "parked_expired" {
		t.Fatalf("declared: unaudited %v, %v; want the parked mark", got, err)
	}
}

// A reconciler's write (a settlement, a confirmation, an override) is found
// like a mark until a decision of its own label is about its attempt; and a
// write whose attempt was released since (retried, re-placed) is found in
// the attempt's history: a leader killed between a sweep's write and its
// audit leaves nothing the next leader cannot audit.
func TestUnauditedMarks_ReconcilerWritesAndReleasedAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.runWith(t, "run", sdk.ExecutorKube, "settled", "confirmed", "overridden", "marked")
	settled, confirmed := first("run", "settled"), first("run", "confirmed")
	overridden, marked := first("run", "overridden"), first("run", "marked")
	for _, a := range []sdk.Attempt{settled, confirmed, overridden, marked} {
		b.running(t, a, base.Add(-10*time.Minute), base.Add(-5*time.Minute))
	}
	markedAt := base.Add(-time.Minute)
	for _, a := range []sdk.Attempt{confirmed, overridden, marked} {
		mark(t, b, sdk.Mark{Attempt: a, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
			Reason: sdk.LabelPodLost, Message: "pod_lost: gone", Term: b.term, At: markedAt})
	}
	// The marks' decisions reached the audit; the sweep's below never do.
	if err := b.store.RecordDecisions(ctx, b.term, markedAt, []sdk.Decision{
		{Reaper: "podlost", Label: sdk.LabelPodLost, Attempt: confirmed, Applied: true},
		{Reaper: "podlost", Label: sdk.LabelPodLost, Attempt: overridden, Applied: true},
	}); err != nil {
		t.Fatal(err)
	}
	applied := func(what string, res []sdk.MarkResult, err error) {
		t.Helper()
		if err != nil || len(res) != 1 || !res[0].Applied {
			t.Fatalf("%s: %+v %v", what, res, err)
		}
	}
	res, err := b.store.Settle(ctx, []sdk.Settlement{{Attempt: settled, Outcome: sdk.OutcomeInfra,
		Reason: sdk.ReasonPodDisrupted, Message: "pod_disrupted: deleted", FromStates: []string{sdk.StateRunning},
		Term: b.term, At: base}})
	applied("settle", res, err)
	res, err = b.store.ConfirmInfra(ctx, []sdk.Confirm{{Attempt: confirmed, Term: b.term, At: base}})
	applied("confirm", res, err)
	res, err = b.store.OverrideInfra(ctx, []sdk.Override{{Attempt: overridden, MarkedAfter: markedAt.Add(-time.Minute),
		Term: b.term, At: base}})
	applied("override", res, err)

	type found struct {
		a          sdk.Attempt
		label      string
		reconciled bool
	}
	check := func(want ...found) {
		t.Helper()
		got, err := b.store.UnauditedMarks(ctx, base.Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		var have []found
		for _, m := range got {
			have = append(have, found{m.Attempt, m.Reason, m.Reconciled})
			if m.Reconciled && !m.At.Equal(base) {
				t.Errorf("%s: found at %v, want the sweep's time %v", m.Attempt, m.At, base)
			}
		}
		if !reflect.DeepEqual(have, want) {
			t.Fatalf("unaudited %+v, want %+v", have, want)
		}
	}
	check(found{confirmed, sdk.LabelReconcileInfraConfirmed, true},
		found{marked, sdk.LabelPodLost, false},
		found{overridden, sdk.LabelReconcileInfraOverride, true},
		found{settled, sdk.LabelReconcileSettled, true})

	// The planner re-places the settled and the confirmed and the marked
	// attempts: each write is still found, from the history.
	for _, a := range []sdk.Attempt{settled, confirmed, marked} {
		if r, err := b.w.Replace(ctx, a, base.Add(time.Second)); err != nil || !r.Applied {
			t.Fatalf("re-place %s: %+v %v", a, r, err)
		}
	}
	check(found{confirmed, sdk.LabelReconcileInfraConfirmed, true},
		found{marked, sdk.LabelPodLost, false},
		found{overridden, sdk.LabelReconcileInfraOverride, true},
		found{settled, sdk.LabelReconcileSettled, true})
	// The new attempts carry none of it.
	if ti := b.ti(t, "run", "settled"); ti.Epoch != 1 {
		t.Fatalf("the settled task was not re-placed: %+v", ti)
	}

	// A decision of another label does not cover a reconciler's write (the
	// mark's own decision does not audit its confirmation); one of its
	// label does.
	if err := b.store.RecordDecisions(ctx, b.term, base, []sdk.Decision{
		{Reaper: "podlost", Label: sdk.LabelPodLost, Attempt: settled, Applied: true},
		{Reaper: "substrate", Label: sdk.LabelReconcileInfraConfirmed, Attempt: confirmed, Applied: true},
		{Reaper: "substrate", Label: sdk.LabelReconcileInfraOverride, Attempt: overridden},
	}); err != nil {
		t.Fatal(err)
	}
	check(found{marked, sdk.LabelPodLost, false},
		found{overridden, sdk.LabelReconcileInfraOverride, true},
		found{settled, sdk.LabelReconcileSettled, true})
	if err := b.store.RecordDecisions(ctx, b.term, base, []sdk.Decision{
		{Reaper: "substrate", Label: sdk.LabelReconcileSettled, Attempt: settled, Applied: true},
		{Reaper: "substrate", Label: sdk.LabelReconcileInfraOverride, Attempt: overridden, Applied: true},
		{Reaper: "podlost", Label: sdk.LabelPodLost, Attempt: marked, Applied: true},
	}); err != nil {
		t.Fatal(err)
	}
	check()
	// Writes older than since are not looked at.
	if got, err := b.store.UnauditedMarks(ctx, base.Add(2*time.Second)); err != nil || len(got) != 0 {
		t.Fatalf("unaudited since after the writes: %v, %v", got, err)
	}
}

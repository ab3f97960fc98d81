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

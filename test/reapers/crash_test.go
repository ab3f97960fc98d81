package reapers_test

import (
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// crashWorld boots the host with dispatchlost then orphanrun, the
// specification's order, and leaves a run whose tasks a scheduler crash
// left queued: queued mid-tick, ten seconds after the host's first cycle,
// and never spawned (no agent, no record). It returns the crash time and
// the queued attempts.
func crashWorld(t *testing.T, runID string) (*world, time.Time, []sdk.Attempt) {
	t.Helper()
	w := newWorld(t, `reaper "dispatchlost" {}
reaper "orphanrun" {}`)
	crash := w.t0.Add(10 * time.Second)
	tasks := []string{"a", "b", "c"}
	w.createRun(runID, w.t0.Add(-time.Minute), tasks...)
	var as []sdk.Attempt
	for _, task := range tasks {
		a := first(runID, task)
		w.queue(a, crash)
		as = append(as, a)
	}
	return w, crash, as
}

// TestCrashSLA_QueuedAttemptsWithTheBudgetSpentAreReapedWithinMaxDispatchLostOrphanRunPlusAnInterval
// is the specification's worst case end to end, at the default ladder: a
// scheduler crash leaves task instances queued with nothing to re-place
// them (their infra budget spent). dispatchlost fails the attempts; its
// marks are not run activity, so orphanrun fails the run within
// max(dispatch_lost, orphan_run) + one interval of the crash, not a full
// orphan_run after the marks.
func TestCrashSLA_QueuedAttemptsWithTheBudgetSpentAreReapedWithinMaxDispatchLostOrphanRunPlusAnInterval(t *testing.T) {
	const runID = "crashed"
	w, crash, as := crashWorld(t, runID)
	w.spendInfraBudget(runID)
	l := ladder.Defaults()
	sla := max(l.DispatchLost, l.OrphanRun) + l.MaintenanceInterval
	deadline := crash.Add(sla)

	var failedAt time.Time
	for w.now().Before(deadline.Add(2 * l.MaintenanceInterval)) {
		w.runCycle()
		if r := w.run(runID); r.State == sdk.RunFailed {
			failedAt = w.now()
			break
		}
		w.advance(l.MaintenanceInterval)
	}
	if failedAt.IsZero() {
		t.Fatalf("the run is still %s %s after the crash (SLA %s)", w.run(runID).State, w.now().Sub(crash), sla)
	}
	t.Logf("crash to failed run: %s (SLA %s)", failedAt.Sub(crash), sla)
	if failedAt.After(deadline) {
		t.Fatalf("the run failed %s after the crash, past the SLA %s", failedAt.Sub(crash), sla)
	}
	for _, a := range as {
		if ti := w.ti(a); ti.State != sdk.StateFailed || ti.LastFailureKind != sdk.FailureInfra ||
			ti.FailureReason != sdk.LabelDispatchLost {
			t.Errorf("%s: %s/%s/%s, want failed on the infra rail as %s", a, ti.State, ti.LastFailureKind,
				ti.FailureReason, sdk.LabelDispatchLost)
		}
	}
	if got := w.run(runID).ErrorMessage; !strings.HasPrefix(got, sdk.LabelOrphanRun) {
		t.Errorf("run error %q, want it failed as %s", got, sdk.LabelOrphanRun)
	}
}

// TestCrashWithTheBudgetLeft_ReplaceableMarkNeverFailsTheRunBeforeTheReplace
// is the same crash with infra budget left: dispatchlost fails the
// attempts, the planner (down with the scheduler) will re-place them, so
// the run lives on through every cycle between the marks and the
// re-place, however long that takes, and after it.
func TestCrashWithTheBudgetLeft_ReplaceableMarkNeverFailsTheRunBeforeTheReplace(t *testing.T) {
	const runID = "crashed"
	w, crash, as := crashWorld(t, runID)
	l := ladder.Defaults()

	marked := false
	for w.now().Before(crash.Add(3 * l.OrphanRun)) {
		w.runCycle()
		if r := w.run(runID); r.State != sdk.RunRunning {
			t.Fatalf("%s after the crash: the run is %s (%s) before its attempts were re-placed",
				w.now().Sub(crash), r.State, r.ErrorMessage)
		}
		marked = marked || w.ti(as[0]).State == sdk.StateFailed
		w.advance(l.MaintenanceInterval)
	}
	if !marked {
		t.Fatal("dispatchlost never failed the queued attempts")
	}
	// The scheduler comes back and re-places the attempts.
	for _, a := range as {
		if rel, err := w.w.Replace(w.ctx, a, w.now()); err != nil || !rel.Applied {
			t.Fatalf("re-place %s: %+v %v", a, rel, err)
		}
	}
	w.runCycle()
	if r := w.run(runID); r.State != sdk.RunRunning {
		t.Fatalf("after the re-place the run is %s (%s)", r.State, r.ErrorMessage)
	}
}

// TestInfraConfirmValve_UnconfirmedMarkWithTheBudgetSpentIsOrphanReapableAfterTheValveNotBefore:
// a run whose only task is a provisional (unconfirmed) infra mark, with no
// budget to re-place it, is held by the mark only while the infra
// confirmation valve is closed; once it has passed the planner acts on the
// mark unconfirmed, so orphanrun fails the run on its next cycle.
func TestInfraConfirmValve_UnconfirmedMarkWithTheBudgetSpentIsOrphanReapableAfterTheValveNotBefore(t *testing.T) {
	const runID = "unconfirmed"
	w := newWorld(t, `reaper "orphanrun" {}`)
	l := ladder.Defaults()
	w.createRun(runID, w.t0.Add(-time.Hour), "task")
	a := first(runID, "task")
	w.drive(a, w.t0.Add(-time.Hour), lifecycle.TerminalReport{}) // running since an hour ago, silent since
	w.spendInfraBudget(runID)

	// The gate opens after the settling grace; the mark lands a cycle
	// before, unconfirmed (as on Kubernetes before the reconciler sees the
	// pods gone).
	w.advance(l.SettlingGrace - l.MaintenanceInterval)
	markedAt := w.now()
	res, err := w.store.Mark(w.ctx, []sdk.Mark{{Attempt: a, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
		Reason: sdk.LabelAgentLost, Message: "agent_lost: silent", Term: w.term, At: markedAt}})
	if err != nil || len(res) != 1 || !res[0].Applied {
		t.Fatalf("mark: %+v %v", res, err)
	}
	if ti := w.ti(a); !ti.InfraConfirmedAt.IsZero() {
		t.Fatalf("the mark was confirmed at %s", ti.InfraConfirmedAt)
	}
	w.advance(l.MaintenanceInterval)

	var failedAt time.Time
	for w.now().Before(markedAt.Add(l.InfraConfirmValve + 2*l.MaintenanceInterval)) {
		w.runCycle()
		if r := w.run(runID); r.State == sdk.RunFailed {
			failedAt = w.now()
			break
		}
		w.advance(l.MaintenanceInterval)
	}
	age := failedAt.Sub(markedAt)
	t.Logf("mark to failed run: %s (valve %s)", age, l.InfraConfirmValve)
	switch {
	case failedAt.IsZero():
		t.Fatalf("the run is still %s %s after the mark (valve %s)", w.run(runID).State, w.now().Sub(markedAt), l.InfraConfirmValve)
	case age < l.InfraConfirmValve:
		t.Fatalf("the run failed %s after the mark, inside the valve %s", age, l.InfraConfirmValve)
	case age > l.InfraConfirmValve+l.MaintenanceInterval:
		t.Fatalf("the run failed %s after the mark, more than a cycle past the valve %s", age, l.InfraConfirmValve)
	}
}

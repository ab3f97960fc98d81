package lifecycle_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
)

// provisional drives attempt a to running and marks it on the infra rail as
// pod_lost, provisional (a kube mark the sweep has not confirmed), at at.
func (b *bundle) provisional(t *testing.T, a sdk.Attempt, at time.Time) {
	t.Helper()
	b.to(t, a, sdk.StateRunning, at.Add(-time.Minute))
	res, err := b.store.Mark(context.Background(), []sdk.Mark{{Attempt: a, FromStates: []string{sdk.StateRunning},
		Kind: sdk.MarkInfra, Reason: sdk.LabelPodLost, Message: "pod_lost: no pod", Term: b.term, At: at}})
	if err != nil || !res[0].Applied {
		t.Fatalf("mark %s: %+v %v", a, res, err)
	}
}

func (b *bundle) decisions(t *testing.T) []board.AuditRecord {
	t.Helper()
	recs, err := b.store.DecisionsFor(context.Background(), "run", "task", 0)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func TestMarkState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	alice := lifecycle.Verdict{State: sdk.StateFailed, Operator: "alice"}

	t.Run("FailedOnAProvisionalInfraMarkClearsTheInfraKindAndIsAuditedWithTheOperator", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.task(t)
		b.provisional(t, a, base)
		now := base.Add(30 * time.Second)
		m, err := b.w.MarkState(ctx, a, sdk.StateFailed, alice, now)
		if err != nil || !m.Applied {
			t.Fatalf("mark: %+v %v", m, err)
		}
		ti := b.ti(t)
		if ti.Attempt != a || ti.State != sdk.StateFailed || ti.LastFailureKind != "" ||
			ti.FailureReason != sdk.LabelOperatorMark || !ti.InfraMarkedAt.IsZero() || !ti.InfraConfirmedAt.IsZero() ||
			!ti.EndedAt.Equal(now) || ti.Retries != 0 || ti.ErrorMessage != "operator_mark: marked failed by operator alice" {
			t.Fatalf("row %+v", ti)
		}
		lines, err := b.store.AttemptLog(ctx, "run", "task")
		if err != nil {
			t.Fatal(err)
		}
		last := lines[len(lines)-1]
		if last.Attempt != a || !last.At.Equal(now) ||
			last.Line != "marked failed by operator alice (was failed), infra failure pod_lost, provisional" {
			t.Fatalf("try log %+v", lines)
		}
		recs := b.decisions(t)
		d := recs[len(recs)-1]
		if d.Label != sdk.LabelOperatorMark || !d.Applied || d.Reaper != lifecycle.OperatorReaper || d.Attempt != a ||
			d.Evidence["operator"] != "alice" || d.Evidence["verdict"] != sdk.StateFailed ||
			d.Evidence["infra_mark"] != "provisional" || d.Evidence["failure"] != sdk.LabelPodLost ||
			d.Evidence["retries_spent"] != "2" {
			t.Fatalf("decision %+v", d)
		}
		if m.Decision.Label != sdk.LabelOperatorMark || m.Decision.Evidence["operator"] != "alice" {
			t.Fatalf("answer's decision %+v", m.Decision)
		}
	})

	t.Run("FailedIsFinal_NoRailStartsItAndTheRunFinishesFailed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.task(t)
		b.to(t, a, sdk.StateFailed, base) // a task failure with retries left
		if m, err := b.w.MarkState(ctx, a, sdk.StateFailed, alice, base.Add(time.Second)); err != nil || !m.Applied {
			t.Fatalf("mark: %+v %v", m, err)
		}
		if tis, err := b.w.ListReleasable(ctx, sdk.ExecutorLite, nil, 0); err != nil || len(tis) != 0 {
			t.Fatalf("releasable %v %v: the verdict is final", tis, err)
		}
		for name, rail := range map[string]func(context.Context, sdk.Attempt, time.Time) (lifecycle.Release, error){
			"retry": b.w.Retry, "re-place": b.w.Replace,
		} {
			if rel, err := rail(ctx, a, base.Add(2*time.Second)); err != nil || rel.Applied {
				t.Fatalf("%s after the verdict: %+v %v", name, rel, err)
			}
		}
		fin, err := b.w.FinishSettledRuns(ctx, 0, base.Add(3*time.Second))
		if err != nil || len(fin) != 1 || fin[0].State != sdk.RunFailed {
			t.Fatalf("finish: %+v %v", fin, err)
		}
	})

	t.Run("SuccessOfARunningAttemptEndsItAndItsAgentIsToldToTerminate", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.task(t)
		b.to(t, a, sdk.StateRunning, base)
		now := base.Add(time.Minute)
		v := lifecycle.Verdict{State: sdk.StateSuccess, Operator: "bob@example.com"}
		if m, err := b.w.MarkState(ctx, a, sdk.StateRunning, v, now); err != nil || !m.Applied {
			t.Fatalf("mark: %+v %v", m, err)
		}
		ti := b.ti(t)
		if ti.State != sdk.StateSuccess || !ti.EndedAt.Equal(now) || ti.FailureReason != "" || ti.Retries != 2 ||
			ti.ErrorMessage != "operator_mark: marked success by operator bob@example.com" {
			t.Fatalf("row %+v", ti)
		}
		// The attempt API's stale-report rule: the row no longer holds this
		// running attempt, so the agent is told to stop.
		if stop, err := b.w.Heartbeat(ctx, a, now.Add(time.Second)); err != nil || !stop {
			t.Fatalf("heartbeat after the verdict: shouldTerminate=%v %v", stop, err)
		}
		if stop, err := b.w.Report(ctx, a, lifecycle.TerminalReport{State: sdk.StateFailed}, now.Add(time.Second)); err != nil || !stop {
			t.Fatalf("report after the verdict: shouldTerminate=%v %v", stop, err)
		}
		if ti := b.ti(t); ti.State != sdk.StateSuccess {
			t.Fatalf("the agent's late report changed the verdict: %s", ti.State)
		}
		fin, err := b.w.FinishSettledRuns(ctx, 0, now.Add(2*time.Second))
		if err != nil || len(fin) != 1 || fin[0].State != sdk.RunSuccess {
			t.Fatalf("finish: %+v %v", fin, err)
		}
	})

	t.Run("FailedOfAQueuedAttemptRefusesItsAgentsRunningReport", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.task(t)
		b.to(t, a, sdk.StateQueued, base)
		if m, err := b.w.MarkState(ctx, a, sdk.StateQueued, alice, base.Add(time.Second)); err != nil || !m.Applied {
			t.Fatalf("mark: %+v %v", m, err)
		}
		if stop, err := b.w.Running(ctx, a, base.Add(2*time.Second)); err != nil || !stop {
			t.Fatalf("running after the verdict: shouldTerminate=%v %v", stop, err)
		}
	})

	t.Run("AHeldAttemptIsMarkedAndItsHoldLifted", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.task(t)
		b.to(t, a, sdk.StateRunning, base.Add(-time.Minute))
		res, err := b.store.Mark(ctx, []sdk.Mark{{Attempt: a, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
			Reason: sdk.LabelAgentLost, Confirm: true, Hold: true, Term: b.term, At: base}})
		if err != nil || !res[0].Applied {
			t.Fatal(res, err)
		}
		if m, err := b.w.MarkState(ctx, a, sdk.StateFailed, alice, base.Add(time.Second)); err != nil || !m.Applied ||
			m.Decision.Evidence["hold"] != "lifted" || m.Decision.Evidence["infra_mark"] != "confirmed" {
			t.Fatalf("mark: %+v %v", m, err)
		}
		if ti := b.ti(t); !ti.HeldAt.IsZero() {
			t.Fatalf("still held: %+v", ti)
		}
	})

	t.Run("RefusedWhenTheAttemptMovedBetweenReadAndWrite", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.task(t)
		b.to(t, a, sdk.StateRunning, base)
		// Read running; the agent reports before the verdict lands.
		if stop, err := b.w.Report(ctx, a, lifecycle.TerminalReport{State: sdk.StateSuccess}, base.Add(time.Second)); err != nil || stop {
			t.Fatal(stop, err)
		}
		before := b.ti(t)
		m, err := b.w.MarkState(ctx, a, sdk.StateRunning, alice, base.Add(2*time.Second))
		if err != nil || m.Applied || m.Reason != lifecycle.ReasonMovedOn {
			t.Fatalf("mark of a moved state: %+v %v", m, err)
		}
		unchanged(t, before, b.ti(t))
		// Another attempt than the one read (a re-place between the read
		// and the write).
		b2 := setup(t)
		a2 := b2.task(t)
		b2.to(t, a2, "infra", base)
		rel, err := b2.w.Replace(ctx, a2, base.Add(time.Second))
		if err != nil || !rel.Applied {
			t.Fatal(rel, err)
		}
		before = b2.ti(t)
		m, err = b2.w.MarkState(ctx, a2, sdk.StateFailed, alice, base.Add(2*time.Second))
		if err != nil || m.Applied || m.Reason != lifecycle.ReasonMovedOn {
			t.Fatalf("mark of a released attempt: %+v %v", m, err)
		}
		unchanged(t, before, b2.ti(t))
		for _, bb := range []*bundle{b, b2} {
			for _, d := range bb.decisions(t) {
				if d.Label == sdk.LabelOperatorMark {
					t.Fatalf("a refused verdict was audited: %+v", d)
				}
			}
		}
	})

	t.Run("TwoVerdictsAtOnce_OneApplies", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.task(t)
		b.to(t, a, sdk.StateRunning, base)
		const n = 8
		results := make(chan lifecycle.Marked, n)
		errs := make(chan error, n)
		for i := range n {
			v := lifecycle.Verdict{State: []string{sdk.StateFailed, sdk.StateSuccess}[i%2], Operator: "op" + string(rune('a'+i))}
			go func() {
				m, err := b.w.MarkState(ctx, a, sdk.StateRunning, v, base.Add(time.Second))
				results <- m
				errs <- err
			}()
		}
		applied := 0
		for range n {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
			if m := <-results; m.Applied {
				applied++
			} else if m.Reason != lifecycle.ReasonMovedOn {
				t.Fatalf("refusal %+v", m)
			}
		}
		marks := 0
		for _, d := range b.decisions(t) {
			if d.Label == sdk.LabelOperatorMark {
				marks++
			}
		}
		if applied != 1 || marks != 1 {
			t.Fatalf("%d verdicts applied, %d audited: want one of each", applied, marks)
		}
	})

	t.Run("RefusedOnAFinishedRun", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.task(t)
		b.to(t, a, sdk.StateRunning, base)
		if ok, err := b.w.FinishRun(ctx, "run", sdk.RunFailed, "stopped", base.Add(time.Second)); err != nil || !ok {
			t.Fatal(ok, err)
		}
		before := b.ti(t)
		m, err := b.w.MarkState(ctx, a, sdk.StateRunning, alice, base.Add(2*time.Second))
		if err != nil || m.Applied || m.Reason != lifecycle.ReasonRunNotRunning {
			t.Fatalf("mark on a finished run: %+v %v", m, err)
		}
		unchanged(t, before, b.ti(t))
		if run, _ := b.w.Run(ctx, "run"); run.State != sdk.RunFailed {
			t.Fatalf("run %s", run.State)
		}
	})

	t.Run("RefusedForASettledOutcomeOrABadVerdict", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.task(t)
		b.to(t, a, sdk.StateSuccess, base)
		before := b.ti(t)
		for name, c := range map[string]struct {
			seen string
			v    lifecycle.Verdict
			want string
		}{
			"SuccessIsSettled":  {sdk.StateSuccess, alice, "not marked"},
			"UnknownVerdict":    {sdk.StateSuccess, lifecycle.Verdict{State: sdk.StateSkipped, Operator: "alice"}, "failed or success"},
			"NoOperator":        {sdk.StateSuccess, lifecycle.Verdict{State: sdk.StateFailed}, "no operator"},
			"OperatorWithSpace": {sdk.StateSuccess, lifecycle.Verdict{State: sdk.StateFailed, Operator: "a b"}, "without spaces"},
			"OversizedOperator": {sdk.StateSuccess, lifecycle.Verdict{State: sdk.StateFailed, Operator: strings.Repeat("x", 65)}, "at most 64"},
		} {
			if _, err := b.w.MarkState(ctx, a, c.seen, c.v, base.Add(time.Second)); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
			}
		}
		unchanged(t, before, b.ti(t))
	})
}

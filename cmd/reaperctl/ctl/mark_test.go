package ctl

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
)

// kubeRun makes run r with one kube task t, retries 1, running since 10m
// ago and marked pod_lost 1m ago, provisional (the sweep has not confirmed
// it): the case the operator's verdict is for.
func kubeRun(t *testing.T) (*bundle, sdk.Attempt) {
	t.Helper()
	ctx := context.Background()
	b := setup(t, "")
	err := b.w.CreateRun(ctx, lifecycle.NewRun{RunID: "r", DagID: "dag", Tasks: []lifecycle.NewTask{
		{TaskID: "t", Executor: sdk.ExecutorKube, Retries: 1}, {TaskID: "u", Executor: sdk.ExecutorKube}}}, base.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	a := first("r", "t")
	b.running(t, a, base.Add(-11*time.Minute), base.Add(-10*time.Minute), base.Add(-5*time.Minute))
	res, err := b.store.Mark(ctx, []sdk.Mark{{Attempt: a, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
		Reason: sdk.LabelPodLost, Message: "pod_lost: no pod of the attempt", Term: b.term, At: base.Add(-time.Minute)}})
	if err != nil || !res[0].Applied {
		t.Fatalf("mark: %+v %v", res, err)
	}
	return b, a
}

func TestMark(t *testing.T) {
	t.Parallel()

	t.Run("FailedOnAProvisionalInfraMarkIsAVerdictShownByExplain", func(t *testing.T) {
		t.Parallel()
		b, a := kubeRun(t)
		r := b.ctl(t, "mark", "-by", "alice", "r", "t", "failed").ok(t)
		golden(t, r.stdout, `
marked r/t try 1 epoch 0 failed by alice (was failed (infra:pod_lost)): the runner finishes the run once every task is settled
`)
		ti, err := b.store.TaskInstance(context.Background(), "r", "t")
		if err != nil {
			t.Fatal(err)
		}
		if ti.Attempt != a || ti.State != sdk.StateFailed || ti.LastFailureKind != "" || !ti.InfraMarkedAt.IsZero() ||
			!ti.InfraConfirmedAt.IsZero() || !ti.EndedAt.Equal(base) || ti.Retries != 0 {
			t.Fatalf("row %+v", ti)
		}
		out := b.ctl(t, "explain", "r", "t").ok(t).stdout
		for _, want := range []string{
			"r/t is failed (operator_mark), an operator's verdict\n",
			"  error: operator_mark: marked failed by operator alice\n",
			"  no rail, re-place or override touches a verdict; a clear runs the task again\n",
			"  2030-01-02T12:00:00Z (0s ago): operator alice marked try 1 epoch 0 failed\n",
			"    operator_mark: applied\n",
			"    saw state=failed operator=alice verdict=failed failure=pod_lost failure_kind=infra infra_mark=provisional retries_spent=1\n",
			"marked failed by operator alice (was failed), infra failure pod_lost, provisional",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("explain lacks %q:\n%s", want, out)
			}
		}
	})

	t.Run("SuccessOfARunningAttemptTellsItsAgentToStop", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		b.createRun(t, "r", base.Add(-time.Hour), "t")
		a := first("r", "t")
		b.running(t, a, base.Add(-3*time.Minute), base.Add(-2*time.Minute), base.Add(-time.Minute))
		var doc markJSON
		b.ctl(t, "mark", "-json", "-by", "bob", "r", "t", "success").ok(t).decode(t, &doc)
		if !doc.Marked || doc.Verdict != sdk.StateSuccess || doc.Operator != "bob" || doc.Was != sdk.StateRunning ||
			doc.Attempt.State != sdk.StateSuccess || doc.Attempt.ErrorMessage != "operator_mark: marked success by operator bob" {
			t.Fatalf("document %+v", doc)
		}
		if stop, err := b.w.Heartbeat(context.Background(), a, base.Add(time.Second)); err != nil || !stop {
			t.Fatalf("the agent's heartbeat after the verdict: shouldTerminate=%v %v", stop, err)
		}
		b2 := setup(t, "")
		b2.createRun(t, "r", base.Add(-time.Hour), "t")
		b2.running(t, a, base.Add(-3*time.Minute), base.Add(-2*time.Minute), base.Add(-time.Minute))
		golden(t, b2.ctl(t, "mark", "-by", "bob", "r", "t", "success").ok(t).stdout, `
marked r/t try 1 epoch 0 success by bob (was running): its agent is told to stop at its next report; the runner finishes the run once every task is settled
`)
	})

	t.Run("TheOperatorIsTheOSUserWithoutBy", func(t *testing.T) {
		t.Parallel()
		b, _ := kubeRun(t)
		var doc markJSON
		b.ctl(t, "mark", "-json", "r", "t", "failed").ok(t).decode(t, &doc)
		if want := defaultOperator(); want == "" || doc.Operator != want {
			t.Fatalf("operator %q, want the OS user %q", doc.Operator, want)
		}
	})

	t.Run("RefusedOnAFinishedRun", func(t *testing.T) {
		t.Parallel()
		b, _ := kubeRun(t)
		if ok, err := b.w.FinishRun(context.Background(), "r", sdk.RunFailed, "stopped", base.Add(-time.Second)); err != nil || !ok {
			t.Fatal(ok, err)
		}
		before := b.snapshot(t)
		b.ctl(t, "mark", "-by", "alice", "r", "t", "success").failed(t, 1, "run r has finished (failed): its tasks are not marked")
		b.unchanged(t, before)
	})

	t.Run("RefusedOnASettledOutcome", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		b.createRun(t, "r", base.Add(-time.Hour), "t", "u")
		b.succeeded(t, first("r", "t"), base.Add(-3*time.Minute), base.Add(-2*time.Minute), base.Add(-time.Minute))
		before := b.snapshot(t)
		b.ctl(t, "mark", "-by", "alice", "r", "t", "failed").failed(t, 1, "r/t try 1 epoch 0 is success, an outcome of its own")
		b.unchanged(t, before)
	})

	t.Run("RefusedWhenTheAttemptMovesOnBetweenReadAndWrite", func(t *testing.T) {
		t.Parallel()
		b, a := kubeRun(t)
		// The planner re-places the task after reaperctl read it.
		b.cli.beforeWrite = func() {
			if rel, err := b.w.Replace(context.Background(), a, base.Add(-time.Second)); err != nil || !rel.Applied {
				t.Errorf("re-place: %+v %v", rel, err)
			}
		}
		b.ctl(t, "mark", "-by", "alice", "r", "t", "failed").failed(t, 1,
			"r/t try 1 epoch 0 moved on (moved_on) while being marked: nothing written")
		ti, err := b.store.TaskInstance(context.Background(), "r", "t")
		if err != nil {
			t.Fatal(err)
		}
		if ti.Epoch != 1 || ti.State != sdk.StateNone {
			t.Fatalf("the re-placed attempt was touched: %+v", ti)
		}
		recs, err := b.store.DecisionsFor(context.Background(), "r", "t", 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range recs {
			if d.Label == sdk.LabelOperatorMark {
				t.Fatalf("a refused verdict was audited: %+v", d)
			}
		}
	})

	t.Run("RefusesABadCommandLineWritingNothing", func(t *testing.T) {
		t.Parallel()
		b, _ := kubeRun(t)
		before := b.snapshot(t)
		for name, c := range map[string]struct {
			args []string
			want string
		}{
			"NoVerdict":         {[]string{"r", "t"}, "missing arguments: reaperctl mark [-by NAME] RUN TASK failed|success"},
			"UnknownVerdict":    {[]string{"r", "t", "skipped"}, `"skipped": mark a task failed or success`},
			"OperatorWithSpace": {[]string{"-by", "a b", "r", "t", "failed"}, "-by: operator name \"a b\": printable ASCII without spaces only"},
			"EmptyOperator":     {[]string{"-by", "", "r", "t", "failed"}, "-by: no operator named"},
			"OversizedOperator": {[]string{"-by", strings.Repeat("x", 1000), "r", "t", "failed"}, "-by: operator name of 1000 bytes: at most 64"},
		} {
			t.Run(name, func(t *testing.T) {
				b.ctl(t, "mark", c.args...).failed(t, 2, c.want)
			})
		}
		b.ctl(t, "mark", "-by", "alice", "r", "nope", "failed").failed(t, 1, `run "r" has no task "nope"`)
		b.unchanged(t, before)
	})
}

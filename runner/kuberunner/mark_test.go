package kuberunner_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/cmd/reaperctl/ctl"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// reaperctl runs one reaperctl command line against the env's board, at
// the env's fake now, and returns its exit code, stdout and stderr.
func (e *env) reaperctl(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "reaper.hcl")
	src := fmt.Sprintf("edition = \"lite\"\n\nstore {\n  dsn = %q\n}\n\nsubstrate \"lite\" {}\n", e.dsn)
	if err := os.WriteFile(cfg, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	cli := ctl.CLI{Now: e.clk.Now, Getenv: func(string) string { return "" }}
	code := cli.Run(context.Background(), append([]string{args[0], "-config", cfg}, args[1:]...), &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestAnOperatorsVerdictOnAProvisionalMarkIsNeitherRePlacedNorOverridden:
// reaperctl mark failed on a provisional infra mark (kube, failed as
// pod_lost, infra_confirmed_at NULL) is a verdict: the kube runner's
// planner never re-places it, before or after the confirmation valve
// (while the provisional mark beside it is re-placed once the valve
// opens), the sweep's durable-SUCCESS override and its confirmation are
// no-ops on it, and the runner finishes the run once the task beside it
// settles.
func TestAnOperatorsVerdictOnAProvisionalMarkIsNeitherRePlacedNorOverridden(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.mkRun(t, "run-1", lifecycle.NewTask{TaskID: "verdict", Retries: 1}, lifecycle.NewTask{TaskID: "guess", Retries: 1})
	r := e.runner(t, e.config(e.cs))
	if res := cycle(t, r, e.clk.Now()); res.Dispatched != 2 {
		t.Fatalf("dispatched %d", res.Dispatched)
	}
	markedAt := e.clk.Now()
	for _, task := range []string{"verdict", "guess"} {
		a := e.ti(t, "run-1", task).Attempt
		if sd, err := e.w.Running(ctx, a, markedAt); err != nil || sd {
			t.Fatal(sd, err)
		}
		ok, err := e.w.Fail(ctx, a, []string{sdk.StateRunning},
			lifecycle.Failure{Kind: sdk.MarkInfra, Reason: sdk.LabelPodLost, Message: "pod_lost: no pod"}, markedAt)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	marked := e.ti(t, "run-1", "verdict")
	if marked.LastFailureKind != sdk.FailureInfra || !marked.InfraConfirmedAt.IsZero() {
		t.Fatalf("not a provisional mark: %+v", marked)
	}

	e.clk.Advance(10 * time.Second)
	code, out, errOut := e.reaperctl(t, "mark", "-by", "alice", "run-1", "verdict", "failed")
	if code != 0 || errOut != "" || !strings.HasPrefix(out, "marked run-1/verdict try 1 epoch 0 failed by alice") {
		t.Fatalf("reaperctl mark: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	after := e.ti(t, "run-1", "verdict")
	if after.Attempt != marked.Attempt || after.State != sdk.StateFailed || after.LastFailureKind != "" ||
		!after.InfraMarkedAt.IsZero() || !after.InfraConfirmedAt.IsZero() {
		t.Fatalf("row after the verdict %+v", after)
	}

	about := func(res []sdk.Decision, a sdk.Attempt) []string {
		var out []string
		for _, d := range res {
			if d.Attempt == a {
				out = append(out, d.Label)
			}
		}
		return out
	}
	t.Run("ThePlannerDoesNotRePlaceIt", func(t *testing.T) {
		e.clk.Advance(time.Second)
		res := cycle(t, r, e.clk.Now())
		if res.Replaced != 0 || res.Waiting != 1 || res.Dispatched != 0 || len(about(res.Decisions, marked.Attempt)) != 0 {
			t.Fatalf("inside the valve: replaced %d, waiting %d, dispatched %d, decisions %v", res.Replaced, res.Waiting,
				res.Dispatched, labels(res))
		}
		// Past the valve the guess beside it is re-placed; the verdict is not.
		e.clk.Advance(ladder.Defaults().InfraConfirmValve)
		res = cycle(t, r, e.clk.Now())
		if res.Replaced != 1 || !slices.Equal(labels(res), []string{sdk.LabelInfraConfirmValveOpen, sdk.LabelInfraReplace}) ||
			len(about(res.Decisions, marked.Attempt)) != 0 {
			t.Fatalf("past the valve: replaced %d, decisions %v", res.Replaced, labels(res))
		}
		if ti := e.ti(t, "run-1", "guess"); ti.Epoch != 1 {
			t.Fatalf("the provisional mark beside it was not re-placed: %+v", ti)
		}
		if ti := e.ti(t, "run-1", "verdict"); ti.Attempt != marked.Attempt || ti.State != sdk.StateFailed {
			t.Fatalf("the verdict was moved: %+v", ti)
		}
		if _, ok := e.pods(t)[marked.Attempt]; !ok {
			t.Fatal("the runner touched the marked attempt's pod (its teardown is the substrate's)")
		}
	})

	t.Run("TheSweepsOverrideAndConfirmationAreNoOps", func(t *testing.T) {
		now := e.clk.Now()
		before := e.ti(t, "run-1", "verdict")
		res, err := e.store.OverrideInfra(ctx, []sdk.Override{{Attempt: marked.Attempt,
			MarkedAfter: markedAt.Add(-time.Minute), Term: e.term, At: now}})
		if err != nil || len(res) != 1 || res[0].Applied || res[0].NoopReason != sdk.NoopMovedOn {
			t.Fatalf("override of a verdict: %+v %v", res, err)
		}
		res, err = e.store.ConfirmInfra(ctx, []sdk.Confirm{{Attempt: marked.Attempt, Term: e.term, At: now}})
		if err != nil || len(res) != 1 || res[0].Applied || res[0].NoopReason != sdk.NoopMovedOn {
			t.Fatalf("confirmation of a verdict: %+v %v", res, err)
		}
		if ti := e.ti(t, "run-1", "verdict"); ti.State != sdk.StateFailed || !ti.UpdatedAt.Equal(before.UpdatedAt) {
			t.Fatalf("the sweep's writes changed the verdict: %+v", ti)
		}
	})

	t.Run("TheRunFinishesOnceTheTaskBesideItSettles", func(t *testing.T) {
		a := e.ti(t, "run-1", "guess").Attempt
		now := e.clk.Now()
		if sd, err := e.w.Running(ctx, a, now); err != nil || sd {
			t.Fatal(sd, err)
		}
		if sd, err := e.w.Report(ctx, a, lifecycle.TerminalReport{State: sdk.StateSuccess}, now); err != nil || sd {
			t.Fatal(sd, err)
		}
		e.clk.Advance(time.Second)
		res := cycle(t, r, e.clk.Now())
		if res.Finalized != 1 {
			t.Fatalf("finalized %d", res.Finalized)
		}
		run, err := e.w.Run(ctx, "run-1")
		if err != nil || run.State != sdk.RunFailed || run.ErrorMessage != "tasks not successful: verdict" {
			t.Fatalf("run %+v %v", run, err)
		}
	})
}

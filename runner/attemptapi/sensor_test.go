package attemptapi_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/sdk"
)

// The attacker is task code holding its own attempt's token (readable by
// design): it reports up_for_reschedule to get a new epoch and a fresh
// credential, over and over.
func TestRescheduleReport(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("NotASensor_TaskCodeWithItsOwnToken_FailsWithTheReason_LoggedMeteredDecided", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, "run", "task")
		a := sdk.Attempt{RunID: "run", TaskID: "task", Try: 1}
		c := b.dispatch(t, a)
		if term, err := c.Running(ctx, a); err != nil || term {
			t.Fatalf("running: %v %v", term, err)
		}
		b.clk.Advance(time.Second)
		term, err := c.Report(ctx, a, attemptapi.ReportBody{State: sdk.StateUpForReschedule})
		if err != nil || term {
			t.Fatalf("report: %v %v", term, err)
		}
		ti := b.ti(t, a)
		if ti.Attempt != a || ti.State != sdk.StateFailed || ti.LastFailureKind != sdk.FailureTask ||
			ti.FailureReason != sdk.LabelRescheduleNotSensor || !strings.HasPrefix(ti.ErrorMessage, sdk.LabelRescheduleNotSensor+": ") {
			t.Fatalf("row after a non-sensor's reschedule report: %+v", ti)
		}
		ds := b.decisions.all()
		if len(ds) != 1 || ds[0].Label != sdk.LabelRescheduleNotSensor || ds[0].Attempt != a || !ds[0].Applied ||
			ds[0].Reaper != attemptapi.DecisionSource {
			t.Fatalf("decisions %+v, want one applied %s about %s", ds, sdk.LabelRescheduleNotSensor, a)
		}
		if n := b.meter.Count(attemptapi.CallReport + "/ok"); n != 1 {
			t.Fatalf("report calls metered ok: %d", n)
		}
		// The same token again: the attempt has ended, nothing is written
		// and no new epoch begins.
		term, err = c.Report(ctx, a, attemptapi.ReportBody{State: sdk.StateUpForReschedule})
		if err != nil || !term {
			t.Fatalf("a second report: %v %v, want should_terminate", term, err)
		}
		if after := b.ti(t, a); after.Attempt != a || after.State != sdk.StateFailed {
			t.Fatalf("a second report moved the row: %+v", after)
		}
		if n := len(b.decisions.all()); n != 1 {
			t.Fatalf("%d decisions after the refused replay, want 1", n)
		}
	})

	t.Run("Sensor_ParksWithNoDecision", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		err := b.w.CreateRun(ctx, lifecycle.NewRun{RunID: "run", DagID: "dag", Tasks: []lifecycle.NewTask{{
			TaskID: "poke", Executor: sdk.ExecutorLite, Command: "true", Sensor: true, SensorTimeout: time.Hour}}},
			base.Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		a := sdk.Attempt{RunID: "run", TaskID: "poke", Try: 1}
		c := b.dispatch(t, a)
		if term, err := c.Running(ctx, a); err != nil || term {
			t.Fatalf("running: %v %v", term, err)
		}
		if term, err := c.Report(ctx, a, attemptapi.ReportBody{State: sdk.StateUpForReschedule}); err != nil || term {
			t.Fatalf("report: %v %v", term, err)
		}
		if ti := b.ti(t, a); ti.State != sdk.StateUpForReschedule || ti.FailureReason != "" {
			t.Fatalf("row after a sensor's reschedule: %+v", ti)
		}
		if ds := b.decisions.all(); len(ds) != 0 {
			t.Fatalf("decisions %+v, want none", ds)
		}
	})
}

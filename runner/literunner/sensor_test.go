package literunner_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/runner/literunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/eventually"
)

// sensorTask is a Lite task declared a sensor with the given timeout.
func sensorTask(id, command string, timeout time.Duration) lifecycle.NewTask {
	return lifecycle.NewTask{TaskID: id, Executor: sdk.ExecutorLite, Command: command, Sensor: true, SensorTimeout: timeout}
}

// untilParked waits, for at most 30 s, until the real agent of the task's
// poke at epoch has reported it up_for_reschedule (the runner is not
// cycled meanwhile: the next cycle would start the next poke).
func (b *bundle) untilParked(t *testing.T, runID, taskID string, epoch int32) {
	t.Helper()
	var ti board.TaskInstance
	if !eventually.Until(30*time.Second, func() bool {
		ti = b.ti(t, runID, taskID)
		if ti.Epoch > epoch {
			t.Fatalf("waiting for %s/%s parked at epoch %d: %s", runID, taskID, epoch, show(ti))
		}
		return ti.State == sdk.StateUpForReschedule && ti.Epoch == epoch
	}, eventually.Every(20*time.Millisecond)) {
		t.Fatalf("waiting for %s/%s parked at epoch %d: %s", runID, taskID, epoch, show(ti))
	}
}

func TestSensor(t *testing.T) {
	t.Parallel()
	poke := "exit " + strconv.Itoa(agent.SensorRescheduleExitCode)

	t.Run("ASensorPokesAgainOnANewEpochOfItsTryUntilItSucceeds", func(t *testing.T) {
		t.Parallel()
		b := setup(t, opts{})
		count := filepath.Join(b.work, "pokes")
		// Two pokes ask for another, the third succeeds.
		cmd := `n=$(cat ` + count + ` 2>/dev/null || echo 0); echo $((n+1)) > ` + count + `; [ "$n" -ge 2 ] || ` + poke
		b.mkRun(t, "run", sensorTask("s", cmd, time.Hour))
		var tt totals
		if run := b.untilRunEnds(t, "run", &tt, nil); run.State != sdk.RunSuccess {
			t.Fatalf("run %+v", run)
		}
		ti := b.ti(t, "run", "s")
		if ti.State != sdk.StateSuccess || ti.Try != 1 || ti.Epoch != 2 || tt.retried != 0 {
			t.Fatalf("row %s, retried %d; want a success at try 1 epoch 2 (two reschedules, no retry)", show(ti), tt.retried)
		}
		if ti.Sensor.FirstPokeAt.IsZero() || ti.Sensor.TryDispatchedAt.IsZero() {
			t.Fatalf("sensor stamps %+v", ti.Sensor)
		}
	})

	// The agent here reports up_for_reschedule for a task that is not a
	// sensor, as task code holding its attempt's token can: the board
	// fails it with the reason, no new epoch.
	t.Run("ANonSensorReportingUpForReschedule_FailsWithTheReason", func(t *testing.T) {
		t.Parallel()
		wrapper := filepath.Join(t.TempDir(), literunner.AgentBinary)
		script := "#!/bin/sh\nexec " + agentPath + " -reschedule-exit-code=3 \"$@\"\n"
		if err := os.WriteFile(wrapper, []byte(script), 0o700); err != nil {
			t.Fatal(err)
		}
		b := setup(t, opts{agentPath: wrapper})
		b.mkRun(t, "run", task("t", "exit 3", 0))
		var tt totals
		if run := b.untilRunEnds(t, "run", &tt, nil); run.State != sdk.RunFailed {
			t.Fatalf("run %+v", run)
		}
		ti := b.ti(t, "run", "t")
		if ti.State != sdk.StateFailed || ti.LastFailureKind != sdk.FailureTask || ti.FailureReason != sdk.LabelRescheduleNotSensor ||
			!strings.HasPrefix(ti.ErrorMessage, sdk.LabelRescheduleNotSensor+": ") || ti.Epoch != 0 || ti.Try != 1 {
			t.Fatalf("row %s; want failed %s at try 1 epoch 0", show(ti), sdk.LabelRescheduleNotSensor)
		}
	})

	t.Run("ASensorPastItsTimeout_CountedFromTheFirstPoke_IsFailedAtItsNextReschedule", func(t *testing.T) {
		t.Parallel()
		b := setup(t, opts{})
		b.mkRun(t, "run", sensorTask("s", poke, 10*time.Minute))
		b.cycle(t) // dispatches the first poke
		b.untilParked(t, "run", "s", 0)
		if res := b.cycle(t); res.Rescheduled != 1 || res.Dispatched != 1 {
			t.Fatalf("the second poke: %+v", res)
		}
		b.untilParked(t, "run", "s", 1)
		first := b.ti(t, "run", "s").Sensor.FirstPokeAt
		// Two pokes in, the clock moves past the timeout counted from the
		// first: the next reschedule is refused.
		b.clk.Advance(11 * time.Minute)
		res := b.cycle(t)
		if !hasLabel(res, sdk.LabelSensorTimeout, true) || res.Rescheduled != 0 {
			t.Fatalf("result %+v, want an applied %s and no reschedule", res, sdk.LabelSensorTimeout)
		}
		ti := b.ti(t, "run", "s")
		if ti.State != sdk.StateFailed || ti.FailureReason != sdk.LabelSensorTimeout || ti.Retries != 0 || ti.Epoch != 1 ||
			!ti.Sensor.FirstPokeAt.Equal(first) {
			t.Fatalf("row %s; want failed %s at epoch 1, retries spent", show(ti), sdk.LabelSensorTimeout)
		}
		if run := b.run(t, "run"); run.State == sdk.RunRunning {
			if res := b.cycle(t); b.run(t, "run").State != sdk.RunFailed {
				t.Fatalf("run still %s after %+v", b.run(t, "run").State, res)
			}
		}
	})
}

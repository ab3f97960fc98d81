package boardtest

import (
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// sensorPoke seeds a running poke of task "task" in run "run" (retries 2)
// whose sensor declaration and stamps are s (zero: not a sensor).
func sensorPoke(f Fixture, s sdk.Sensor) sdk.Attempt {
	a := sdk.Attempt{RunID: "run", TaskID: "task", Try: 1, Epoch: 3}
	f.Put(Row{Attempt: a, State: sdk.StateRunning, Executor: sdk.ExecutorKube, QueuedAt: at(-5 * time.Minute),
		RunningAt: at(-4 * time.Minute), LastHeartbeatAt: at(-time.Minute), Sensor: s, Retries: 2})
	return a
}

// refusedAsFailure asserts that the settlement applied as a task failure
// with the refusal's reason, retries left as given.
func refusedAsFailure(t *testing.T, f Fixture, a sdk.Attempt, res sdk.MarkResult, reason string, retries int32) {
	t.Helper()
	applied(t, res)
	if res.RescheduleRefused != reason {
		t.Fatalf("result %+v, want the reschedule refused as %s", res, reason)
	}
	r := row(t, f, a)
	if r.Attempt != a || r.State != sdk.StateFailed || r.LastFailureKind != sdk.FailureTask || r.FailureReason != reason ||
		!strings.HasPrefix(r.ErrorMessage, reason+": ") || r.Retries != retries || !r.InfraMarkedAt.IsZero() {
		t.Fatalf("row after a refused reschedule: %+v; want a task failure %s with %d retries left", r, reason, retries)
	}
	sameTime(t, "ended_at", r.EndedAt, at(0))
}

func sensorCases() map[string]func(t *testing.T, f Fixture) {
	inBounds := sdk.Sensor{Declared: true, Timeout: time.Hour, FirstPokeAt: at(-30 * time.Minute),
		TryDispatchedAt: at(-31 * time.Minute)}
	return map[string]func(t *testing.T, f Fixture){
		"RescheduleRecordOfANonSensor_IsATaskFailureWithTheReason": func(t *testing.T, f Fixture) {
			a := sensorPoke(f, sdk.Sensor{})
			res := settleOne(t, f, settlement(f, a, sdk.OutcomeReschedule))
			refusedAsFailure(t, f, a, res, sdk.LabelRescheduleNotSensor, 2)
		},
		"RescheduleRecordPastTheSensorTimeout_CountedFromTheFirstPoke_FailsWithRetriesSpent": func(t *testing.T, f Fixture) {
			// The poke itself is young (running 4 min); the try's first
			// poke is an hour back.
			s := inBounds
			s.FirstPokeAt = at(-time.Hour)
			a := sensorPoke(f, s)
			res := settleOne(t, f, settlement(f, a, sdk.OutcomeReschedule))
			refusedAsFailure(t, f, a, res, sdk.LabelSensorTimeout, 0)
		},
		"RescheduleRecordPastTheCeiling_CountedFromTheTrysFirstDispatch_IsATaskFailure": func(t *testing.T, f Fixture) {
			s := inBounds
			s.Timeout, s.TryDispatchedAt = 24*time.Hour, at(-Ceiling)
			a := sensorPoke(f, s)
			res := settleOne(t, f, settlement(f, a, sdk.OutcomeReschedule))
			refusedAsFailure(t, f, a, res, sdk.LabelSensorCredentialCeiling, 2)
		},
		"RescheduleRecordJustInsideBothBounds_Parks": func(t *testing.T, f Fixture) {
			s := sdk.Sensor{Declared: true, Timeout: time.Hour, FirstPokeAt: at(-time.Hour + time.Second),
				TryDispatchedAt: at(-Ceiling + time.Second)}
			a := sensorPoke(f, s)
			res := settleOne(t, f, settlement(f, a, sdk.OutcomeReschedule))
			applied(t, res)
			if r := row(t, f, a); res.RescheduleRefused != "" || r.State != sdk.StateUpForReschedule || r.FailureReason != "" {
				t.Fatalf("result %+v, row %+v; want parked", res, r)
			}
		},
		"OtherOutcomesOfANonSensor_AreNotJudged": func(t *testing.T, f Fixture) {
			a := sensorPoke(f, sdk.Sensor{})
			res := settleOne(t, f, settlement(f, a, sdk.OutcomeSuccess))
			applied(t, res)
			if r := row(t, f, a); res.RescheduleRefused != "" || r.State != sdk.StateSuccess {
				t.Fatalf("result %+v, row %+v; want a plain success", res, r)
			}
		},
		"RefusedReschedule_StillGuarded_AnotherEpoch": func(t *testing.T, f Fixture) {
			a := sensorPoke(f, sdk.Sensor{})
			before := row(t, f, a)
			stale := a
			stale.Epoch--
			res := settleOne(t, f, settlement(f, stale, sdk.OutcomeReschedule))
			noop(t, res, sdk.NoopMovedOn)
			unchanged(t, f, a, before)
		},
		"RefusedReschedule_StillGuarded_State": func(t *testing.T, f Fixture) {
			a := sensorPoke(f, sdk.Sensor{})
			s := settlement(f, a, sdk.OutcomeReschedule)
			s.FromStates = []string{sdk.StateQueued}
			before := row(t, f, a)
			noop(t, settleOne(t, f, s), sdk.NoopMovedOn)
			unchanged(t, f, a, before)
		},
		"RefusedReschedule_StillGuarded_Term": func(t *testing.T, f Fixture) {
			a := sensorPoke(f, sdk.Sensor{})
			before, st := row(t, f, a), settlement(f, a, sdk.OutcomeReschedule)
			f.Depose()
			noop(t, settleOne(t, f, st), sdk.NoopDeposed)
			unchanged(t, f, a, before)
		},
		"RefusedReschedule_StillGuarded_RunFinished": func(t *testing.T, f Fixture) {
			a := sensorPoke(f, sdk.Sensor{})
			f.PutRun(RunRow{RunID: a.RunID, State: sdk.RunFailed, StartedAt: at(-time.Hour)})
			before := row(t, f, a)
			noop(t, settleOne(t, f, settlement(f, a, sdk.OutcomeReschedule)), sdk.NoopRunFinished)
			unchanged(t, f, a, before)
		},
	}
}

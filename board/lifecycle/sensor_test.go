package lifecycle_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// sensorBundle is a board whose writer bounds a sensor's pokes by the
// credential ceiling, with run "run" holding task "task" (retries 2),
// declared a sensor with the given timeout (0: not a sensor).
type sensorBundle struct {
	*bundle
	clk *clock.Fake
}

func setupSensor(t *testing.T, sensorTimeout, ceiling time.Duration) *sensorBundle {
	t.Helper()
	pool := pgtest.NewDB(t)
	store := board.New(pool, board.Options{CredentialCeiling: ceiling})
	lease, ok, err := store.TryAcquire(context.Background(), "test", 24*time.Hour, base.Add(-time.Minute))
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	b := &sensorBundle{bundle: &bundle{w: lifecycle.New(pool, lifecycle.Options{CredentialCeiling: ceiling}), store: store,
		term: lease.Term}, clk: clock.NewFake(base)}
	err = b.w.CreateRun(context.Background(), lifecycle.NewRun{RunID: "run", DagID: "dag", Tasks: []lifecycle.NewTask{{
		TaskID: "task", Executor: sdk.ExecutorLite, Retries: 2, Command: "poke",
		Sensor: sensorTimeout > 0, SensorTimeout: sensorTimeout,
	}}}, base.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// poke drives attempt a from none to running on the fake clock (a minute
// per step), then lets it run for d and reports up_for_reschedule.
func (b *sensorBundle) poke(t *testing.T, a sdk.Attempt, d time.Duration) lifecycle.ReportResult {
	t.Helper()
	ctx := context.Background()
	w := b.w.Fenced(b.term)
	if ok, err := w.Enqueue(ctx, a, b.clk.Now()); err != nil || !ok {
		t.Fatalf("enqueue %s: %v %v", a, ok, err)
	}
	b.clk.Advance(time.Minute)
	if ok, err := w.Queue(ctx, a, b.clk.Now()); err != nil || !ok {
		t.Fatalf("queue %s: %v %v", a, ok, err)
	}
	b.clk.Advance(time.Minute)
	if stop, err := b.w.Running(ctx, a, b.clk.Now()); err != nil || stop {
		t.Fatalf("running %s: %v %v", a, stop, err)
	}
	b.clk.Advance(d)
	res, err := b.w.ReportOutcome(ctx, a, lifecycle.TerminalReport{State: sdk.StateUpForReschedule}, b.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// reschedule starts the next poke (epoch+1) of a parked attempt.
func (b *sensorBundle) reschedule(t *testing.T, a sdk.Attempt) sdk.Attempt {
	t.Helper()
	rel, err := b.w.Fenced(b.term).Reschedule(context.Background(), a, b.clk.Now())
	if err != nil || !rel.Applied {
		t.Fatalf("reschedule %s: %+v %v", a, rel, err)
	}
	if rel.Attempt.Try != a.Try || rel.Attempt.Epoch != a.Epoch+1 {
		t.Fatalf("reschedule %s started %s, want the same try at the next epoch", a, rel.Attempt)
	}
	return rel.Attempt
}

func refusedFailure(t *testing.T, ti board.TaskInstance, reason string, retries int32) {
	t.Helper()
	if ti.State != sdk.StateFailed || ti.LastFailureKind != sdk.FailureTask || ti.FailureReason != reason ||
		!strings.HasPrefix(ti.ErrorMessage, reason+": ") || ti.Retries != retries {
		t.Fatalf("row after a refused reschedule: state %s kind %q reason %q message %q retries %d; want failed, task, %s, %d retries",
			ti.State, ti.LastFailureKind, ti.FailureReason, ti.ErrorMessage, ti.Retries, reason, retries)
	}
}

func TestRescheduleIsASensors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("NotASensorReportingUpForReschedule_FailsWithTheReason", func(t *testing.T) {
		t.Parallel()
		b := setupSensor(t, 0, time.Hour)
		a := sdk.Attempt{RunID: "run", TaskID: "task", Try: 1}
		res := b.poke(t, a, time.Second)
		if res.ShouldTerminate || res.RescheduleRefused != sdk.LabelRescheduleNotSensor {
			t.Fatalf("report: %+v, want applied with the reschedule refused as %s", res, sdk.LabelRescheduleNotSensor)
		}
		ti := b.ti(t)
		refusedFailure(t, ti, sdk.LabelRescheduleNotSensor, 2)
		if ti.Attempt != a {
			t.Fatalf("the refused reschedule started %s: no new epoch may begin", ti.Attempt)
		}
		// A task failure: the retry rail applies, on a new try (no new
		// epoch of the same try).
		rel, err := b.w.Fenced(b.term).Retry(ctx, a, b.clk.Now())
		if err != nil || !rel.Applied || rel.Attempt.Try != 2 || rel.Attempt.Epoch != 0 {
			t.Fatalf("retry after the refused reschedule: %+v %v", rel, err)
		}
	})

	t.Run("SensorReschedules_AndIsRedispatchedNormally", func(t *testing.T) {
		t.Parallel()
		b := setupSensor(t, time.Hour, time.Hour)
		a := sdk.Attempt{RunID: "run", TaskID: "task", Try: 1}
		firstDispatch := base.Add(time.Minute)
		firstPoke := base.Add(2 * time.Minute)
		for epoch := int32(0); epoch < 3; epoch++ {
			if res := b.poke(t, a, time.Minute); res.ShouldTerminate || res.RescheduleRefused != "" {
				t.Fatalf("poke %s: %+v, want parked", a, res)
			}
			ti := b.ti(t)
			if ti.State != sdk.StateUpForReschedule || ti.LastFailureKind != "" || ti.FailureReason != "" {
				t.Fatalf("after poke %s: %+v, want parked up_for_reschedule", a, ti)
			}
			if !ti.Sensor.FirstPokeAt.Equal(firstPoke) || !ti.Sensor.TryDispatchedAt.Equal(firstDispatch) {
				t.Fatalf("after poke %s: first poke %s, try dispatched %s; want %s and %s (never reset by an epoch)",
					a, ti.Sensor.FirstPokeAt, ti.Sensor.TryDispatchedAt, firstPoke, firstDispatch)
			}
			b.clk.Advance(time.Second)
			a = b.reschedule(t, a)
			if ti := b.ti(t); ti.State != sdk.StateNone || !ti.QueuedAt.IsZero() || !ti.RunningAt.IsZero() ||
				!ti.CredentialMintedAt.IsZero() {
				t.Fatalf("the next poke %s starts from none with its per-attempt stamps cleared: %+v", a, ti)
			}
		}
		if a.Epoch != 3 {
			t.Fatalf("after three pokes the attempt is %s, want epoch 3", a)
		}
	})

	t.Run("SensorStopsAtItsTimeout_CountedFromTheFirstPoke_AcrossEpochs", func(t *testing.T) {
		t.Parallel()
		b := setupSensor(t, 10*time.Minute, 0)
		a := sdk.Attempt{RunID: "run", TaskID: "task", Try: 1}
		// Pokes of 2 min each (plus 2 min to start): each under the
		// timeout on its own, the sum past it on the third.
		var res lifecycle.ReportResult
		for i := 0; i < 5; i++ {
			if res = b.poke(t, a, 2*time.Minute); res.RescheduleRefused != "" {
				break
			}
			a = b.reschedule(t, a)
		}
		if res.RescheduleRefused != sdk.LabelSensorTimeout || a.Epoch != 2 {
			t.Fatalf("report of %s: %+v; want %s on the third poke (epoch 2)", a, res, sdk.LabelSensorTimeout)
		}
		// Past its own timeout a sensor does not poke again on a new try.
		refusedFailure(t, b.ti(t), sdk.LabelSensorTimeout, 0)
		rel, err := b.w.Fenced(b.term).Retry(ctx, a, b.clk.Now())
		if err != nil || rel.Applied || rel.Reason != lifecycle.ReasonNoRetries {
			t.Fatalf("retry after a sensor timeout: %+v %v, want no_retries", rel, err)
		}
	})

	t.Run("CredentialCeiling_CountedFromTheTrysFirstDispatch_AcrossReschedules", func(t *testing.T) {
		t.Parallel()
		b := setupSensor(t, 24*time.Hour, 30*time.Minute)
		a := sdk.Attempt{RunID: "run", TaskID: "task", Try: 1}
		// Each poke (10 min from its dispatch to its report) gets a fresh
		// credential at its own dispatch, well under the ceiling; the try's
		// first dispatch is 30 min behind by the fourth poke's report.
		var res lifecycle.ReportResult
		for i := 0; i < 6; i++ {
			if res = b.poke(t, a, 8*time.Minute); res.RescheduleRefused != "" {
				break
			}
			a = b.reschedule(t, a)
		}
		if res.RescheduleRefused != sdk.LabelSensorCredentialCeiling || a.Epoch != 3 {
			t.Fatalf("report of %s: %+v; want %s on the fourth poke (epoch 3)", a, res, sdk.LabelSensorCredentialCeiling)
		}
		// A task failure: its retry policy applies, and the new try counts
		// its bounds from its own dispatch and poke.
		refusedFailure(t, b.ti(t), sdk.LabelSensorCredentialCeiling, 2)
		rel, err := b.w.Fenced(b.term).Retry(ctx, a, b.clk.Now())
		if err != nil || !rel.Applied {
			t.Fatalf("retry: %+v %v", rel, err)
		}
		if ti := b.ti(t); !ti.Sensor.FirstPokeAt.IsZero() || !ti.Sensor.TryDispatchedAt.IsZero() {
			t.Fatalf("a new try starts its bounds over: %+v", ti.Sensor)
		}
		if res := b.poke(t, rel.Attempt, time.Minute); res.RescheduleRefused != "" {
			t.Fatalf("first poke of the new try: %+v, want parked", res)
		}
	})

	t.Run("Guards_HoldOnEveryWrite", func(t *testing.T) {
		t.Parallel()
		b := setupSensor(t, time.Hour, time.Hour)
		a := sdk.Attempt{RunID: "run", TaskID: "task", Try: 1}
		if res := b.poke(t, a, time.Minute); res.RescheduleRefused != "" {
			t.Fatal(res)
		}
		next := b.reschedule(t, a)
		b.to(t, next, sdk.StateRunning, b.clk.Now())
		before := b.ti(t)
		// The superseded poke's token (its epoch), another try, a state
		// the row is not in: nothing written, told to terminate.
		for _, stale := range []sdk.Attempt{a, {RunID: "run", TaskID: "task", Try: 2, Epoch: 1}} {
			res, err := b.w.ReportOutcome(ctx, stale, lifecycle.TerminalReport{State: sdk.StateUpForReschedule}, b.clk.Now())
			if err != nil || !res.ShouldTerminate || res.RescheduleRefused != "" {
				t.Fatalf("report of %s: %+v %v, want should_terminate and nothing refused", stale, res, err)
			}
			unchanged(t, before, b.ti(t))
		}
		// The reschedule rail of a deposed term changes nothing.
		if res, err := b.w.ReportOutcome(ctx, next, lifecycle.TerminalReport{State: sdk.StateUpForReschedule}, b.clk.Now()); err != nil ||
			res.ShouldTerminate {
			t.Fatal(res, err)
		}
		before = b.ti(t)
		rel, err := b.w.Fenced(b.term+1).Reschedule(ctx, next, b.clk.Now())
		if rel.Applied || !errors.Is(err, lifecycle.ErrDeposed) {
			t.Fatalf("reschedule under an old term: %+v %v, want deposed", rel, err)
		}
		unchanged(t, before, b.ti(t))
		// A finished run: the next poke's report changes nothing and the
		// rail starts nothing.
		next = b.reschedule(t, next)
		b.to(t, next, sdk.StateRunning, b.clk.Now())
		if _, err := b.w.FinishRun(ctx, "run", sdk.RunFailed, "stopped", b.clk.Now()); err != nil {
			t.Fatal(err)
		}
		before = b.ti(t)
		res, err := b.w.ReportOutcome(ctx, next, lifecycle.TerminalReport{State: sdk.StateUpForReschedule}, b.clk.Now())
		if err != nil || !res.ShouldTerminate || res.RescheduleRefused != "" {
			t.Fatalf("report on a finished run: %+v %v, want should_terminate", res, err)
		}
		unchanged(t, before, b.ti(t))
	})

	t.Run("CreateRun_RefusesASensorWithoutATimeout", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for name, task := range map[string]lifecycle.NewTask{
			"sensor without a timeout":     {TaskID: "s", Executor: sdk.ExecutorLite, Sensor: true},
			"timeout on a non-sensor task": {TaskID: "s", Executor: sdk.ExecutorLite, SensorTimeout: time.Minute},
		} {
			err := b.w.CreateRun(ctx, lifecycle.NewRun{RunID: "r", DagID: "d", Tasks: []lifecycle.NewTask{task}}, base)
			if err == nil {
				t.Fatalf("%s: created", name)
			}
		}
		if _, err := b.w.Run(ctx, "r"); !errors.Is(err, board.ErrNotFound) {
			t.Fatalf("a refused submit left run r: %v", err)
		}
	})
}

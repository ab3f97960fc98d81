package lifecycle_test

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var base = time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)

type bundle struct {
	w     *lifecycle.Writer
	store *board.Store
	term  int64
}

func setup(t *testing.T) *bundle {
	t.Helper()
	pool := pgtest.NewDB(t)
	store := board.New(pool, board.Options{})
	lease, ok, err := store.TryAcquire(context.Background(), "test", time.Hour, base.Add(-time.Minute))
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	return &bundle{w: lifecycle.New(pool, lifecycle.Options{}), store: store, term: lease.Term}
}

// task creates run "run" (running) with one lite task instance "task",
// retries 2 and an infra budget of 1, and returns its first attempt.
func (b *bundle) task(t *testing.T) sdk.Attempt {
	t.Helper()
	err := b.w.CreateRun(context.Background(), lifecycle.NewRun{RunID: "run", DagID: "dag", Tasks: []lifecycle.NewTask{{
		TaskID: "task", Executor: sdk.ExecutorLite, Retries: 2, InfraBudget: 1,
		Command: "echo hi", ExecutionTimeout: 90 * time.Second,
	}}}, base.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return sdk.Attempt{RunID: "run", TaskID: "task", Try: 1}
}

func (b *bundle) ti(t *testing.T) board.TaskInstance {
	t.Helper()
	ti, err := b.w.TaskInstance(context.Background(), "run", "task")
	if err != nil {
		t.Fatal(err)
	}
	return ti
}

// to drives attempt a from none to state through the writers, each step a
// minute apart, ending at at.
func (b *bundle) to(t *testing.T, a sdk.Attempt, state string, at time.Time) {
	t.Helper()
	ctx := context.Background()
	must := func(what string, ok bool, err error) {
		t.Helper()
		if err != nil || !ok {
			t.Fatalf("%s %s: ok=%v err=%v", what, a, ok, err)
		}
	}
	steps := []string{sdk.StateScheduled, sdk.StateQueued, sdk.StateRunning}
	switch state {
	case sdk.StateScheduled:
		steps = steps[:1]
	case sdk.StateQueued:
		steps = steps[:2]
	}
	at = at.Add(-time.Duration(len(steps)) * time.Minute)
	for _, s := range steps {
		at = at.Add(time.Minute)
		switch s {
		case sdk.StateScheduled:
			ok, err := b.w.Enqueue(ctx, a, at)
			must("enqueue", ok, err)
		case sdk.StateQueued:
			ok, err := b.w.Queue(ctx, a, at)
			must("queue", ok, err)
		case sdk.StateRunning:
			stop, err := b.w.Running(ctx, a, at)
			must("running", !stop, err)
		}
	}
	if state == sdk.StateRunning || state == sdk.StateScheduled || state == sdk.StateQueued {
		return
	}
	stop, err := b.w.Heartbeat(ctx, a, at)
	must("heartbeat", !stop, err)
	switch state {
	case "infra":
		res, err := b.store.Mark(ctx, []sdk.Mark{{Attempt: a, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
			Reason: sdk.LabelAgentLost, Message: "agent_lost: silent", Confirm: true, Term: b.term, At: at}})
		must("mark", err == nil && res[0].Applied, err)
	default:
		if state == sdk.StateUpForReschedule {
			// Only a sensor may park up_for_reschedule: declare the task one.
			if _, err := b.store.Pool().Exec(ctx, `UPDATE task_instances SET sensor = true, sensor_timeout_seconds = 86400
                WHERE run_id = $1 AND task_id = $2`, a.RunID, a.TaskID); err != nil {
				t.Fatal(err)
			}
		}
		stop, err := b.w.Report(ctx, a, lifecycle.TerminalReport{State: state, Reason: "exit_code", Message: "exit 1"}, at)
		must("report", !stop, err)
	}
}

func unchanged(t *testing.T, before, after board.TaskInstance) {
	t.Helper()
	if !reflect.DeepEqual(utc(before), utc(after)) {
		t.Fatalf("a refused write changed the row:\nbefore %+v\nafter  %+v", before, after)
	}
}

func utc(ti board.TaskInstance) board.TaskInstance {
	v := reflect.ValueOf(&ti).Elem()
	for i := 0; i < v.NumField(); i++ {
		if tm, ok := v.Field(i).Interface().(time.Time); ok {
			v.Field(i).Set(reflect.ValueOf(tm.UTC()))
		}
	}
	return ti
}

func TestForwardPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	a := b.task(t)

	ti := b.ti(t)
	if ti.State != sdk.StateNone || ti.Try != 1 || ti.Epoch != 0 || ti.Retries != 2 || ti.MaxRetries != 2 ||
		ti.InfraBudget != 1 || ti.Command != "echo hi" || ti.ExecutionTimeout != 90*time.Second {
		t.Fatalf("created row %+v", ti)
	}
	b.to(t, a, sdk.StateRunning, base.Add(-10*time.Minute))
	ti = b.ti(t)
	if ti.State != sdk.StateRunning || !ti.QueuedAt.Equal(base.Add(-11*time.Minute)) ||
		!ti.RunningAt.Equal(base.Add(-10*time.Minute)) || !ti.LastHeartbeatAt.IsZero() {
		t.Fatalf("running row %+v", ti)
	}
	if stop, err := b.w.Heartbeat(ctx, a, base.Add(-time.Minute)); err != nil || stop {
		t.Fatal(stop, err)
	}
	// A heartbeat that arrives late never moves the stamp backwards.
	if stop, err := b.w.Heartbeat(ctx, a, base.Add(-2*time.Minute)); err != nil || stop {
		t.Fatal(stop, err)
	}
	if got := b.ti(t).LastHeartbeatAt; !got.Equal(base.Add(-time.Minute)) {
		t.Fatalf("last_heartbeat_at = %v", got)
	}
	if stop, err := b.w.Report(ctx, a, lifecycle.TerminalReport{State: sdk.StateSuccess}, base); err != nil || stop {
		t.Fatal(stop, err)
	}
	ti = b.ti(t)
	if ti.State != sdk.StateSuccess || !ti.EndedAt.Equal(base) || ti.LastFailureKind != "" {
		t.Fatalf("finished row %+v", ti)
	}
	if ok, err := b.w.FinishRun(ctx, "run", sdk.RunSuccess, "", base); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if r, err := b.w.Run(ctx, "run"); err != nil || r.State != sdk.RunSuccess || !r.EndedAt.Equal(base) {
		t.Fatalf("run %+v %v", r, err)
	}
}

func TestAgentCallsOfAStaleAttemptAreToldToTerminate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	calls := map[string]func(w *lifecycle.Writer, a sdk.Attempt) (bool, error){
		"Heartbeat": func(w *lifecycle.Writer, a sdk.Attempt) (bool, error) { return w.Heartbeat(ctx, a, base) },
		"Report": func(w *lifecycle.Writer, a sdk.Attempt) (bool, error) {
			return w.Report(ctx, a, lifecycle.TerminalReport{State: sdk.StateSuccess}, base)
		},
	}
	stale := map[string]func(t *testing.T, b *bundle, a sdk.Attempt) sdk.Attempt{
		"StaleTry": func(t *testing.T, b *bundle, a sdk.Attempt) sdk.Attempt { a.Try--; return a },
		"StaleEpoch": func(t *testing.T, b *bundle, a sdk.Attempt) sdk.Attempt {
			a.Epoch++
			return a
		},
		"AttemptMarked": func(t *testing.T, b *bundle, a sdk.Attempt) sdk.Attempt {
			res, err := b.store.Mark(ctx, []sdk.Mark{{Attempt: a, FromStates: []string{sdk.StateRunning},
				Kind: sdk.MarkTask, Reason: sdk.LabelCredentialCeiling, Term: b.term, At: base.Add(-time.Second)}})
			if err != nil || !res[0].Applied {
				t.Fatal(res, err)
			}
			return a
		},
		"RunNoLongerRunning": func(t *testing.T, b *bundle, a sdk.Attempt) sdk.Attempt {
			if ok, err := b.w.FinishRun(ctx, a.RunID, sdk.RunFailed, "orphan_run", base.Add(-time.Second)); err != nil || !ok {
				t.Fatal(ok, err)
			}
			return a
		},
		"UnknownTask": func(t *testing.T, b *bundle, a sdk.Attempt) sdk.Attempt { a.TaskID = "nope"; return a },
	}
	for callName, call := range calls {
		for why, spoil := range stale {
			t.Run(callName+"When"+why, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				a := b.task(t)
				// The second try of the task, so that a stale try has a row to miss.
				b.to(t, a, sdk.StateUpForRetry, base.Add(-4*time.Minute))
				rel, err := b.w.Retry(ctx, a, base.Add(-3*time.Minute))
				if err != nil || !rel.Applied {
					t.Fatal(rel, err)
				}
				a = rel.Attempt
				b.to(t, a, sdk.StateRunning, base.Add(-2*time.Minute))
				target := spoil(t, b, a)
				before := b.ti(t)
				stop, err := call(b.w, target)
				if err != nil || !stop {
					t.Fatalf("stop=%v err=%v, want should_terminate", stop, err)
				}
				unchanged(t, before, b.ti(t))
			})
		}
	}

	t.Run("RunningOfASupersededDispatchIsTold", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.task(t)
		b.to(t, a, sdk.StateQueued, base.Add(-2*time.Minute))
		rel, err := b.w.DispatchBackoff(ctx, a, base.Add(-time.Minute))
		if err != nil || !rel.Applied {
			t.Fatal(rel, err)
		}
		before := b.ti(t)
		// The first dispatch's pod did start after all: its RUNNING report.
		if stop, err := b.w.Running(ctx, a, base); err != nil || !stop {
			t.Fatalf("stop=%v err=%v, want should_terminate", stop, err)
		}
		unchanged(t, before, b.ti(t))
	})

	t.Run("LiveAttemptIsNeverTold", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.task(t)
		b.to(t, a, sdk.StateRunning, base.Add(-time.Minute))
		if stop, err := b.w.Heartbeat(ctx, a, base); err != nil || stop {
			t.Fatalf("stop=%v err=%v for the live attempt", stop, err)
		}
	})
}

func TestRails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := base

	type railCase struct {
		rail    func(w *lifecycle.Writer, a sdk.Attempt) (lifecycle.Release, error)
		from    string // what the attempt it releases is left in (see bundle.to)
		to      string
		bumpTry bool
		check   func(t *testing.T, before, after board.TaskInstance)
	}
	cases := map[string]railCase{
		"Retry": {
			rail: func(w *lifecycle.Writer, a sdk.Attempt) (lifecycle.Release, error) { return w.Retry(ctx, a, now) },
			from: sdk.StateUpForRetry, to: sdk.StateNone, bumpTry: true,
			check: func(t *testing.T, before, after board.TaskInstance) {
				if after.Retries != before.Retries-1 || after.InfraUsed != before.InfraUsed {
					t.Fatalf("retry: retries %d -> %d, infra used %d -> %d", before.Retries, after.Retries, before.InfraUsed, after.InfraUsed)
				}
			},
		},
		"Clear": {
			rail: func(w *lifecycle.Writer, a sdk.Attempt) (lifecycle.Release, error) { return w.Clear(ctx, a, now) },
			from: sdk.StateFailed, to: sdk.StateNone, bumpTry: true,
			check: func(t *testing.T, before, after board.TaskInstance) {
				if after.Retries != after.MaxRetries || after.InfraUsed != 0 || !after.HeldAt.IsZero() {
					t.Fatalf("clear did not restore: %+v", after)
				}
			},
		},
		"Replace": {
			rail: func(w *lifecycle.Writer, a sdk.Attempt) (lifecycle.Release, error) { return w.Replace(ctx, a, now) },
			from: "infra", to: sdk.StateNone,
			check: func(t *testing.T, before, after board.TaskInstance) {
				if after.InfraUsed != before.InfraUsed+1 || after.Retries != before.Retries {
					t.Fatalf("re-place: infra used %d -> %d, retries %d -> %d", before.InfraUsed, after.InfraUsed, before.Retries, after.Retries)
				}
			},
		},
		"Reschedule": {
			rail: func(w *lifecycle.Writer, a sdk.Attempt) (lifecycle.Release, error) { return w.Reschedule(ctx, a, now) },
			from: sdk.StateUpForReschedule, to: sdk.StateNone,
		},
		"WarmRequeue": {
			rail: func(w *lifecycle.Writer, a sdk.Attempt) (lifecycle.Release, error) { return w.WarmRequeue(ctx, a, now) },
			from: sdk.StateRunning, to: sdk.StateScheduled,
		},
		"DispatchBackoff": {
			rail: func(w *lifecycle.Writer, a sdk.Attempt) (lifecycle.Release, error) {
				return w.DispatchBackoff(ctx, a, now)
			},
			from: sdk.StateQueued, to: sdk.StateScheduled,
		},
	}
	resetsOutage := map[string]bool{"Retry": true, "Clear": true, "Replace": true, "Reschedule": true}

	for name, c := range cases {
		t.Run(name+"StartsAFreshAttempt", func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			a := b.task(t)
			b.to(t, a, c.from, base.Add(-10*time.Minute))
			// An outage clock from an earlier dispatch failure.
			if _, err := b.store.Pool().Exec(ctx, "UPDATE task_instances SET dispatch_unavailable_since = $1", base.Add(-time.Hour)); err != nil {
				t.Fatal(err)
			}
			before := b.ti(t)
			rel, err := c.rail(b.w, a)
			if err != nil || !rel.Applied {
				t.Fatalf("%s: %+v %v", name, rel, err)
			}
			want := a
			if c.bumpTry {
				want.Try++
			} else {
				want.Epoch++
			}
			after := b.ti(t)
			if rel.Attempt != want || after.Attempt != want {
				t.Fatalf("new attempt %s (row %s), want %s", rel.Attempt, after.Attempt, want)
			}
			if after.State != c.to {
				t.Fatalf("state %s, want %s", after.State, c.to)
			}
			for field, v := range map[string]time.Time{
				"queued_at": after.QueuedAt, "running_at": after.RunningAt, "last_heartbeat_at": after.LastHeartbeatAt,
				"ended_at": after.EndedAt, "infra_marked_at": after.InfraMarkedAt, "infra_confirmed_at": after.InfraConfirmedAt,
			} {
				if !v.IsZero() {
					t.Errorf("%s kept %s = %v from the released attempt", name, field, v)
				}
			}
			if after.LastFailureKind != "" || after.ErrorMessage != "" || after.FailureReason != "" || after.WarmWorker != "" {
				t.Errorf("%s kept the released attempt's failure: %+v", name, after)
			}
			if !after.ReleasedAt.Equal(now) {
				t.Errorf("released_at = %v, want %v", after.ReleasedAt, now)
			}
			if got := !after.DispatchUnavailableSince.IsZero(); got == resetsOutage[name] {
				t.Errorf("dispatch_unavailable_since = %v after %s", after.DispatchUnavailableSince, name)
			}
			if c.check != nil {
				c.check(t, before, after)
			}

			// The new attempt, once running, is not seen as heartbeated: the
			// agent-lost listing does not list it, and a never-heartbeated
			// mark still finds it silent.
			if c.to == sdk.StateNone {
				if ok, err := b.w.Enqueue(ctx, want, now); err != nil || !ok {
					t.Fatal(ok, err)
				}
			}
			if ok, err := b.w.Queue(ctx, want, now); err != nil || !ok {
				t.Fatal(ok, err)
			}
			if stop, err := b.w.Running(ctx, want, now.Add(time.Second)); err != nil || stop {
				t.Fatal(stop, err)
			}
			p, err := b.store.ListCandidates(ctx, sdk.CandidateQuery{States: []string{sdk.StateRunning},
				OrderBy: sdk.FieldHeartbeatAt, OlderThan: now.Add(time.Hour), Heartbeat: sdk.HeartbeatSeen})
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Candidates) != 0 {
				t.Fatalf("the new attempt is listed as heartbeated: %+v", p.Candidates)
			}
			// And a mark pinned to the released attempt cannot touch it.
			res, err := b.store.Mark(ctx, []sdk.Mark{{Attempt: a, FromStates: []string{sdk.StateRunning},
				Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost, Term: b.term, At: now.Add(2 * time.Second)}})
			if err != nil || res[0].Applied || res[0].NoopReason != sdk.NoopMovedOn {
				t.Fatalf("a mark of the released attempt: %+v %v", res, err)
			}
		})

		t.Run(name+"OfAStaleAttemptIsANoop", func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			a := b.task(t)
			b.to(t, a, c.from, base.Add(-10*time.Minute))
			before := b.ti(t)
			stale := a
			stale.Epoch++
			rel, err := c.rail(b.w, stale)
			if err != nil || rel.Applied || rel.Reason != lifecycle.ReasonMovedOn {
				t.Fatalf("%s of a stale attempt: %+v %v", name, rel, err)
			}
			unchanged(t, before, b.ti(t))
		})
	}

	t.Run("WrongSourceStateIsANoop", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.task(t)
		b.to(t, a, sdk.StateRunning, base.Add(-time.Minute))
		before := b.ti(t)
		for name, c := range cases {
			if name == "Clear" || name == "WarmRequeue" {
				continue // both take a running attempt
			}
			if rel, err := c.rail(b.w, a); err != nil || rel.Applied || rel.Reason != lifecycle.ReasonMovedOn {
				t.Fatalf("%s of a running attempt: %+v %v", name, rel, err)
			}
		}
		unchanged(t, before, b.ti(t))
	})

	t.Run("HeldAttemptIsNotReplacedUntilReleased", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.task(t)
		b.to(t, a, sdk.StateRunning, base.Add(-time.Minute))
		res, err := b.store.Mark(ctx, []sdk.Mark{{Attempt: a, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
			Reason: sdk.LabelAgentLost, Confirm: true, Hold: true, Term: b.term, At: base}})
		if err != nil || !res[0].Applied {
			t.Fatal(res, err)
		}
		if rel, err := b.w.Replace(ctx, a, base); err != nil || rel.Applied || rel.Reason != lifecycle.ReasonHeld {
			t.Fatalf("re-place of a held attempt: %+v %v", rel, err)
		}
		if ok, err := b.w.ReleaseHold(ctx, a, "ops", base); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if rel, err := b.w.Replace(ctx, a, base); err != nil || !rel.Applied {
			t.Fatalf("re-place after the release: %+v %v", rel, err)
		}
	})

	t.Run("ReplaceStopsWhenTheInfraBudgetIsSpent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.task(t) // budget 1
		b.to(t, a, "infra", base.Add(-10*time.Minute))
		rel, err := b.w.Replace(ctx, a, base.Add(-5*time.Minute))
		if err != nil || !rel.Applied {
			t.Fatal(rel, err)
		}
		b.to(t, rel.Attempt, "infra", base.Add(-time.Minute))
		if rel, err := b.w.Replace(ctx, rel.Attempt, base); err != nil || rel.Applied || rel.Reason != lifecycle.ReasonBudgetSpent {
			t.Fatalf("re-place past the budget: %+v %v", rel, err)
		}
	})

	t.Run("RetryStopsWhenNoRetriesAreLeft", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.task(t) // retries 2
		for i := 0; i < 2; i++ {
			b.to(t, a, sdk.StateUpForRetry, base.Add(time.Duration(i)*time.Minute))
			rel, err := b.w.Retry(ctx, a, base.Add(time.Duration(i)*time.Minute))
			if err != nil || !rel.Applied {
				t.Fatal(rel, err)
			}
			a = rel.Attempt
		}
		b.to(t, a, sdk.StateFailed, base.Add(5*time.Minute))
		if rel, err := b.w.Retry(ctx, a, base.Add(5*time.Minute)); err != nil || rel.Applied || rel.Reason != lifecycle.ReasonNoRetries {
			t.Fatalf("retry with none left: %+v %v", rel, err)
		}
		// A clear gives them back.
		rel, err := b.w.Clear(ctx, a, base.Add(6*time.Minute))
		if err != nil || !rel.Applied || rel.Attempt.Try != 4 || b.ti(t).Retries != 2 {
			t.Fatalf("clear: %+v %v (%+v)", rel, err, b.ti(t))
		}
	})

	t.Run("DispatchBackoffKeepsTheOutageClock", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.task(t)
		b.to(t, a, sdk.StateQueued, base.Add(-10*time.Minute))
		first, err := b.w.DispatchBackoff(ctx, a, base.Add(-9*time.Minute))
		if err != nil || !first.Applied || !first.UnavailableSince.Equal(base.Add(-9*time.Minute)) {
			t.Fatal(first, err)
		}
		if ok, err := b.w.Queue(ctx, first.Attempt, base.Add(-8*time.Minute)); err != nil || !ok {
			t.Fatal(ok, err)
		}
		second, err := b.w.DispatchBackoff(ctx, first.Attempt, base)
		if err != nil || !second.Applied || !second.UnavailableSince.Equal(base.Add(-9*time.Minute)) {
			t.Fatalf("the second failure restarted the outage clock: %+v %v", second, err)
		}
		// Giving up: a terminal dispatch failure spends the retries.
		ok, err := b.w.Fail(ctx, second.Attempt, []string{sdk.StateScheduled},
			lifecycle.Failure{Kind: sdk.MarkTask, Reason: "dispatch_failed", Message: "dispatch_failed: API unavailable for 15m", Terminal: true}, base)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		ti := b.ti(t)
		if ti.State != sdk.StateFailed || ti.Retries != 0 || ti.FailureReason != "dispatch_failed" {
			t.Fatalf("after give-up: %+v", ti)
		}
		if rel, err := b.w.Retry(ctx, ti.Attempt, base); err != nil || rel.Reason != lifecycle.ReasonNoRetries {
			t.Fatalf("a terminal dispatch failure was retried: %+v %v", rel, err)
		}
	})
}

func TestCreateRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("InvalidExecutorIsRejectedByTheDatabaseAndNothingIsWritten", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		err := b.w.CreateRun(ctx, lifecycle.NewRun{RunID: "run", DagID: "dag", Tasks: []lifecycle.NewTask{
			{TaskID: "ok", Executor: sdk.ExecutorLite}, {TaskID: "bad", Executor: "k8s"}}}, base)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23514" {
			t.Fatalf("err = %v, want a check violation", err)
		}
		if _, err := b.w.Run(ctx, "run"); !errors.Is(err, board.ErrNotFound) {
			t.Fatalf("the run was written anyway: %v", err)
		}
	})

	t.Run("QueuedRunStartsLater", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if err := b.w.CreateRun(ctx, lifecycle.NewRun{RunID: "run", DagID: "dag", State: sdk.RunQueued}, base); err != nil {
			t.Fatal(err)
		}
		if ok, err := b.w.StartRun(ctx, "run", base.Add(time.Minute)); err != nil || !ok {
			t.Fatal(ok, err)
		}
		r, err := b.w.Run(ctx, "run")
		if err != nil || r.State != sdk.RunRunning || !r.StartedAt.Equal(base.Add(time.Minute)) {
			t.Fatalf("run %+v %v", r, err)
		}
	})

	t.Run("RepeatedTaskIsRejected", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		err := b.w.CreateRun(ctx, lifecycle.NewRun{RunID: "run", DagID: "dag", Tasks: []lifecycle.NewTask{
			{TaskID: "t", Executor: sdk.ExecutorLite}, {TaskID: "t", Executor: sdk.ExecutorLite}}}, base)
		if err == nil {
			t.Fatal("no error")
		}
	})
}

// A batch of heartbeats is one statement, yet each row is guarded on its own
// attempt: the running attempts renew, the superseded one (a stale epoch) and
// the one not running are told to terminate and are left unchanged, and each
// call is answered in its own place, duplicates merged to the latest.
func TestHeartbeatBatchGuardsEachAttemptAndAnswersEachCall(t *testing.T) {
	ctx := context.Background()
	b := setup(t)
	var tasks []lifecycle.NewTask
	for _, id := range []string{"a", "b", "stale", "queued"} {
		tasks = append(tasks, lifecycle.NewTask{TaskID: id, Executor: sdk.ExecutorLite, Command: "true"})
	}
	if err := b.w.CreateRun(ctx, lifecycle.NewRun{RunID: "run", DagID: "dag", Tasks: tasks}, base.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	at := func(id string) sdk.Attempt { return sdk.Attempt{RunID: "run", TaskID: id, Try: 1} }
	for _, id := range []string{"a", "b", "stale"} {
		b.to(t, at(id), sdk.StateRunning, base.Add(-10*time.Minute))
	}
	b.to(t, at("queued"), sdk.StateQueued, base.Add(-10*time.Minute))
	read := func(id string) board.TaskInstance {
		ti, err := b.w.TaskInstance(ctx, "run", id)
		if err != nil {
			t.Fatal(err)
		}
		return ti
	}
	staleBefore, queuedBefore := read("stale"), read("queued")
	superseded := at("stale")
	superseded.Epoch = 7 // the row holds epoch 0: this attempt is not the row's

	calls := []lifecycle.HeartbeatCall{
		{Attempt: at("a"), Renewal: lifecycle.Renewed, At: base.Add(-time.Minute)},
		{Attempt: superseded, Renewal: lifecycle.Renewed, At: base},
		{Attempt: at("b"), Renewal: lifecycle.Capped, At: base},
		{Attempt: at("queued"), Renewal: lifecycle.Renewed, At: base},
		{Attempt: at("a"), Renewal: lifecycle.Renewed, At: base}, // a again, later
	}
	term, err := b.w.HeartbeatCredentials(ctx, calls)
	if err != nil {
		t.Fatal(err)
	}
	if want := []bool{false, true, false, true, false}; !reflect.DeepEqual(term, want) {
		t.Fatalf("shouldTerminate = %v, want %v", term, want)
	}
	if ti := read("a"); !ti.LastHeartbeatAt.Equal(base) || !ti.CredentialRenewedAt.Equal(base) || !ti.CredentialCappedAt.IsZero() {
		t.Fatalf("a: heartbeat %v renewed %v capped %v, want the latest call's", ti.LastHeartbeatAt, ti.CredentialRenewedAt, ti.CredentialCappedAt)
	}
	if ti := read("b"); !ti.LastHeartbeatAt.Equal(base) || !ti.CredentialCappedAt.Equal(base) || !ti.CredentialRenewedAt.IsZero() {
		t.Fatalf("b: heartbeat %v renewed %v capped %v, want capped at %v", ti.LastHeartbeatAt, ti.CredentialRenewedAt, ti.CredentialCappedAt, base)
	}
	unchanged(t, staleBefore, read("stale"))
	unchanged(t, queuedBefore, read("queued"))
}

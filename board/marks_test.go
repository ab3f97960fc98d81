package board_test

import (
	"context"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/eventually"
)

func TestMark(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// A running attempt that heartbeated ten minutes before base, and the
	// agent-lost mark a reaper would make of it at base.
	setupRunning := func(t *testing.T) (*bundle, sdk.Attempt, sdk.Mark) {
		t.Helper()
		b := setup(t)
		b.run(t, "run", "task")
		a := first("run", "task")
		b.running(t, a, base.Add(-20*time.Minute), base.Add(-10*time.Minute))
		m := sdk.Mark{
			Attempt:         a,
			FromStates:      []string{sdk.StateRunning},
			HeartbeatBefore: base.Add(-90 * time.Second),
			Kind:            sdk.MarkInfra,
			Reason:          sdk.LabelAgentLost,
			Message:         "agent_lost: no heartbeat for 10m",
			Term:            b.term,
			At:              base,
		}
		return b, a, m
	}
	markOne := func(t *testing.T, b *bundle, m sdk.Mark) sdk.MarkResult {
		t.Helper()
		res, err := b.store.Mark(ctx, []sdk.Mark{m})
		if err != nil {
			t.Fatal(err)
		}
		if len(res) != 1 || res[0].Attempt != m.Attempt {
			t.Fatalf("results %+v do not answer the mark of %s", res, m.Attempt)
		}
		return res[0]
	}
	// noop asserts that the mark is a no-op for reason and wrote nothing.
	noop := func(t *testing.T, b *bundle, m sdk.Mark, reason string) {
		t.Helper()
		before := b.ti(t, m.RunID, m.TaskID)
		r := markOne(t, b, m)
		if r.Applied || r.NoopReason != reason {
			t.Fatalf("mark = %+v, want a no-op for %q", r, reason)
		}
		unchanged(t, before, b.ti(t, m.RunID, m.TaskID))
	}

	t.Run("InfraMarkFailsTheAttemptOnTheInfraRail", func(t *testing.T) {
		t.Parallel()
		b, a, m := setupRunning(t)
		if r := markOne(t, b, m); !r.Applied || r.NoopReason != "" {
			t.Fatalf("mark = %+v, want applied", r)
		}
		ti := b.ti(t, a.RunID, a.TaskID)
		if ti.State != sdk.StateFailed || ti.LastFailureKind != sdk.FailureInfra || ti.FailureReason != sdk.LabelAgentLost ||
			ti.ErrorMessage != m.Message {
			t.Fatalf("row after an infra mark: %+v", ti)
		}
		sameTime(t, "infra_marked_at", ti.InfraMarkedAt, base)
		sameTime(t, "ended_at", ti.EndedAt, base)
		if !ti.InfraConfirmedAt.IsZero() || !ti.HeldAt.IsZero() {
			t.Fatalf("an unconfirmed, unheld mark set infra_confirmed_at=%v held_at=%v", ti.InfraConfirmedAt, ti.HeldAt)
		}
	})

	t.Run("ConfirmedAndHeldMarkStampsBoth", func(t *testing.T) {
		t.Parallel()
		b, a, m := setupRunning(t)
		m.Confirm, m.Hold = true, true
		if r := markOne(t, b, m); !r.Applied {
			t.Fatalf("mark = %+v, want applied", r)
		}
		ti := b.ti(t, a.RunID, a.TaskID)
		sameTime(t, "infra_confirmed_at", ti.InfraConfirmedAt, base)
		sameTime(t, "held_at", ti.HeldAt, base)
	})

	t.Run("TaskMarkIsATaskFailure", func(t *testing.T) {
		t.Parallel()
		b, a, m := setupRunning(t)
		m.Kind, m.Reason, m.Confirm = sdk.MarkTask, sdk.LabelCredentialCeiling, true
		if r := markOne(t, b, m); !r.Applied {
			t.Fatalf("mark = %+v, want applied", r)
		}
		ti := b.ti(t, a.RunID, a.TaskID)
		if ti.State != sdk.StateFailed || ti.LastFailureKind != sdk.FailureTask || ti.FailureReason != sdk.LabelCredentialCeiling {
			t.Fatalf("row after a task mark: %+v", ti)
		}
		if !ti.InfraMarkedAt.IsZero() || !ti.InfraConfirmedAt.IsZero() {
			t.Fatalf("a task mark stamped infra fields: %+v", ti)
		}
	})

	t.Run("StaleTryIsANoop", func(t *testing.T) {
		t.Parallel()
		b, _, m := setupRunning(t)
		m.Try++
		noop(t, b, m, sdk.NoopMovedOn)
	})

	t.Run("StaleEpochIsANoop", func(t *testing.T) {
		t.Parallel()
		b, _, m := setupRunning(t)
		m.Epoch++
		noop(t, b, m, sdk.NoopMovedOn)
	})

	t.Run("WrongSourceStateIsANoop", func(t *testing.T) {
		t.Parallel()
		b, _, m := setupRunning(t)
		m.FromStates = []string{sdk.StateQueued}
		noop(t, b, m, sdk.NoopMovedOn)
	})

	t.Run("ReplacedAttemptIsANoop", func(t *testing.T) {
		t.Parallel()
		b, a, m := setupRunning(t)
		// Marked, confirmed and re-placed between the listing and this mark.
		first := m
		first.Confirm = true
		markOne(t, b, first)
		if rel, err := b.w.Replace(ctx, a, base); err != nil || !rel.Applied {
			t.Fatalf("re-place: %+v %v", rel, err)
		}
		// (No mark may come from none, where a re-place leaves the row:
		// the epoch guard alone is the conformance suite's.)
		noop(t, b, m, sdk.NoopMovedOn)
	})

	t.Run("DeposedTermIsANoop", func(t *testing.T) {
		t.Parallel()
		b, _, m := setupRunning(t)
		// The lease lapsed and another replica took over with the next term.
		lease, ok, err := b.store.TryAcquire(ctx, "other", leaseTTL, base.Add(-time.Minute+leaseTTL))
		if err != nil || !ok || lease.Term != b.term+1 {
			t.Fatalf("takeover: %+v %v %v", lease, ok, err)
		}
		m.At = lease.AcquiredAt.Add(time.Second)
		noop(t, b, m, sdk.NoopDeposed)
	})

	t.Run("NewerTermIsANoop", func(t *testing.T) {
		t.Parallel()
		b, _, m := setupRunning(t)
		m.Term++
		noop(t, b, m, sdk.NoopDeposed)
	})

	t.Run("ExpiredLeaseIsANoop", func(t *testing.T) {
		t.Parallel()
		b, _, m := setupRunning(t)
		m.At = base.Add(2 * leaseTTL)
		noop(t, b, m, sdk.NoopDeposed)
	})

	t.Run("ResignedLeaseIsANoop", func(t *testing.T) {
		t.Parallel()
		b, _, m := setupRunning(t)
		if ok, err := b.store.Resign(ctx, b.term, "test-leader"); err != nil || !ok {
			t.Fatalf("resign: %v %v", ok, err)
		}
		noop(t, b, m, sdk.NoopDeposed)
	})

	t.Run("HeartbeatSinceIsANoop", func(t *testing.T) {
		t.Parallel()
		b, a, m := setupRunning(t)
		if stop, err := b.w.Heartbeat(ctx, a, base.Add(-30*time.Second)); err != nil || stop {
			t.Fatalf("heartbeat: %v %v", stop, err)
		}
		noop(t, b, m, sdk.NoopHeartbeated)
	})

	t.Run("FirstHeartbeatIsANoopForANeverHeartbeatedMark", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, "run", "task")
		a := first("run", "task")
		b.running(t, a, base.Add(-5*time.Minute), base.Add(-time.Second))
		m := sdk.Mark{Attempt: a, FromStates: []string{sdk.StateRunning}, RequireNoHeartbeat: true,
			Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost, Term: b.term, At: base}
		noop(t, b, m, sdk.NoopHeartbeated)
	})

	t.Run("UnknownTaskInstanceIsNotFound", func(t *testing.T) {
		t.Parallel()
		b, _, m := setupRunning(t)
		m.TaskID = "nope"
		r := markOne(t, b, m)
		if r.Applied || r.NoopReason != sdk.NoopNotFound {
			t.Fatalf("mark = %+v, want not found", r)
		}
	})

	t.Run("BatchAnswersEveryMarkInOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, "run", "a", "b", "c", "d")
		for _, id := range []string{"a", "b", "c", "d"} {
			b.running(t, first("run", id), base.Add(-20*time.Minute), base.Add(-10*time.Minute))
		}
		if stop, err := b.w.Heartbeat(ctx, first("run", "c"), base); err != nil || stop {
			t.Fatal(stop, err)
		}
		mk := func(id string) sdk.Mark {
			return sdk.Mark{Attempt: first("run", id), FromStates: []string{sdk.StateRunning},
				HeartbeatBefore: base.Add(-90 * time.Second), Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost,
				Term: b.term, At: base}
		}
		stale := mk("b")
		stale.Epoch = 7
		marks := []sdk.Mark{mk("d"), stale, mk("c"), mk("a")}
		res, err := b.store.Mark(ctx, marks)
		if err != nil {
			t.Fatal(err)
		}
		assertMarkResults(t, res, []markWant{{"d", true, ""}, {"b", false, sdk.NoopMovedOn},
			{"c", false, sdk.NoopHeartbeated}, {"a", true, ""}})
		if ti := b.ti(t, "run", "b"); ti.State != sdk.StateRunning {
			t.Fatalf("the stale mark wrote task b: %+v", ti)
		}
	})

	t.Run("BatchOfSeveralTermsAndTimesFencesEachMarkOnItsOwn", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.run(t, "run", "a", "b", "c", "d")
		for _, id := range []string{"a", "b", "c", "d"} {
			b.running(t, first("run", id), base.Add(-20*time.Minute), base.Add(-10*time.Minute))
		}
		mk := func(id string, term int64, at time.Time) sdk.Mark {
			return sdk.Mark{Attempt: first("run", id), FromStates: []string{sdk.StateRunning},
				HeartbeatBefore: base.Add(-90 * time.Second), Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost,
				Term: term, At: at}
		}
		// Interleaved: two times under the current term, and a term that
		// does not lead.
		marks := []sdk.Mark{mk("d", b.term, base), mk("b", b.term+1, base), mk("c", b.term, base.Add(-time.Second)),
			mk("a", b.term, base)}
		res, err := b.store.Mark(ctx, marks)
		if err != nil {
			t.Fatal(err)
		}
		assertMarkResults(t, res, []markWant{{"d", true, ""}, {"b", false, sdk.NoopDeposed}, {"c", true, ""},
			{"a", true, ""}})
		for task, ended := range map[string]time.Time{"a": base, "b": {}, "c": base.Add(-time.Second), "d": base} {
			if got := b.ti(t, "run", task).EndedAt; !got.Equal(ended) {
				t.Fatalf("task %s ended at %v, want %v (its own mark's time)", task, got, ended)
			}
		}
	})

	t.Run("MalformedBatchIsAnErrorAndWritesNothing", func(t *testing.T) {
		t.Parallel()
		b, a, m := setupRunning(t)
		bad := map[string]func(*sdk.Mark){
			"UnknownState": func(m *sdk.Mark) { m.FromStates = []string{"runnin"} },
			"NoStates":     func(m *sdk.Mark) { m.FromStates = nil },
			"NoTerm":       func(m *sdk.Mark) { m.Term = 0 },
			"UnknownKind":  func(m *sdk.Mark) { m.Kind = "oops" },
			"NoTime":       func(m *sdk.Mark) { m.At = time.Time{} },
		}
		for name, spoil := range bad {
			mm := m
			spoil(&mm)
			if _, err := b.store.Mark(ctx, []sdk.Mark{m, mm}); err == nil {
				t.Fatalf("%s: no error", name)
			}
		}
		if _, err := b.store.Mark(ctx, []sdk.Mark{m, m}); err == nil {
			t.Fatal("a batch naming one task instance twice: no error")
		}
		if ti := b.ti(t, a.RunID, a.TaskID); ti.State != sdk.StateRunning {
			t.Fatalf("a rejected batch wrote: %+v", ti)
		}
	})

	t.Run("TakeoverDuringAMarkDeposesIt", func(t *testing.T) {
		t.Parallel()
		b, a, m := setupRunning(t)
		// Another replica's takeover is in flight: it holds the leader row.
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, "UPDATE leader SET term = term + 1, holder = 'other'"); err != nil {
			t.Fatal(err)
		}
		done := make(chan []sdk.MarkResult, 1)
		go func() {
			res, err := b.store.Mark(ctx, []sdk.Mark{m})
			if err != nil {
				t.Error(err)
			}
			done <- res
		}()
		waitForLockWait(t, b)
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		res := <-done
		if len(res) != 1 || res[0].Applied || res[0].NoopReason != sdk.NoopDeposed {
			t.Fatalf("a mark that waited out a takeover: %+v, want deposed", res)
		}
		if ti := b.ti(t, a.RunID, a.TaskID); ti.State != sdk.StateRunning {
			t.Fatalf("a deposed mark wrote: %+v", ti)
		}
	})
}

// waitForLockWait returns once some session of b's database waits on a lock
// (the test's signal that a statement is blocked where it should be).
func waitForLockWait(t *testing.T, b *bundle) {
	t.Helper()
	eventually.True(t, 10*time.Second, "a session to wait on a lock", func() bool {
		var n int
		err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
            WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	}, eventually.Every(2*time.Millisecond))
}

// markWant is the result a test expects of one mark of a batch.
type markWant struct {
	task    string
	applied bool
	reason  string
}

// assertMarkResults checks a batch's results, in order, against want.
func assertMarkResults(t *testing.T, res []sdk.MarkResult, want []markWant) {
	t.Helper()
	if len(res) != len(want) {
		t.Fatalf("%d results, want %d: %+v", len(res), len(want), res)
	}
	for i, w := range want {
		if res[i].TaskID != w.task || res[i].Applied != w.applied || res[i].NoopReason != w.reason {
			t.Fatalf("result %d = %+v, want task %s applied=%v reason=%q", i, res[i], w.task, w.applied, w.reason)
		}
	}
}

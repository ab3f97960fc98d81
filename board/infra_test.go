package board_test

import (
	"context"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

func TestReconcilerWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	valve := 2 * time.Minute
	markedAt := base.Add(-time.Minute)

	confirm := func(t *testing.T, b *bundle, term int64, a sdk.Attempt, at time.Time) sdk.MarkResult {
		t.Helper()
		res, err := b.store.ConfirmInfra(ctx, []sdk.Confirm{{Attempt: a, Term: term, At: at}})
		if err != nil || len(res) != 1 {
			t.Fatalf("confirm: %+v %v", res, err)
		}
		return res[0]
	}
	override := func(t *testing.T, b *bundle, a sdk.Attempt, markedAfter time.Time) sdk.MarkResult {
		t.Helper()
		res, err := b.store.OverrideInfra(ctx, []sdk.Override{{Attempt: a, MarkedAfter: markedAfter, Term: b.term, At: base}})
		if err != nil || len(res) != 1 {
			t.Fatalf("override: %+v %v", res, err)
		}
		return res[0]
	}

	// A kube attempt with a provisional agent_lost mark made a minute ago.
	setupMarked := func(t *testing.T) (*bundle, sdk.Attempt) {
		t.Helper()
		b := setup(t)
		b.runWith(t, "run", sdk.ExecutorKube, "task")
		a := first("run", "task")
		b.running(t, a, base.Add(-10*time.Minute), base.Add(-5*time.Minute))
		mark(t, b, sdk.Mark{Attempt: a, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
			Reason: sdk.LabelAgentLost, Message: "agent_lost: silent", Term: b.term, At: markedAt})
		return b, a
	}

	t.Run("ConfirmStampsAProvisionalMarkOnce", func(t *testing.T) {
		t.Parallel()
		b, a := setupMarked(t)
		if r := confirm(t, b, b.term, a, base); !r.Applied {
			t.Fatal(r)
		}
		sameTime(t, "infra_confirmed_at", b.ti(t, "run", "task").InfraConfirmedAt, base)
		if r := confirm(t, b, b.term, a, base.Add(time.Second)); r.Applied || r.NoopReason != sdk.NoopMovedOn {
			t.Fatalf("a second confirmation: %+v", r)
		}
	})

	t.Run("ConfirmOfAnotherAttemptOrTermIsANoop", func(t *testing.T) {
		t.Parallel()
		b, a := setupMarked(t)
		before := b.ti(t, "run", "task")
		stale := a
		stale.Epoch++
		if r := confirm(t, b, b.term, stale, base); r.Applied || r.NoopReason != sdk.NoopMovedOn {
			t.Fatalf("stale epoch: %+v", r)
		}
		if r := confirm(t, b, b.term+1, a, base); r.Applied || r.NoopReason != sdk.NoopDeposed {
			t.Fatalf("wrong term: %+v", r)
		}
		unchanged(t, before, b.ti(t, "run", "task"))
	})

	t.Run("DurableSuccessOverridesAProvisionalMark", func(t *testing.T) {
		t.Parallel()
		b, a := setupMarked(t)
		if r := override(t, b, a, base.Add(-valve)); !r.Applied {
			t.Fatalf("override: %+v", r)
		}
		ti := b.ti(t, "run", "task")
		if ti.State != sdk.StateSuccess || ti.LastFailureKind != "" || !ti.InfraMarkedAt.IsZero() || ti.ErrorMessage != "" {
			t.Fatalf("row after the override: %+v", ti)
		}
		lines, err := b.store.AttemptLog(ctx, "run", "task")
		if err != nil || len(lines) != 1 || lines[0].Line != "outcome recovered from the durable record over agent_lost" ||
			lines[0].Attempt != a {
			t.Fatalf("log after the override: %+v %v", lines, err)
		}
	})

	noOverride := map[string]func(t *testing.T, b *bundle, a sdk.Attempt) (sdk.Attempt, time.Time){
		"Confirmed": func(t *testing.T, b *bundle, a sdk.Attempt) (sdk.Attempt, time.Time) {
			if r := confirm(t, b, b.term, a, base.Add(-time.Second)); !r.Applied {
				t.Fatal(r)
			}
			return a, base.Add(-valve)
		},
		"ValveOpen": func(t *testing.T, b *bundle, a sdk.Attempt) (sdk.Attempt, time.Time) {
			return a, markedAt // the valve opened at the mark itself
		},
		"RunFinished": func(t *testing.T, b *bundle, a sdk.Attempt) (sdk.Attempt, time.Time) {
			if ok, err := b.w.FinishRun(ctx, "run", sdk.RunFailed, "", base.Add(-time.Second)); err != nil || !ok {
				t.Fatal(ok, err)
			}
			return a, base.Add(-valve)
		},
		"SupersededPod": func(t *testing.T, b *bundle, a sdk.Attempt) (sdk.Attempt, time.Time) {
			a.Epoch++ // the record names another execution of the try
			return a, base.Add(-valve)
		},
	}
	for name, prepare := range noOverride {
		t.Run("NoOverrideWhen"+name, func(t *testing.T) {
			t.Parallel()
			b, a := setupMarked(t)
			att, after := prepare(t, b, a)
			before := b.ti(t, "run", "task")
			if r := override(t, b, att, after); r.Applied {
				t.Fatalf("override applied: %+v", r)
			}
			unchanged(t, before, b.ti(t, "run", "task"))
			if lines, _ := b.store.AttemptLog(ctx, "run", "task"); len(lines) != 0 {
				t.Fatalf("a refused override logged %+v", lines)
			}
		})
	}
}

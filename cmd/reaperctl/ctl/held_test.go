package ctl

import (
	"context"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// heldBoard holds run r: task a held since 30m ago, task b held since 4m
// ago, task c marked but not held, task d running.
func heldBoard(t *testing.T) *bundle {
	t.Helper()
	b := setup(t, "")
	b.createRun(t, "r", base.Add(-time.Hour), "a", "b", "c", "d")
	for _, task := range []string{"a", "b", "c", "d"} {
		b.running(t, first("r", task), base.Add(-50*time.Minute), base.Add(-49*time.Minute), base.Add(-40*time.Minute))
	}
	b.mark(t, first("r", "b"), true, base.Add(-4*time.Minute))
	b.mark(t, first("r", "a"), true, base.Add(-30*time.Minute))
	b.mark(t, first("r", "c"), false, base.Add(-30*time.Minute))
	return b
}

func TestHeld(t *testing.T) {
	t.Parallel()

	t.Run("ListsHoldsOldestFirst", func(t *testing.T) {
		t.Parallel()
		b := heldBoard(t)
		r := b.ctl(t, "held").ok(t)
		golden(t, r.stdout, `
RUN  TASK  TRY  EPOCH  STATE   REASON            SINCE  ERROR
r    a     1    0      failed  infra:agent_lost  30m    agent_lost: no heartbeat for 6m
r    b     1    0      failed  infra:agent_lost  4m     agent_lost: no heartbeat for 6m
release one with: reaperctl release RUN TASK
`)
	})

	t.Run("LimitSaysMoreAreHeld", func(t *testing.T) {
		t.Parallel()
		b := heldBoard(t)
		var doc heldJSON
		b.ctl(t, "held", "-json", "-limit", "1").ok(t).decode(t, &doc)
		if len(doc.Held) != 1 || !doc.More || doc.Held[0].TaskID != "a" || doc.Held[0].HeldAt == nil {
			t.Fatalf("document %+v", doc)
		}
	})

	t.Run("NothingHeld", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		golden(t, b.ctl(t, "held").ok(t).stdout, "no attempts are held for review\n")
		var doc heldJSON
		b.ctl(t, "held", "-json").ok(t).decode(t, &doc)
		if doc.Held == nil || len(doc.Held) != 0 || doc.More {
			t.Fatalf("document %+v", doc)
		}
	})
}

func TestRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ReleasesAHeldAttempt", func(t *testing.T) {
		t.Parallel()
		b := heldBoard(t)
		r := b.ctl(t, "release", "r", "b").ok(t)
		golden(t, r.stdout, "released r/b try 1 epoch 0 (held 4m, infra:agent_lost): the runner may re-place it now\n")
		ti, err := b.store.TaskInstance(ctx, "r", "b")
		if err != nil {
			t.Fatal(err)
		}
		if !ti.HeldAt.IsZero() || ti.State != sdk.StateFailed || ti.Try != 1 || ti.Epoch != 0 || !ti.UpdatedAt.Equal(base) {
			t.Fatalf("after release %+v", ti)
		}
		// The hold was all that barred the re-place rail.
		if rel, err := b.w.Replace(ctx, first("r", "b"), base); err != nil || !rel.Applied {
			t.Fatalf("re-place after release: %+v %v", rel, err)
		}
	})

	t.Run("JSONDocument", func(t *testing.T) {
		t.Parallel()
		b := heldBoard(t)
		var doc releaseJSON
		b.ctl(t, "release", "-json", "r", "a").ok(t).decode(t, &doc)
		if !doc.Released || doc.Attempt.TaskID != "a" || doc.Attempt.HeldAt != nil {
			t.Fatalf("document %+v", doc)
		}
	})

	t.Run("NotHeldOrUnknownIsOneLineAndChangesNothing", func(t *testing.T) {
		t.Parallel()
		b := heldBoard(t)
		before := b.snapshot(t)
		b.ctl(t, "release", "r", "c").failed(t, 1, "r/c try 1 epoch 0 is not held for review")
		b.ctl(t, "release", "r", "d").failed(t, 1, "r/d try 1 epoch 0 is not held for review")
		b.ctl(t, "release", "r", "zz").failed(t, 1, `run "r" has no task "zz"`)
		b.ctl(t, "release", "nope", "a").failed(t, 1, `no run "nope"`)
		b.unchanged(t, before)
	})
}

package lifecycle_test

import (
	"context"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
)

// warmTask creates run runID (running) with one warm task instance "t",
// scheduled, and returns its first attempt.
func (b *bundle) warmTask(t *testing.T, runID string) sdk.Attempt {
	t.Helper()
	ctx := context.Background()
	if err := b.w.CreateRun(ctx, lifecycle.NewRun{RunID: runID, DagID: "dag", Tasks: []lifecycle.NewTask{{
		TaskID: "t", Executor: sdk.ExecutorWarm, Command: "echo warm"}}}, base.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	a := sdk.Attempt{RunID: runID, TaskID: "t", Try: 1}
	if ok, err := b.w.Enqueue(ctx, a, base.Add(-time.Minute)); err != nil || !ok {
		t.Fatal(ok, err)
	}
	return a
}

func TestWarmBinding(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("BoundAttemptIsClaimableByItsWorkerOnlyUntilItRuns", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a1, a2 := b.warmTask(t, "r1"), b.warmTask(t, "r2")
		for i, a := range []sdk.Attempt{a1, a2} {
			if ok, err := b.w.QueueWarm(ctx, a, []string{"w-a", "w-b"}[i], base.Add(time.Duration(i)*time.Second)); err != nil || !ok {
				t.Fatal(ok, err)
			}
		}
		got, err := b.w.BoundTo(ctx, "w-a", 10)
		if err != nil || len(got) != 1 || got[0].Attempt != a1 || got[0].WarmWorker != "w-a" || got[0].Command != "echo warm" {
			t.Fatalf("bound to w-a: %+v, %v", got, err)
		}
		if stop, err := b.w.Running(ctx, a1, base.Add(time.Minute)); err != nil || stop {
			t.Fatal(stop, err)
		}
		if got, err := b.w.BoundTo(ctx, "w-a", 10); err != nil || len(got) != 0 {
			t.Fatalf("a running attempt is still claimable: %+v, %v", got, err)
		}
		all, err := b.w.ListWarmBound(ctx, nil, 10)
		if err != nil || len(all) != 2 || all[0].State != sdk.StateRunning || all[1].State != sdk.StateQueued {
			t.Fatalf("bound warm attempts: %+v, %v", all, err)
		}
	})

	t.Run("WarmRequeueUnstarted_QueuedGoesBackScheduledUnboundOnANewEpoch", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.warmTask(t, "r1")
		if ok, err := b.w.QueueWarm(ctx, a, "w-a", base); err != nil || !ok {
			t.Fatal(ok, err)
		}
		rel, err := b.w.WarmRequeueUnstarted(ctx, a, base.Add(time.Second))
		want := sdk.Attempt{RunID: "r1", TaskID: "t", Try: 1, Epoch: 1}
		if err != nil || !rel.Applied || rel.Attempt != want {
			t.Fatalf("requeue: %+v, %v", rel, err)
		}
		ti, err := b.w.TaskInstance(ctx, "r1", "t")
		if err != nil || ti.State != sdk.StateScheduled || ti.WarmWorker != "" || !ti.QueuedAt.IsZero() ||
			!ti.ReleasedAt.Equal(base.Add(time.Second)) {
			t.Fatalf("row %+v, %v", ti, err)
		}
		// The old attempt's RUNNING, arriving late, starts nothing.
		if stop, err := b.w.Running(ctx, a, base.Add(2*time.Second)); err != nil || !stop {
			t.Fatalf("late RUNNING of the requeued attempt: stop=%v %v", stop, err)
		}
	})

	t.Run("WarmRequeueUnstarted_NeverMovesARunningAttempt", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.warmTask(t, "r1")
		if ok, err := b.w.QueueWarm(ctx, a, "w-a", base); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if stop, err := b.w.Running(ctx, a, base.Add(time.Second)); err != nil || stop {
			t.Fatal(stop, err)
		}
		rel, err := b.w.WarmRequeueUnstarted(ctx, a, base.Add(2*time.Second))
		if err != nil || rel.Applied || rel.Reason != lifecycle.ReasonMovedOn {
			t.Fatalf("requeue of a running attempt: %+v, %v", rel, err)
		}
		if stop, err := b.w.Heartbeat(ctx, a, base.Add(3*time.Second)); err != nil || stop {
			t.Fatalf("the running attempt was disturbed: stop=%v %v", stop, err)
		}
	})
}

// TestWarmWorkerPodRecord: the pod recorded for a warm worker (what its
// exchange must prove it comes from) is the first one recorded under the
// name, never replaced by a later record (a worker name is new with each
// pod); a record older than the keep is removed by the next one, and a
// worker never recorded reads "".
func TestWarmWorkerPodRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	if uid, err := b.w.WarmWorkerPodUID(ctx, "w1"); err != nil || uid != "" {
		t.Fatalf("a worker never recorded reads %q (%v), want none", uid, err)
	}
	if err := b.w.RecordWarmWorkerPod(ctx, "w1", "uid-1", time.Hour, base); err != nil {
		t.Fatal(err)
	}
	if err := b.w.RecordWarmWorkerPod(ctx, "w1", "uid-forged", time.Hour, base.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if uid, err := b.w.WarmWorkerPodUID(ctx, "w1"); err != nil || uid != "uid-1" {
		t.Fatalf("w1 reads %q (%v), want its first pod uid-1", uid, err)
	}
	if err := b.w.RecordWarmWorkerPod(ctx, "w2", "uid-2", time.Hour, base.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if uid, err := b.w.WarmWorkerPodUID(ctx, "w1"); err != nil || uid != "" {
		t.Fatalf("w1 reads %q (%v) past the keep, want its record removed", uid, err)
	}
	if uid, err := b.w.WarmWorkerPodUID(ctx, "w2"); err != nil || uid != "uid-2" {
		t.Fatalf("w2 reads %q (%v), want uid-2", uid, err)
	}
	for _, bad := range [][2]string{{"", "uid"}, {"w3", ""}} {
		if err := b.w.RecordWarmWorkerPod(ctx, bad[0], bad[1], time.Hour, base); err == nil {
			t.Fatalf("a record of worker %q, uid %q was accepted", bad[0], bad[1])
		}
	}
}

package board_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// podMissing reads the task instance's pod cache history (0 and zero:
// NULL).
func (b *bundle) podMissing(t *testing.T, table string, a sdk.Attempt) (time.Duration, time.Time) {
	t.Helper()
	var (
		us    *int64
		since *time.Time
	)
	if err := b.pool.QueryRow(context.Background(), `SELECT (extract(epoch FROM pod_missing_max) * 1000000)::bigint,
            pod_missing_since FROM `+table+` WHERE run_id = $1 AND task_id = $2 AND try_number = $3 AND attempt_epoch = $4`,
		a.RunID, a.TaskID, a.Try, a.Epoch).Scan(&us, &since); err != nil {
		t.Fatal(err)
	}
	var d time.Duration
	if us != nil {
		d = time.Duration(*us) * time.Microsecond
	}
	if since == nil {
		return d, time.Time{}
	}
	return d, since.UTC()
}

// kubeRunning drives a fresh kube attempt to running at runningAt, its pod
// uid recorded.
func (b *bundle) kubeRunning(t *testing.T, a sdk.Attempt, runningAt time.Time, uid string) {
	t.Helper()
	b.running(t, a, runningAt, time.Time{})
	if ok, err := b.w.RecordPod(context.Background(), a, uid, runningAt.Add(-time.Minute), runningAt); err != nil || !ok {
		t.Fatalf("record pod of %s: %v %v", a, ok, err)
	}
}

func (b *bundle) sight(t *testing.T, ss ...sdk.PodSighting) []sdk.MarkResult {
	t.Helper()
	for i := range ss {
		if ss[i].Term == 0 {
			ss[i].Term = b.term
		}
		if ss[i].At.IsZero() {
			ss[i].At = base
		}
	}
	res, err := b.store.RecordPodSightings(context.Background(), ss)
	if err != nil || len(res) != len(ss) {
		t.Fatalf("record pod sightings: %+v %v", res, err)
	}
	return res
}

func TestRecordPodSightings(t *testing.T) {
	t.Parallel()
	runningAt := base.Add(-10 * time.Minute)

	// The fold of the sightings and the guards are the conformance suite's
	// (sdk/sdktest/boardtest): here they are proven on rows the board's own
	// writers made, with the lease's own expiry and the rails.
	// Nothing changes for a sighting of another attempt, of an attempt not
	// running, of a lite attempt, of an attempt that records another pod
	// or none, or from before the attempt ran; a term that is not current
	// is deposed.
	t.Run("AGuardThatFailsChangesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.runWith(t, "k", sdk.ExecutorKube, "run", "done", "none", "early")
		b.runWith(t, "l", sdk.ExecutorLite, "lite")
		b.kubeRunning(t, first("k", "run"), runningAt, "uid-run")
		b.kubeRunning(t, first("k", "done"), runningAt, "uid-done")
		if stop, err := b.w.Report(context.Background(), first("k", "done"), lifecycleSuccess, base.Add(-time.Minute)); err != nil || stop {
			t.Fatal(stop, err)
		}
		b.running(t, first("k", "none"), runningAt, time.Time{})
		b.kubeRunning(t, first("k", "early"), runningAt, "uid-early")
		b.running(t, first("l", "lite"), runningAt, time.Time{})
		b.exec(t, `UPDATE task_instances SET pod_uid = 'uid-lite' WHERE run_id = 'l'`)
		seen := runningAt.Add(time.Minute)
		stale := first("k", "run")
		stale.Epoch = 1
		for name, c := range map[string]struct {
			s    sdk.PodSighting
			want string
		}{
			"StaleEpoch":      {sdk.PodSighting{Attempt: stale, PodUID: "uid-run", SeenAt: seen}, sdk.NoopMovedOn},
			"NotRunning":      {sdk.PodSighting{Attempt: first("k", "done"), PodUID: "uid-done", SeenAt: seen}, sdk.NoopMovedOn},
			"Lite":            {sdk.PodSighting{Attempt: first("l", "lite"), PodUID: "uid-lite", MissingAt: seen}, sdk.NoopMovedOn},
			"NoPodRecorded":   {sdk.PodSighting{Attempt: first("k", "none"), PodUID: "uid-x", SeenAt: seen}, sdk.NoopMovedOn},
			"AnotherPod":      {sdk.PodSighting{Attempt: first("k", "run"), PodUID: "uid-forged", SeenAt: seen, MissingAt: seen}, sdk.NoopPodNotRecorded},
			"BeforeItRan":     {sdk.PodSighting{Attempt: first("k", "early"), PodUID: "uid-early", SeenAt: runningAt, MissingAt: runningAt.Add(-time.Second)}, ""},
			"TermNotCurrent":  {sdk.PodSighting{Attempt: first("k", "run"), PodUID: "uid-run", SeenAt: seen, Term: b.term + 1}, sdk.NoopDeposed},
			"LeaseRunOutAtAt": {sdk.PodSighting{Attempt: first("k", "run"), PodUID: "uid-run", SeenAt: seen, At: base.Add(2 * leaseTTL)}, sdk.NoopDeposed},
			"NoSuchTask":      {sdk.PodSighting{Attempt: first("k", "gone"), PodUID: "uid-run", SeenAt: seen}, sdk.NoopNotFound},
		} {
			if c.want == "" {
				// A deletion before the sighting is malformed: refused whole.
				c.s.Term, c.s.At = b.term, base
				if _, err := b.store.RecordPodSightings(context.Background(), []sdk.PodSighting{c.s}); err == nil {
					t.Fatalf("%s: a deletion before its sighting was accepted", name)
				}
				c.s.MissingAt = time.Time{}
				c.want = sdk.NoopMovedOn
			}
			res := b.sight(t, c.s)
			if res[0].Applied || res[0].NoopReason != c.want {
				t.Fatalf("%s: %+v, want %s", name, res[0], c.want)
			}
		}
		for _, a := range []sdk.Attempt{first("k", "run"), first("k", "done"), first("k", "none"), first("k", "early"), first("l", "lite")} {
			if longest, since := b.podMissing(t, "task_instances", a); longest != 0 || !since.IsZero() {
				t.Fatalf("%s changed: max %s since %v", a, longest, since)
			}
		}
	})

	t.Run("ABatchIsBounded", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ss := make([]sdk.PodSighting, sdk.MaxPodSightings+1)
		for i := range ss {
			ss[i] = sdk.PodSighting{Attempt: first("r", fmt.Sprintf("t%d", i)), PodUID: "u",
				SeenAt: base, Term: b.term, At: base}
		}
		if _, err := b.store.RecordPodSightings(context.Background(), ss); err == nil {
			t.Fatalf("%d sightings in one call accepted", len(ss))
		}
	})

	// The attempt's history goes with it into attempt_history when a rail
	// starts a new execution, and the new attempt starts with none.
	t.Run("TheRailKeepsItInTheHistoryAndClearsIt", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.runWith(t, "r", sdk.ExecutorKube, "t")
		a := first("r", "t")
		b.kubeRunning(t, a, runningAt, "uid-1")
		b.sight(t, sdk.PodSighting{Attempt: a, PodUID: "uid-1", SeenAt: runningAt.Add(time.Minute),
			MissingAt: runningAt.Add(2 * time.Minute)})
		if rel, err := b.w.WarmRequeue(context.Background(), a, base); err != nil || !rel.Applied {
			t.Fatalf("requeue: %+v %v", rel, err)
		}
		if longest, since := b.podMissing(t, "attempt_history", a); longest != time.Minute || !since.Equal(runningAt.Add(2*time.Minute)) {
			t.Fatalf("history: max %s since %v", longest, since)
		}
		next := a
		next.Epoch++
		if longest, since := b.podMissing(t, "task_instances", next); longest != 0 || !since.IsZero() {
			t.Fatalf("the new attempt: max %s since %v", longest, since)
		}
	})
}

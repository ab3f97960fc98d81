package lifecycle_test

import (
	"context"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
)

// gapOf reads the attempt row's max_heartbeat_gap (0 when NULL).
func (b *bundle) gapOf(t *testing.T) time.Duration {
	t.Helper()
	var ms *float64
	if err := b.store.Pool().QueryRow(context.Background(), `SELECT extract(epoch FROM max_heartbeat_gap) * 1000
        FROM task_instances WHERE run_id = 'run' AND task_id = 'task'`).Scan(&ms); err != nil {
		t.Fatal(err)
	}
	if ms == nil {
		return 0
	}
	return time.Duration(*ms) * time.Millisecond
}

// Calls of one attempt merged into one batch record what each would have
// recorded alone: the silence each measured (before the first, between
// them: never the span from the row's last heartbeat to the latest), the
// latest arrival, the latest renewal (even when a later call renewed
// nothing) and the first cap.
func TestMergedHeartbeatsRecordEachCallsSilenceRenewalAndCap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, a, running := runningTask(t)
	calls := []lifecycle.HeartbeatCall{ // out of order, as a batch may hold them
		{Attempt: a, Renewal: lifecycle.NotRenewed, At: running.Add(50 * time.Second)},
		{Attempt: a, Renewal: lifecycle.Renewed, At: running.Add(10 * time.Second)},
		{Attempt: a, Renewal: lifecycle.Capped, At: running.Add(45 * time.Second)},
		{Attempt: a, Renewal: lifecycle.Capped, At: running.Add(48 * time.Second)},
	}
	stop, err := b.w.HeartbeatCredentials(ctx, calls)
	if err != nil || len(stop) != len(calls) || stop[0] || stop[3] {
		t.Fatalf("merged heartbeats: stop %v, %v", stop, err)
	}
	// Silences: 10s from running_at, then 35s, 3s, 2s.
	if got := b.gapOf(t); got != 35*time.Second {
		t.Fatalf("max_heartbeat_gap = %s, want the longest silence a call measured, 35s", got)
	}
	ti, err := b.w.TaskInstance(ctx, a.RunID, a.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if !ti.LastHeartbeatAt.Equal(running.Add(50*time.Second)) || !ti.CredentialRenewedAt.Equal(running.Add(10*time.Second)) ||
		!ti.CredentialCappedAt.Equal(running.Add(45*time.Second)) {
		t.Fatalf("heartbeat %v renewed %v capped %v: want the latest arrival, the renewal, the first cap",
			ti.LastHeartbeatAt, ti.CredentialRenewedAt, ti.CredentialCappedAt)
	}
}

// runningTask is a board with one task running since ten minutes before
// base.
func runningTask(t *testing.T) (*bundle, sdk.Attempt, time.Time) {
	t.Helper()
	b := setup(t)
	a := b.task(t)
	running := base.Add(-10 * time.Minute)
	b.to(t, a, sdk.StateRunning, running)
	return b, a, running
}

func (b *bundle) historyRows(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.store.Pool().QueryRow(context.Background(), `SELECT count(*) FROM attempt_history`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The batched heartbeat UPDATE keeps the attempt's longest silence: the
// first heartbeat counts from running_at, each next one from the one
// before; a replica that began serving later (reaperd restarted) counts no
// gap from before it began, so its own downtime is never an agent's
// silence. A heartbeat writes nothing else: no history row.
func TestTheHeartbeatKeepsTheLongestSilenceButNotTheAPIsOwnDowntime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, a, running := runningTask(t)
	beat := func(w *lifecycle.Writer, at time.Time) {
		t.Helper()
		stop, err := w.HeartbeatCredentials(ctx, []lifecycle.HeartbeatCall{{Attempt: a, At: at}})
		if err != nil || stop[0] {
			t.Fatalf("heartbeat at %s: stop %v, %v", at, stop, err)
		}
	}
	for _, step := range []struct {
		w    *lifecycle.Writer
		at   time.Time
		want time.Duration
	}{
		{b.w, running.Add(time.Minute), time.Minute},         // from running_at
		{b.w, running.Add(4 * time.Minute), 3 * time.Minute}, // 3 min silent
		{b.w, running.Add(5 * time.Minute), 3 * time.Minute}, // shorter: kept
	} {
		beat(step.w, step.at)
		if got := b.gapOf(t); got != step.want {
			t.Fatalf("after the heartbeat at %s: gap %s, want %s", step.at, got, step.want)
		}
	}
	// reaperd was down from running+5m; a replica serving since running+20m
	// hears the agent at running+21m: a gap of 1 min, not 16.
	restarted := lifecycle.New(b.store.Pool(), lifecycle.Options{HeardSince: running.Add(20 * time.Minute)})
	beat(restarted, running.Add(21*time.Minute))
	if got := b.gapOf(t); got != 3*time.Minute {
		t.Fatalf("after the restart: gap %s, want the 3 min from before (the downtime not counted)", got)
	}
	beat(restarted, running.Add(30*time.Minute))
	if got := b.gapOf(t); got != 9*time.Minute {
		t.Fatalf("a silence while the replica served: gap %s, want 9m", got)
	}
	if n := b.historyRows(t); n != 0 {
		t.Fatalf("heartbeats wrote %d history rows", n)
	}
}

// A rail that starts a new execution records the attempt it released in
// attempt_history, as it stood (its stamps, its silence, its failure), once;
// the row's new attempt starts with no silence and no pod.
func TestARailKeepsTheAttemptItReleasedInTheHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	a := b.task(t)
	b.to(t, a, sdk.StateFailed, base)
	if ok, err := b.w.RecordPod(ctx, a, "uid-1", base.Add(-90*time.Second), base); err == nil && ok {
		t.Fatal("a failed attempt's pod was recorded")
	}
	rel, err := b.w.Retry(ctx, a, base.Add(time.Minute))
	if err != nil || !rel.Applied {
		t.Fatalf("retry: %+v %v", rel, err)
	}
	var (
		try, epoch                int
		state, reason             string
		queued, running, released time.Time
		lastBeat                  time.Time
		gapSeconds                float64
	)
	if err := b.store.Pool().QueryRow(ctx, `SELECT try_number, attempt_epoch, state, failure_reason, queued_at, running_at,
            last_heartbeat_at, extract(epoch FROM max_heartbeat_gap), released_at FROM attempt_history`).Scan(
		&try, &epoch, &state, &reason, &queued, &running, &lastBeat, &gapSeconds, &released); err != nil {
		t.Fatal(err)
	}
	if try != 1 || epoch != 0 || state != sdk.StateFailed || reason != "exit_code" || !released.Equal(base.Add(time.Minute)) ||
		!running.Equal(base) || !queued.Equal(base.Add(-time.Minute)) || !lastBeat.Equal(base) {
		t.Fatalf("history: try %d epoch %d %s %s queued %s running %s beat %s released %s", try, epoch, state, reason,
			queued, running, lastBeat, released)
	}
	if gapSeconds != 0 {
		t.Fatalf("history gap %vs, want 0 (one heartbeat at running_at)", gapSeconds)
	}
	if n := b.historyRows(t); n != 1 {
		t.Fatalf("%d history rows, want 1", n)
	}
	if ti := b.ti(t); ti.Try != 2 || b.gapOf(t) != 0 {
		t.Fatalf("the new attempt: try %d gap %s", ti.Try, b.gapOf(t))
	}
}

// The kube runner records its pod's creation with its UID: the pod's time
// to start is kept for replay, and a later record without a creation time
// keeps it.
func TestThePodsCreationIsRecordedWithItsUID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	a := b.task(t)
	b.to(t, a, sdk.StateQueued, base)
	created := base.Add(-2 * time.Second)
	if ok, err := b.w.RecordPod(ctx, a, "uid-1", created, base); err != nil || !ok {
		t.Fatalf("record pod: %v %v", ok, err)
	}
	if ok, err := b.w.RecordPod(ctx, a, "uid-1", time.Time{}, base.Add(time.Second)); err != nil || !ok {
		t.Fatalf("record pod uid: %v %v", ok, err)
	}
	var at time.Time
	if err := b.store.Pool().QueryRow(ctx, `SELECT pod_created_at FROM task_instances WHERE run_id = 'run'`).Scan(&at); err != nil {
		t.Fatal(err)
	}
	if !at.Equal(created) {
		t.Fatalf("pod_created_at %s, want %s", at, created)
	}
}

// The kube runner records its pod's name with its UID (a name is drawn at
// each create, so whatever finds the pod by name reads it here); a later
// record without a name keeps it; the rail that starts the next execution
// clears both, and the history keeps them with the released attempt.
func TestThePodsNameIsRecordedWithItsUIDAndKeptInTheHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	a := b.task(t)
	b.to(t, a, sdk.StateQueued, base)
	want := lifecycle.CreatedPod{Name: "run-t-1-0-0123456789ab", UID: "uid-1", Created: base.Add(-2 * time.Second)}
	if ok, err := b.w.RecordCreatedPod(ctx, a, want, base); err != nil || !ok {
		t.Fatalf("record pod: %v %v", ok, err)
	}
	if ok, err := b.w.RecordPod(ctx, a, "uid-1", time.Time{}, base.Add(time.Second)); err != nil || !ok {
		t.Fatalf("record pod uid: %v %v", ok, err)
	}
	if got, err := b.w.RecordedPod(ctx, a); err != nil || got.Name != want.Name || got.UID != want.UID || !got.Created.Equal(want.Created) {
		t.Fatalf("recorded pod %+v (%v), want %+v", got, err, want)
	}
	if got, err := b.w.RecordedPod(ctx, sdk.Attempt{RunID: a.RunID, TaskID: a.TaskID, Try: a.Try, Epoch: a.Epoch + 1}); err != nil ||
		got != (lifecycle.CreatedPod{}) {
		t.Fatalf("another attempt's recorded pod %+v (%v), want none", got, err)
	}
	if ok, err := b.w.Fail(ctx, a, []string{sdk.StateQueued}, lifecycle.Failure{Kind: sdk.MarkInfra, Reason: sdk.LabelPodNameSquatted, Confirm: true},
		base.Add(2*time.Second)); err != nil || !ok {
		t.Fatalf("fail: %v %v", ok, err)
	}
	rel, err := b.w.Replace(ctx, a, base.Add(time.Minute))
	if err != nil || !rel.Applied {
		t.Fatalf("replace: %+v %v", rel, err)
	}
	if got, err := b.w.RecordedPod(ctx, rel.Attempt); err != nil || got != (lifecycle.CreatedPod{}) {
		t.Fatalf("the new attempt's recorded pod %+v (%v), want none", got, err)
	}
	var name, uid string
	if err := b.store.Pool().QueryRow(ctx, `SELECT pod_name, pod_uid FROM attempt_history`).Scan(&name, &uid); err != nil {
		t.Fatal(err)
	}
	if name != want.Name || uid != want.UID {
		t.Fatalf("history: pod %s %s, want %s %s", name, uid, want.Name, want.UID)
	}
}

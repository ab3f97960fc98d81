package board_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// base is "now" in every test: the tests move time by offsets from it.
var base = time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)

const leaseTTL = time.Hour

// bundle is what most tests need: a fresh database, the store over it, the
// writers, and a current leadership term whose lease runs past base.
type bundle struct {
	pool  *pgxpool.Pool
	store *board.Store
	w     *lifecycle.Writer
	term  int64
}

func setup(t *testing.T) *bundle {
	t.Helper()
	pool := pgtest.NewDB(t)
	store := board.New(pool, board.Options{})
	lease, ok, err := store.TryAcquire(context.Background(), "test-leader", leaseTTL, base.Add(-time.Minute))
	if err != nil || !ok {
		t.Fatalf("acquire leadership: ok=%v err=%v", ok, err)
	}
	return &bundle{pool: pool, store: store, w: lifecycle.New(pool, lifecycle.Options{}), term: lease.Term}
}

// run creates a running run, started an hour before base, with one task
// instance (lite executor) per task id, all in none.
func (b *bundle) run(t *testing.T, runID string, taskIDs ...string) {
	t.Helper()
	b.runWith(t, runID, sdk.ExecutorLite, taskIDs...)
}

// sensor declares a's task a sensor (a day's timeout): only a sensor may
// park up_for_reschedule.
func (b *bundle) sensor(t *testing.T, a sdk.Attempt) {
	t.Helper()
	b.exec(t, `UPDATE task_instances SET sensor = true, sensor_timeout_seconds = 86400 WHERE run_id = $1 AND task_id = $2`,
		a.RunID, a.TaskID)
}

func (b *bundle) runWith(t *testing.T, runID, executor string, taskIDs ...string) {
	t.Helper()
	r := lifecycle.NewRun{RunID: runID, DagID: "dag", State: sdk.RunRunning}
	for _, id := range taskIDs {
		r.Tasks = append(r.Tasks, lifecycle.NewTask{TaskID: id, Executor: executor, Retries: 2})
	}
	if err := b.w.CreateRun(context.Background(), r, base.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
}

// spendInfraBudget leaves the run's task instances no infra re-place: an
// infra failure of theirs is not re-placed, so it does not keep the run
// alive.
func (b *bundle) spendInfraBudget(t *testing.T, runID string) {
	t.Helper()
	b.exec(t, "UPDATE task_instances SET infra_used = infra_budget WHERE run_id = $1", runID)
}

// first is the first attempt of a task instance.
func first(runID, taskID string) sdk.Attempt {
	return sdk.Attempt{RunID: runID, TaskID: taskID, Try: 1, Epoch: 0}
}

// queued drives a fresh attempt to queued, queued at at.
func (b *bundle) queued(t *testing.T, a sdk.Attempt, at time.Time) {
	t.Helper()
	ctx := context.Background()
	if ok, err := b.w.Enqueue(ctx, a, at); err != nil || !ok {
		t.Fatalf("enqueue %s: ok=%v err=%v", a, ok, err)
	}
	if ok, err := b.w.Queue(ctx, a, at); err != nil || !ok {
		t.Fatalf("queue %s: ok=%v err=%v", a, ok, err)
	}
}

// running drives a fresh attempt to running: queued a minute before
// runningAt, and heartbeated at heartbeatAt unless that is zero.
func (b *bundle) running(t *testing.T, a sdk.Attempt, runningAt, heartbeatAt time.Time) {
	t.Helper()
	ctx := context.Background()
	b.queued(t, a, runningAt.Add(-time.Minute))
	if stop, err := b.w.Running(ctx, a, runningAt); err != nil || stop {
		t.Fatalf("running %s: stop=%v err=%v", a, stop, err)
	}
	if !heartbeatAt.IsZero() {
		if stop, err := b.w.Heartbeat(ctx, a, heartbeatAt); err != nil || stop {
			t.Fatalf("heartbeat %s: stop=%v err=%v", a, stop, err)
		}
	}
}

func (b *bundle) ti(t *testing.T, runID, taskID string) board.TaskInstance {
	t.Helper()
	ti, err := b.store.TaskInstance(context.Background(), runID, taskID)
	if err != nil {
		t.Fatal(err)
	}
	return ti
}

func (b *bundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := b.pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatal(err)
	}
}

// unchanged fails t when a task instance differs from before.
func unchanged(t *testing.T, before, after board.TaskInstance) {
	t.Helper()
	if !reflect.DeepEqual(normal(before), normal(after)) {
		t.Fatalf("a no-op wrote the row:\nbefore %+v\nafter  %+v", before, after)
	}
}

// normal puts every time in UTC so rows read at different times compare.
func normal(ti board.TaskInstance) board.TaskInstance {
	v := reflect.ValueOf(&ti).Elem()
	for i := 0; i < v.NumField(); i++ {
		if tm, ok := v.Field(i).Interface().(time.Time); ok {
			v.Field(i).Set(reflect.ValueOf(tm.UTC()))
		}
	}
	return ti
}

func isCheckViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23514"
}

func sameTime(t *testing.T, what string, got, want time.Time) {
	t.Helper()
	if !got.Equal(want) {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

func id(prefix string, i int) string { return fmt.Sprintf("%s%05d", prefix, i) }

var lifecycleSuccess = lifecycle.TerminalReport{State: sdk.StateSuccess}

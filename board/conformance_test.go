package board_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/sdktest"
	"github.com/dexaflow/reaper/sdk/sdktest/boardtest"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// The Postgres board passes the board's conformance suite; the in-memory
// board (sdktest.Board) runs the same suite in package boardtest.
func TestConformance(t *testing.T) {
	t.Parallel()
	boardtest.Run(t, newFixture)
}

// fixture is a fresh database with a current term whose lease runs a day
// past boardtest.T0. It seeds rows with plain SQL, as the scheduler would
// have written them.
type fixture struct {
	t     *testing.T
	pool  *pgxpool.Pool
	store *board.Store
	term  int64
}

func newFixture(t *testing.T) boardtest.Fixture {
	t.Helper()
	pool := pgtest.NewDB(t)
	store := board.New(pool, board.Options{CredentialCeiling: boardtest.Ceiling})
	lease, ok, err := store.TryAcquire(context.Background(), "conformance", 24*time.Hour+time.Minute, boardtest.T0().Add(-time.Minute))
	if err != nil || !ok {
		t.Fatalf("acquire leadership: ok=%v err=%v", ok, err)
	}
	return &fixture{t: t, pool: pool, store: store, term: lease.Term}
}

func (f *fixture) Board() sdk.Board { return f.store }
func (f *fixture) Term() int64      { return f.term }

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.pool.Exec(context.Background(), sql, args...); err != nil {
		f.t.Fatalf("%v\n%s", err, sql)
	}
}

func (f *fixture) PutRun(r boardtest.RunRow) {
	f.exec(`INSERT INTO runs (run_id, dag_id, state, started_at, updated_at) VALUES ($1, 'dag', $2, $3, $3)
        ON CONFLICT (run_id) DO UPDATE SET state = $2, started_at = $3`, r.RunID, r.State, r.StartedAt)
	if r.State == sdk.RunSuccess || r.State == sdk.RunFailed {
		f.exec(`UPDATE task_instances SET run_closed = true WHERE run_id = $1`, r.RunID)
	}
}

func ts(t time.Time) pgtype.Timestamptz { return pgtype.Timestamptz{Time: t, Valid: !t.IsZero()} }

func text(s string) pgtype.Text { return pgtype.Text{String: s, Valid: s != ""} }

func (f *fixture) Put(r boardtest.Row) {
	f.exec(`INSERT INTO runs (run_id, dag_id, state, started_at, updated_at) VALUES ($1, 'dag', 'running', $2, $2)
        ON CONFLICT (run_id) DO NOTHING`, r.RunID, boardtest.T0().Add(-24*time.Hour))
	if r.Try == 0 {
		r.Try = 1
	}
	if r.Executor == "" {
		r.Executor = sdk.ExecutorLite
	}
	var sensorTimeout pgtype.Int4
	if r.Sensor.Declared {
		sensorTimeout = pgtype.Int4{Int32: int32(r.Sensor.Timeout / time.Second), Valid: true}
	}
	var held pgtype.Timestamptz
	if r.Held {
		held = pgtype.Timestamptz{Time: boardtest.T0().Add(-time.Minute), Valid: true}
	}
	f.exec(`INSERT INTO task_instances (run_id, task_id, try_number, attempt_epoch, state, executor,
            queued_at, running_at, last_heartbeat_at, released_at, ended_at, last_failure_kind, failure_reason,
            infra_marked_at, infra_confirmed_at, error_message, held_at, run_closed, updated_at,
            infra_budget, infra_used, pod_uid, credential_minted_at, credential_exchanged_at, warm_worker,
            sensor, sensor_timeout_seconds, first_poke_at, try_dispatched_at, retries, max_retries)
        SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
            r.state IN ('success', 'failed'), $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $29
        FROM runs r WHERE r.run_id = $1
        ON CONFLICT (run_id, task_id) DO UPDATE SET try_number = $3, attempt_epoch = $4, state = $5, executor = $6,
            queued_at = $7, running_at = $8, last_heartbeat_at = $9, released_at = $10, ended_at = $11,
            last_failure_kind = $12, failure_reason = $13, infra_marked_at = $14, infra_confirmed_at = $15,
            error_message = $16, held_at = $17, updated_at = $18, infra_budget = $19, infra_used = $20,
            pod_uid = $21, credential_minted_at = $22, credential_exchanged_at = $23, warm_worker = $24,
            sensor = $25, sensor_timeout_seconds = $26, first_poke_at = $27, try_dispatched_at = $28,
            retries = $29, max_retries = $29`,
		r.RunID, r.TaskID, r.Try, r.Epoch, r.State, r.Executor,
		ts(r.QueuedAt), ts(r.RunningAt), ts(r.LastHeartbeatAt), ts(r.ReleasedAt), ts(r.EndedAt),
		text(r.LastFailureKind), text(r.FailureReason), ts(r.InfraMarkedAt), ts(r.InfraConfirmedAt),
		text(r.ErrorMessage), held, boardtest.T0().Add(-48*time.Hour), r.InfraBudget, r.InfraUsed, text(r.PodUID),
		ts(r.CredentialMintedAt), ts(r.CredentialExchangedAt), text(r.WarmWorker),
		r.Sensor.Declared, sensorTimeout, ts(r.Sensor.FirstPokeAt), ts(r.Sensor.TryDispatchedAt), r.Retries)
}

func (f *fixture) Row(runID, taskID string) (boardtest.Row, bool) {
	f.t.Helper()
	ti, err := f.store.TaskInstance(context.Background(), runID, taskID)
	if errors.Is(err, board.ErrNotFound) {
		return boardtest.Row{}, false
	}
	if err != nil {
		f.t.Fatal(err)
	}
	var (
		exchanged, missingSince pgtype.Timestamptz
		missingUs               pgtype.Int8
	)
	if err := f.pool.QueryRow(context.Background(), `SELECT credential_exchanged_at,
            (extract(epoch FROM pod_missing_max) * 1000000)::bigint, pod_missing_since FROM task_instances
        WHERE run_id = $1 AND task_id = $2`, runID, taskID).Scan(&exchanged, &missingUs, &missingSince); err != nil {
		f.t.Fatal(err)
	}
	return boardtest.Row{Attempt: ti.Attempt, State: ti.State, Executor: ti.Executor, QueuedAt: ti.QueuedAt,
		RunningAt: ti.RunningAt, LastHeartbeatAt: ti.LastHeartbeatAt, ReleasedAt: ti.ReleasedAt, EndedAt: ti.EndedAt,
		LastFailureKind: ti.LastFailureKind, FailureReason: ti.FailureReason, InfraMarkedAt: ti.InfraMarkedAt,
		InfraConfirmedAt: ti.InfraConfirmedAt, InfraBudget: ti.InfraBudget, InfraUsed: ti.InfraUsed,
		ErrorMessage: ti.ErrorMessage, Held: !ti.HeldAt.IsZero(), CredentialExchangedAt: exchanged.Time,
		Sensor: ti.Sensor, Retries: ti.Retries, PodMissingMax: time.Duration(missingUs.Int64) * time.Microsecond,
		PodMissingSince: missingSince.Time.UTC()}, true
}

func (f *fixture) ExchangeBootstrap(a sdk.Attempt, mintedAt, at time.Time) string {
	f.t.Helper()
	res, err := lifecycle.New(f.pool, lifecycle.Options{}).ExchangeBootstrap(context.Background(), a, mintedAt, at)
	if err != nil {
		f.t.Fatal(err)
	}
	return string(res)
}

func (f *fixture) RunState(runID string) string {
	f.t.Helper()
	r, err := f.store.Run(context.Background(), runID)
	if errors.Is(err, board.ErrNotFound) {
		return ""
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return r.State
}

func (f *fixture) Log(a sdk.Attempt) []string {
	f.t.Helper()
	lines, err := f.store.AttemptLog(context.Background(), a.RunID, a.TaskID)
	if err != nil {
		f.t.Fatal(err)
	}
	var out []string
	for _, l := range lines {
		if l.Attempt == a {
			out = append(out, l.Line)
		}
	}
	return out
}

func (f *fixture) Depose() { f.exec(`UPDATE leader SET term = term + 1`) }

func (f *fixture) ExpireLease(at time.Time) { f.exec(`UPDATE leader SET expires_at = $1`, at) }

// RecordWarmClaim records the claim through the attempt API's own write.
func (f *fixture) RecordWarmClaim(worker string, c sdktest.WarmClaim) {
	f.t.Helper()
	err := lifecycle.New(f.pool, lifecycle.Options{}).RecordClaim(context.Background(),
		lifecycle.WarmClaim{Worker: worker, At: c.At, Known: c.Known, Running: c.Running})
	if err != nil {
		f.t.Fatal(err)
	}
}

// LockRun holds every row of the run in another transaction, as a
// scheduler writing them would, until the test ends.
func (f *fixture) LockRun(runID string) {
	f.t.Helper()
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { tx.Rollback(ctx) }) //nolint:errcheck // the lock's end
	rows, err := tx.Query(ctx, `SELECT 1 FROM task_instances WHERE run_id = $1 FOR UPDATE`, runID)
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := pgx.CollectRows(rows, pgx.RowTo[int32]); err != nil {
		f.t.Fatal(err)
	}
}

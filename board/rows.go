package board

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dexaflow/reaper/sdk"
)

// Run is one row of runs.
type Run struct {
	RunID        string
	DagID        string
	State        string
	StartedAt    time.Time // zero when NULL
	EndedAt      time.Time
	ErrorMessage string
	UpdatedAt    time.Time
	// MaxActiveTasks bounds the run's task instances queued or running at
	// once (migration 021); 0: no bound.
	MaxActiveTasks int32
}

// TaskInstance is one row of task_instances. Zero times stand for NULL.
type TaskInstance struct {
	sdk.Attempt
	State                    string
	Executor                 string
	QueuedAt                 time.Time
	RunningAt                time.Time
	LastHeartbeatAt          time.Time
	ReleasedAt               time.Time
	EndedAt                  time.Time
	LastFailureKind          string
	FailureReason            string
	InfraMarkedAt            time.Time
	InfraConfirmedAt         time.Time
	InfraBudget              int32
	InfraUsed                int32
	Retries                  int32
	MaxRetries               int32
	ErrorMessage             string
	WarmWorker               string
	DispatchUnavailableSince time.Time
	HeldAt                   time.Time
	Command                  string
	ExecutionTimeout         time.Duration // 0: none declared
	UpdatedAt                time.Time
	// The attempt's credential (zero when never minted, renewed, capped):
	// first minted at dispatch, last renewed by a heartbeat, and the first
	// heartbeat refused a renewal at the credential ceiling.
	CredentialMintedAt  time.Time
	CredentialRenewedAt time.Time
	CredentialCappedAt  time.Time
	// Sensor is the task's sensor declaration and the stamps a sensor's
	// bounds count from (migration 010).
	Sensor sdk.Sensor
	// Pool is the pool whose slots the task takes while queued or running,
	// PoolSlots how many (migration 021).
	Pool      string
	PoolSlots int32
}

// TaskInstanceColumns is the select list ScanTaskInstance reads, in order.
const TaskInstanceColumns = `run_id, task_id, try_number, attempt_epoch, state, executor,
	queued_at, running_at, last_heartbeat_at, released_at, ended_at,
	last_failure_kind, failure_reason, infra_marked_at, infra_confirmed_at,
	infra_budget, infra_used, retries, max_retries, error_message, warm_worker,
	dispatch_unavailable_since, held_at, command, execution_timeout_seconds, updated_at,
	credential_minted_at, credential_renewed_at, credential_capped_at,
	sensor, sensor_timeout_seconds, first_poke_at, try_dispatched_at, pool, pool_slots`

// ScanTaskInstance reads one row selected with TaskInstanceColumns.
func ScanTaskInstance(row pgx.Row) (TaskInstance, error) {
	var (
		ti                                                 TaskInstance
		queued, running, hb, released, ended, marked, conf *time.Time
		unavail, held, minted, renewed, capped             *time.Time
		kind, reason, msg, warm, cmd                       *string
		timeout, sensorTimeout                             *int32
		firstPoke, tryDispatched                           *time.Time
	)
	err := row.Scan(&ti.RunID, &ti.TaskID, &ti.Try, &ti.Epoch, &ti.State, &ti.Executor,
		&queued, &running, &hb, &released, &ended,
		&kind, &reason, &marked, &conf,
		&ti.InfraBudget, &ti.InfraUsed, &ti.Retries, &ti.MaxRetries, &msg, &warm,
		&unavail, &held, &cmd, &timeout, &ti.UpdatedAt, &minted, &renewed, &capped,
		&ti.Sensor.Declared, &sensorTimeout, &firstPoke, &tryDispatched, &ti.Pool, &ti.PoolSlots)
	if err != nil {
		return TaskInstance{}, err
	}
	ti.QueuedAt, ti.RunningAt, ti.LastHeartbeatAt = timeOrZero(queued), timeOrZero(running), timeOrZero(hb)
	ti.ReleasedAt, ti.EndedAt = timeOrZero(released), timeOrZero(ended)
	ti.InfraMarkedAt, ti.InfraConfirmedAt = timeOrZero(marked), timeOrZero(conf)
	ti.DispatchUnavailableSince, ti.HeldAt = timeOrZero(unavail), timeOrZero(held)
	ti.LastFailureKind, ti.FailureReason, ti.ErrorMessage = deref(kind), deref(reason), deref(msg)
	ti.WarmWorker, ti.Command = deref(warm), deref(cmd)
	ti.CredentialMintedAt, ti.CredentialRenewedAt = timeOrZero(minted), timeOrZero(renewed)
	ti.CredentialCappedAt = timeOrZero(capped)
	if timeout != nil {
		ti.ExecutionTimeout = time.Duration(*timeout) * time.Second
	}
	if sensorTimeout != nil {
		ti.Sensor.Timeout = time.Duration(*sensorTimeout) * time.Second
	}
	ti.Sensor.FirstPokeAt, ti.Sensor.TryDispatchedAt = timeOrZero(firstPoke), timeOrZero(tryDispatched)
	return ti, nil
}

// TaskInstance reads one task instance; ErrNotFound (wrapped) when absent.
func (s *Store) TaskInstance(ctx context.Context, runID, taskID string) (TaskInstance, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	ti, err := ScanTaskInstance(s.pool.QueryRow(ctx,
		"SELECT "+TaskInstanceColumns+" FROM task_instances WHERE run_id = $1 AND task_id = $2", runID, taskID))
	if errors.Is(err, pgx.ErrNoRows) {
		return TaskInstance{}, fmt.Errorf("board: read task instance %s/%s: %w", runID, taskID, ErrNotFound)
	}
	if err != nil {
		return TaskInstance{}, fmt.Errorf("board: read task instance %s/%s: %w", runID, taskID, err)
	}
	return ti, nil
}

// TaskInstances reads every task instance of a run, by task id.
func (s *Store) TaskInstances(ctx context.Context, runID string) ([]TaskInstance, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx,
		"SELECT "+TaskInstanceColumns+" FROM task_instances WHERE run_id = $1 ORDER BY task_id", runID)
	if err != nil {
		return nil, fmt.Errorf("board: read task instances of %s: %w", runID, err)
	}
	tis, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TaskInstance, error) { return ScanTaskInstance(r) })
	if err != nil {
		return nil, fmt.Errorf("board: read task instances of %s: %w", runID, err)
	}
	return tis, nil
}

// Run reads one run; ErrNotFound (wrapped) when absent.
func (s *Store) Run(ctx context.Context, runID string) (Run, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var (
		r              Run
		started, ended *time.Time
		msg            *string
		maxActive      *int32
	)
	err := s.pool.QueryRow(ctx,
		"SELECT run_id, dag_id, state, started_at, ended_at, error_message, updated_at, max_active_tasks FROM runs WHERE run_id = $1",
		runID).Scan(&r.RunID, &r.DagID, &r.State, &started, &ended, &msg, &r.UpdatedAt, &maxActive)
	if errors.Is(err, pgx.ErrNoRows) {
		return Run{}, fmt.Errorf("board: read run %s: %w", runID, ErrNotFound)
	}
	if err != nil {
		return Run{}, fmt.Errorf("board: read run %s: %w", runID, err)
	}
	r.StartedAt, r.EndedAt, r.ErrorMessage = timeOrZero(started), timeOrZero(ended), deref(msg)
	if maxActive != nil {
		r.MaxActiveTasks = *maxActive
	}
	return r, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

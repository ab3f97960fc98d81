package lifecycle

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dexaflow/reaper/board"
)

// Pools and slots. A task instance takes its pool_slots of its pool's slots
// while it is queued or running, in a running run; nothing is booked or
// returned: the slots in use are read from the attempts' states, so every
// write that moves an attempt out of queued or running (a report, a
// reaper's mark, a rail, a run's end) gives its slots back in the same
// statement, and an attempt lost without a word keeps them until a reaper
// settles it. A run's max_active_tasks counts its queued and running task
// instances the same way.

// SilentHeartbeats is how many heartbeat periods an attempt may go
// without a word before its slots count as silent (PoolUse.Silent): held,
// perhaps, by an attempt that is lost and that a reaper will settle.
const SilentHeartbeats = 3

// RecoveryLimit is a recovery budget's rate, in recovery dispatches a
// second (<= 0: unbounded), and its burst (0: one second of the rate, at
// least 1). See the runners' recovery budget.
type RecoveryLimit struct {
	Rate  float64
	Burst int
}

// Recovery defaults: the rate at which each pool admits recovery
// dispatches, and how many it may admit at once after a quiet spell.
const (
	RecoveryRateDefault  = 20.0
	RecoveryBurstDefault = 200
)

// RecoveryBudget is the runners' recovery budget: Default for every pool,
// Pools for those that set their own.
type RecoveryBudget struct {
	Default RecoveryLimit
	Pools   map[string]RecoveryLimit
}

// RecoveryCount is one pool's recovery dispatches of a runner's cycle:
// those its recovery budget admitted, and those it deferred.
type RecoveryCount struct {
	Admitted, Deferred int
}

// PoolUse is one pool's use, as the board holds it.
type PoolUse struct {
	Pool string
	// Queued and Running are the slots taken by queued and by running
	// attempts.
	Queued, Running int
	// Silent is the part of Running taken by attempts silent since before
	// the time PoolUsage was given (no heartbeat, nor a RUNNING report,
	// since): slots that a lost attempt may be holding, which the reapers
	// give back when they settle it.
	Silent int
	// Waiting counts the scheduled task instances of the pool: those the
	// runner has not dispatched, for want of a slot or not yet.
	Waiting int
	// RecoveryWaiting is the part of Waiting that are recovery dispatches
	// (a later try, or a later execution of a try): re-placed and retried
	// attempts waiting for a slot or for the pool's recovery budget.
	RecoveryWaiting int
}

// Taken is the slots in use: queued and running.
func (u PoolUse) Taken() int { return u.Queued + u.Running }

// PoolUsage reads every pool's use by the task instances of running runs,
// by pool name. An attempt counts as silent when its last heartbeat, or its
// RUNNING report when it never heartbeated, is before silentSince.
func (w *Writer) PoolUsage(ctx context.Context, silentSince time.Time) ([]PoolUse, error) {
	ctx, cancel := w.bound(ctx)
	defer cancel()
	rows, err := w.pool.Query(ctx, `SELECT ti.pool,
    coalesce(sum(ti.pool_slots) FILTER (WHERE ti.state = 'queued'), 0),
    coalesce(sum(ti.pool_slots) FILTER (WHERE ti.state = 'running'), 0),
    coalesce(sum(ti.pool_slots) FILTER (WHERE ti.state = 'running'
        AND coalesce(ti.last_heartbeat_at, ti.running_at) < $1), 0),
    count(*) FILTER (WHERE ti.state = 'scheduled'),
    count(*) FILTER (WHERE ti.state = 'scheduled' AND (ti.try_number > 1 OR ti.attempt_epoch > 0))
FROM runs r JOIN task_instances ti ON ti.run_id = r.run_id
WHERE r.state = 'running' AND ti.state IN ('scheduled', 'queued', 'running')
GROUP BY ti.pool ORDER BY ti.pool`, silentSince)
	if err != nil {
		return nil, fmt.Errorf("board: read the pools' use: %w", err)
	}
	use, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (PoolUse, error) {
		var u PoolUse
		err := row.Scan(&u.Pool, &u.Queued, &u.Running, &u.Silent, &u.Waiting, &u.RecoveryWaiting)
		return u, err
	})
	if err != nil {
		return nil, fmt.Errorf("board: read the pools' use: %w", err)
	}
	return use, nil
}

// RunUse is a bounded run's use of its max_active_tasks.
type RunUse struct {
	Max, Active int
}

// BoundedRuns reads the running runs that declare max_active_tasks,
// with their queued and running task instances, by run id.
func (w *Writer) BoundedRuns(ctx context.Context) (map[string]RunUse, error) {
	ctx, cancel := w.bound(ctx)
	defer cancel()
	// Counted run by run (the primary key's range of each), so that only the
	// bounded runs' task instances are read.
	rows, err := w.pool.Query(ctx, `SELECT r.run_id, r.max_active_tasks,
    (SELECT count(*) FROM task_instances ti WHERE ti.run_id = r.run_id AND ti.state IN ('queued', 'running'))
FROM runs r
WHERE r.state = 'running' AND r.max_active_tasks IS NOT NULL`)
	if err != nil {
		return nil, fmt.Errorf("board: read the runs' active tasks: %w", err)
	}
	out := map[string]RunUse{}
	var (
		id        string
		max, used int
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &max, &used}, func() error {
		out[id] = RunUse{Max: max, Active: used}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("board: read the runs' active tasks: %w", err)
	}
	return out, nil
}

// ListScheduledOpen is ListScheduled leaving out the task instances of the
// pools in closedPools and of the runs in closedRuns (those with no slot to
// take), and the recovery dispatches (a later try, or a later execution of
// a try) of the pools in recoverySpent (those whose recovery budget is
// spent).
func (w *Writer) ListScheduledOpen(ctx context.Context, executor string, after *Key, limit int,
	closedPools, closedRuns, recoverySpent []string) ([]board.TaskInstance, error) {
	if err := checkExecutor(executor); err != nil {
		return nil, fmt.Errorf("board: list scheduled task instances: %w", err)
	}
	sql := `SELECT ` + board.TaskInstanceColumns + ` FROM (
    SELECT ti.* ` + workingSet + ` AND ti.state = 'scheduled'
      AND NOT (ti.pool = ANY ($4::text[])) AND NOT (ti.run_id = ANY ($5::text[]))
      AND NOT (ti.pool = ANY ($6::text[]) AND (ti.try_number > 1 OR ti.attempt_epoch > 0))
    ORDER BY ti.run_id, ti.task_id LIMIT ` + strconv.Itoa(pageLimit(limit)) + `
) page ORDER BY run_id, task_id`
	k1, k2 := keyArgs(after)
	if closedPools == nil {
		closedPools = []string{}
	}
	if closedRuns == nil {
		closedRuns = []string{}
	}
	if recoverySpent == nil {
		recoverySpent = []string{}
	}
	return w.collect(ctx, "scheduled "+executor+" task instances", sql, executor, k1, k2, closedPools, closedRuns,
		recoverySpent)
}

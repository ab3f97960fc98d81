package lifecycle

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
)

// The warm pool's side of the board. A warm attempt (executor warm) is
// bound to a worker when it is queued (QueueWarm writes warm_worker with
// the guarded move scheduled -> queued); the worker then claims it
// (BoundTo) and runs it through the attempt's own Running, Heartbeat and
// Report. A bound attempt the worker will never start goes back to
// scheduled on the warm requeue rail (WarmRequeue).

// BoundTo lists the queued warm attempts of running runs bound to worker,
// oldest queue time first, at most limit (at most a page): what the worker
// may claim. An attempt the worker already reported running is not listed.
func (w *Writer) BoundTo(ctx context.Context, worker string, limit int) ([]board.TaskInstance, error) {
	if worker == "" {
		return nil, fmt.Errorf("board: list the attempts bound to a warm worker: no worker named")
	}
	// Every worker asks every poll: the queued attempts are read through
	// the queued_at candidate index (state first), not the working set of
	// every running run.
	sql := `SELECT ` + board.TaskInstanceColumns + ` FROM (
    SELECT ti.* FROM task_instances ti JOIN runs r ON r.run_id = ti.run_id
    WHERE ti.state = 'queued' AND ti.executor = $1 AND ti.warm_worker = $2 AND r.state = 'running'
    ORDER BY ti.queued_at, ti.run_id, ti.task_id LIMIT ` + strconv.Itoa(pageLimit(limit)) + `
) page ORDER BY queued_at, run_id, task_id`
	return w.collect(ctx, "the attempts bound to warm worker "+worker, sql, sdk.ExecutorWarm, worker)
}

// ListWarmBound returns one page of the queued and running warm attempts
// of running runs that are bound to a worker, after the key, by (run,
// task): what the kube runner counts per worker and requeues from a worker
// that will not run them.
func (w *Writer) ListWarmBound(ctx context.Context, after *Key, limit int) ([]board.TaskInstance, error) {
	return w.listWorking(ctx, "bound warm", `ti.state IN ('queued', 'running') AND ti.warm_worker IS NOT NULL`,
		sdk.ExecutorWarm, after, limit)
}

func (w *Writer) collect(ctx context.Context, what, sql string, args ...any) ([]board.TaskInstance, error) {
	ctx, cancel := w.bound(ctx)
	defer cancel()
	rows, err := w.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("board: list %s: %w", what, err)
	}
	tis, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (board.TaskInstance, error) { return board.ScanTaskInstance(r) })
	if err != nil {
		return nil, fmt.Errorf("board: list %s: %w", what, err)
	}
	return tis, nil
}

package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

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

// WarmClaim is one accepted claim of a warm worker: who claimed, when, and
// which attempts it said it runs at that moment.
type WarmClaim struct {
	Worker string
	// At is the claim's time: the attempt API gives the issue time of the
	// worker token the claim presented (every attempt handed to the worker
	// before it is in Running unless its run ended).
	At time.Time
	// Known: the claim said what the worker runs (Running, possibly none).
	// An older worker says nothing: unknown, never "runs nothing".
	Known   bool
	Running []sdk.Attempt
}

// claimSlot is one attempt of warm_worker_claims.running.
type claimSlot struct {
	RunID  string `json:"run_id"`
	TaskID string `json:"task_id"`
	Try    int32  `json:"try"`
	Epoch  int32  `json:"epoch"`
}

// RecordClaim replaces the worker's claim record (warm_worker_claims) with
// c, in one upsert. A claim older than the one recorded (a retry that
// arrived late) changes nothing.
func (w *Writer) RecordClaim(ctx context.Context, c WarmClaim) error {
	if c.Worker == "" {
		return fmt.Errorf("board: record a warm worker's claim: no worker named")
	}
	var running []byte
	if c.Known {
		slots := make([]claimSlot, len(c.Running))
		for i, a := range c.Running {
			// The ids are the worker's words: jsonb refuses a NUL in them.
			slots[i] = claimSlot{RunID: w.store.Safe(board.FieldName, a.RunID), TaskID: w.store.Safe(board.FieldName, a.TaskID),
				Try: a.Try, Epoch: a.Epoch}
		}
		var err error
		if running, err = json.Marshal(slots); err != nil {
			return fmt.Errorf("board: record the claim of warm worker %s: %w", c.Worker, err)
		}
	}
	ctx, cancel := w.bound(ctx)
	defer cancel()
	_, err := w.pool.Exec(ctx, `INSERT INTO warm_worker_claims (worker, claimed_at, running) VALUES ($1, $2, $3::jsonb)
    ON CONFLICT (worker) DO UPDATE SET claimed_at = EXCLUDED.claimed_at, running = EXCLUDED.running
    WHERE warm_worker_claims.claimed_at <= EXCLUDED.claimed_at`, c.Worker, c.At, running)
	if err != nil {
		return fmt.Errorf("board: record the claim of warm worker %s: %w", c.Worker, err)
	}
	return nil
}

// RecordWarmWorkerPod records the UID of the pod created for warm worker
// worker at now (the kube runner's write once the create answered), fenced
// by the writer's term like the runner's other writes, and removes the
// records made before now-keep: a worker's pod proof matters only while
// its bootstrap credential can still be exchanged. A record of the worker
// is never replaced: a worker name is new with each pod.
func (w *Writer) RecordWarmWorkerPod(ctx context.Context, worker, uid string, keep time.Duration, now time.Time) error {
	if worker == "" || uid == "" {
		return fmt.Errorf("board: record the pod of warm worker %q: no worker or no UID", worker)
	}
	cond, fenceArgs := w.fence(5, now)
	ctx, cancel := w.bound(ctx)
	defer cancel()
	var recorded bool
	err := w.pool.QueryRow(ctx, `WITH pruned AS (
            DELETE FROM warm_worker_pods WHERE recorded_at < $4::timestamptz AND worker <> $1
        ), ins AS (
            INSERT INTO warm_worker_pods (worker, pod_uid, recorded_at)
            SELECT $1, $2, $3 WHERE `+cond+`
            ON CONFLICT (worker) DO NOTHING RETURNING 1
        )
        SELECT EXISTS (SELECT 1 FROM ins)`, append([]any{worker, uid, now, now.Add(-keep)}, fenceArgs...)...).Scan(&recorded)
	if err != nil {
		return fmt.Errorf("board: record the pod of warm worker %s: %w", worker, err)
	}
	if !recorded {
		if err := w.deposed(ctx, "record warm worker pod", now); err != nil {
			return fmt.Errorf("board: record the pod of warm worker %s: %w", worker, err)
		}
	}
	return nil
}

// WarmWorkerPodUID reads the pod UID recorded for warm worker worker (""
// when none is).
func (w *Writer) WarmWorkerPodUID(ctx context.Context, worker string) (string, error) {
	ctx, cancel := w.bound(ctx)
	defer cancel()
	var uid string
	err := w.pool.QueryRow(ctx, `SELECT pod_uid FROM warm_worker_pods WHERE worker = $1`, worker).Scan(&uid)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("board: read the pod of warm worker %s: %w", worker, err)
	}
	return uid, nil
}

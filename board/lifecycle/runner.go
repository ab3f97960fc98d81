package lifecycle

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// The listings and bulk writes below serve a runner: the loop that drives the
// task instances of one executor forward (Lite's, in this project). Each of
// them walks the working set only, the task instances of running runs: the
// runs come from the partial index of running runs and each run's task
// instances from the primary key, so settled history is never read. Every
// listing is ordered by (run_id, task_id) and paged with a Key.

// terminalSQL lists, as SQL literals, the failure reasons that end an infra
// failure for good (no re-place, whatever the budget says): the runner writes
// them, and only a clear starts the task over. IsTerminalFailure is the same
// set in Go.
const terminalSQL = `'dispatch_failed', 'infra_budget_spent'`

// IsTerminalFailure reports whether a failure reason ends an infra failure
// for good: sdk.LabelDispatchFailed or sdk.LabelInfraBudgetSpent.
func IsTerminalFailure(reason string) bool {
	switch reason {
	case sdk.LabelDispatchFailed, sdk.LabelInfraBudgetSpent:
		return true
	}
	return false
}

// settledTI is true for a task instance (aliased ti) that has nothing ahead
// of it: a success, a skip, an upstream failure, or a failure without a
// future (a task failure with no retries left, an infra failure made
// terminal). An attempt held for review is never settled. It is never NULL:
// NOT settledTI must hold for every unsettled row.
const settledTI = `coalesce(ti.held_at IS NULL AND (
    ti.state IN ('success', 'skipped', 'upstream_failed')
    OR (ti.state = 'failed' AND (
        (coalesce(ti.last_failure_kind, 'task') = 'task' AND ti.retries = 0)
        OR (ti.last_failure_kind = 'infra' AND coalesce(ti.failure_reason, '') IN (` + terminalSQL + `))))), false)`

// releasableTI is true for a task instance (aliased ti) that waits for a
// runner's decision: a task failure with retries left or an attempt parked
// up_for_retry (the retry rail), one parked up_for_reschedule (the
// reschedule rail), an infra failure that is not terminal (the re-place
// rail, or a terminal failure once the budget is spent). Never one held for
// review.
const releasableTI = `(ti.held_at IS NULL AND (
    ti.state IN ('up_for_retry', 'up_for_reschedule')
    OR (ti.state = 'failed' AND coalesce(ti.last_failure_kind, 'task') = 'task' AND ti.retries > 0)
    OR (ti.state = 'failed' AND ti.last_failure_kind = 'infra'
        AND coalesce(ti.failure_reason, '') NOT IN (` + terminalSQL + `))))`

// Key is a keyset position in a runner listing: the last (run, task) seen.
type Key struct {
	RunID  string
	TaskID string
}

// pageLimit bounds a listing's page.
func pageLimit(limit int) int {
	if limit <= 0 || limit > ladder.PageSize {
		return ladder.PageSize
	}
	return limit
}

func checkExecutor(executor string) error {
	if !board.IsExecutor(executor) {
		return fmt.Errorf("unknown executor %q", executor)
	}
	return nil
}

// workingSet selects the task instances (ti) of running runs (r) of
// executor $1, after the key ($2, $3) when $2 is not NULL.
const workingSet = workingFrom + "\n" + workingWhere

const (
	workingFrom  = `FROM runs r JOIN task_instances ti ON ti.run_id = r.run_id`
	workingWhere = `WHERE r.state = 'running' AND ti.executor = $1
  AND ($2::text IS NULL OR (ti.run_id, ti.task_id) > ($2::text, $3::text))`
)

func keyArgs(after *Key) (any, any) {
	if after == nil {
		return nil, nil
	}
	return after.RunID, after.TaskID
}

// upstreamsSucceeded is true for a task instance (aliased ti) every one of
// whose upstreams succeeded (so for one that names none). An upstream that
// is still running, waits on a rail, carries a provisional infra mark or is
// held for review keeps it waiting; SettleBlocked settles one whose
// upstream failed for good or was skipped.
// Each upstream is read by its primary key (unnested, not matched with
// ANY, which the planner serves with a hash of every unsucceeded row).
const upstreamsSucceeded = `NOT EXISTS (SELECT 1 FROM unnest(ti.upstreams) u(id)
    JOIN task_instances up ON up.run_id = ti.run_id AND up.task_id = u.id WHERE up.state <> 'success')`

// EnqueueNew moves up to limit task instances of executor that are in state
// none, of running runs, whose upstreams all succeeded, to scheduled (at
// most ladder.PageSize; <= 0 means that), in one statement, and returns
// their attempts by (run, task). Like Enqueue, each move is guarded on the
// state none and the run running, and on the upstreams again.
func (w *Writer) EnqueueNew(ctx context.Context, executor string, limit int, now time.Time) ([]sdk.Attempt, error) {
	if err := checkExecutor(executor); err != nil {
		return nil, fmt.Errorf("board: enqueue new task instances: %w", err)
	}
	fence, fenceArgs := w.fence(5, now)
	sql := `WITH next AS (
    SELECT ti.run_id, ti.task_id ` + workingSet + ` AND ti.state = 'none' AND ` + upstreamsSucceeded + `
    ORDER BY ti.run_id, ti.task_id LIMIT ` + strconv.Itoa(pageLimit(limit)) + `
)
UPDATE task_instances ti SET state = 'scheduled', updated_at = $4
FROM next n, runs r
WHERE ti.run_id = n.run_id AND ti.task_id = n.task_id AND ti.state = 'none'
  AND r.run_id = ti.run_id AND r.state = 'running' AND ` + upstreamsSucceeded + `
  AND ` + fence + `
RETURNING ti.run_id, ti.task_id, ti.try_number, ti.attempt_epoch`
	ctx, cancel := w.bound(ctx)
	defer cancel()
	rows, err := w.pool.Query(ctx, sql, append([]any{executor, nil, nil, now}, fenceArgs...)...)
	if err != nil {
		return nil, fmt.Errorf("board: enqueue new %s task instances: %w", executor, err)
	}
	as, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (sdk.Attempt, error) {
		var a sdk.Attempt
		err := row.Scan(&a.RunID, &a.TaskID, &a.Try, &a.Epoch)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("board: enqueue new %s task instances: %w", executor, err)
	}
	if len(as) == 0 {
		if err := w.deposed(ctx, "enqueue new", now); err != nil {
			return nil, fmt.Errorf("board: enqueue new %s task instances: %w", executor, err)
		}
	}
	sortAttempts(as)
	return as, nil
}

// ListScheduled returns one page of the scheduled task instances of
// executor, of running runs, after the key, by (run, task).
func (w *Writer) ListScheduled(ctx context.Context, executor string, after *Key, limit int) ([]board.TaskInstance, error) {
	return w.listWorking(ctx, "scheduled", `ti.state = 'scheduled'`, executor, after, limit)
}

// ListReleasable returns one page of the task instances of executor, of
// running runs, that wait for a runner's decision, after the key, by (run,
// task): task failures with retries left and attempts parked up_for_retry
// (the retry rail), attempts parked up_for_reschedule (the reschedule rail),
// and infra failures whose reason is not terminal (re-place, or a terminal
// failure once the budget is spent; whether the mark is confirmed or its
// valve open is the caller's to judge). Attempts held for review are never
// listed.
func (w *Writer) ListReleasable(ctx context.Context, executor string, after *Key, limit int) ([]board.TaskInstance, error) {
	return w.listWorking(ctx, "releasable", releasableTI, executor, after, limit)
}

func (w *Writer) listWorking(ctx context.Context, what, pred, executor string, after *Key, limit int) ([]board.TaskInstance, error) {
	if err := checkExecutor(executor); err != nil {
		return nil, fmt.Errorf("board: list %s task instances: %w", what, err)
	}
	sql := `SELECT ` + board.TaskInstanceColumns + ` FROM (
    SELECT ti.* ` + workingSet + ` AND ` + pred + `
    ORDER BY ti.run_id, ti.task_id LIMIT ` + strconv.Itoa(pageLimit(limit)) + `
) page ORDER BY run_id, task_id`
	k1, k2 := keyArgs(after)
	return w.collect(ctx, what+" "+executor+" task instances", sql, executor, k1, k2)
}

// CountActive counts the queued and running task instances of executor, of
// running runs: the attempts handed to the executor and not yet ended. (An
// attempt of a run that finished is answered should_terminate at its next
// report, so it holds no slot.)
func (w *Writer) CountActive(ctx context.Context, executor string) (int, error) {
	if err := checkExecutor(executor); err != nil {
		return 0, fmt.Errorf("board: count active task instances: %w", err)
	}
	ctx, cancel := w.bound(ctx)
	defer cancel()
	var n int
	err := w.pool.QueryRow(ctx, `SELECT count(*) `+workingSet+` AND ti.state IN ('queued', 'running')`,
		executor, nil, nil).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("board: count active %s task instances: %w", executor, err)
	}
	return n, nil
}

// FinishedRun is a run FinishSettledRuns finished.
type FinishedRun struct {
	RunID string
	State string // sdk.RunSuccess or sdk.RunFailed
	// Unsuccessful lists, by task id, the task instances that neither
	// succeeded nor were skipped (empty for a success).
	Unsuccessful []string
	// SettledAt is when its last task instance ended (zero when none did):
	// the finalization's latency is measured from it.
	SettledAt time.Time
}

// FinishSettledRuns finishes up to limit running runs (at most
// ladder.PageSize; <= 0 means that) whose task instances are all settled:
// nothing ahead of any of them (see settledTI: a success, a skip, an upstream
// failure, a task failure with no retries left, an infra failure made
// terminal) and none held for review. A run whose task instances all
// succeeded or were skipped becomes success; any other becomes failed, with
// an error message naming the tasks. The check and the write are one
// statement, by run id.
func (w *Writer) FinishSettledRuns(ctx context.Context, limit int, now time.Time) ([]FinishedRun, error) {
	// The run's row version (xmin) is read with the predicate and compared
	// by the update: an operator's clear that lands in between gives the
	// run a new version (see reopen), and the run is then left for the next
	// tick to judge again, instead of finishing with a cleared task in it.
	fence, fenceArgs := w.fence(2, now)
	sql := `WITH done AS (
    SELECT r.run_id, r.xmin::text AS seen FROM runs r
    WHERE r.state = 'running'
      AND NOT EXISTS (SELECT 1 FROM task_instances ti WHERE ti.run_id = r.run_id AND NOT ` + settledTI + `)
    ORDER BY r.run_id LIMIT ` + strconv.Itoa(pageLimit(limit)) + `
),
summary AS (
    SELECT d.run_id, d.seen, max(ti.ended_at) AS settled_at,
        coalesce(array_agg(ti.task_id ORDER BY ti.task_id)
            FILTER (WHERE ti.state NOT IN ('success', 'skipped')), '{}') AS unsuccessful
    FROM done d LEFT JOIN task_instances ti ON ti.run_id = d.run_id
    GROUP BY d.run_id, d.seen
),
fin AS (
    UPDATE runs r SET
        state = CASE WHEN cardinality(s.unsuccessful) = 0 THEN 'success' ELSE 'failed' END,
        ended_at = $1, updated_at = $1,
        error_message = CASE WHEN cardinality(s.unsuccessful) = 0 THEN NULL
            ELSE 'tasks not successful: ' || array_to_string(s.unsuccessful, ', ') END
    FROM summary s
    WHERE r.run_id = s.run_id AND r.state = 'running' AND r.xmin::text = s.seen
      AND ` + fence + `
    RETURNING r.run_id, r.state, s.unsuccessful, s.settled_at
),
closed AS (
    UPDATE task_instances ti SET run_closed = true FROM fin WHERE ti.run_id = fin.run_id
)
SELECT run_id, state, unsuccessful, settled_at FROM fin`
	ctx, cancel := w.bound(ctx)
	defer cancel()
	rows, err := w.pool.Query(ctx, sql, append([]any{now}, fenceArgs...)...)
	if err != nil {
		return nil, fmt.Errorf("board: finish settled runs: %w", err)
	}
	runs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (FinishedRun, error) {
		var (
			f       FinishedRun
			settled *time.Time
		)
		err := row.Scan(&f.RunID, &f.State, &f.Unsuccessful, &settled)
		if settled != nil {
			f.SettledAt = *settled
		}
		return f, err
	})
	if err != nil {
		return nil, fmt.Errorf("board: finish settled runs: %w", err)
	}
	if len(runs) == 0 {
		if err := w.deposed(ctx, "finish settled runs", now); err != nil {
			return nil, fmt.Errorf("board: finish settled runs: %w", err)
		}
	}
	sortFinished(runs)
	return runs, nil
}

func sortAttempts(as []sdk.Attempt) {
	slices.SortFunc(as, func(a, b sdk.Attempt) int {
		return cmp.Or(cmp.Compare(a.RunID, b.RunID), cmp.Compare(a.TaskID, b.TaskID))
	})
}

func sortFinished(fs []FinishedRun) {
	slices.SortFunc(fs, func(a, b FinishedRun) int { return cmp.Compare(a.RunID, b.RunID) })
}

package board

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// liveTI is true for a task instance (aliased ti) that keeps its run alive:
// one in a live state (sdk.LiveStates), one held for review, an infra
// failure the planner will re-place (not held, budget left), or a
// provisional infra mark made after the valve's cutoff, the parameter
// named by cutoff (a NULL cutoff: every provisional mark). It is never
// NULL. sdk.TaskRow.Live in SQL.
func liveTI(cutoff string) string {
	return `(ti.state IN (` + sqlList(sdk.LiveStates()) + `)
    OR ti.held_at IS NOT NULL
    OR ` + replaceableTI + `
    OR (` + provisionalTI + ` AND coalesce(` + cutoff + `::timestamptz IS NULL OR ti.infra_marked_at > ` + cutoff + `, false)))`
}

// replaceableTI is true for an infra failure the planner will re-place
// (aliased ti): failed on the infra rail, not held, infra budget left.
// sdk.TaskRow.Replaceable in SQL.
const replaceableTI = `(ti.state = '` + sdk.StateFailed + `' AND ti.last_failure_kind = '` + sdk.FailureInfra + `'
    AND ti.held_at IS NULL AND ti.infra_used < ti.infra_budget)`

// openSettledTI is true for a task instance (aliased ti) that is in a
// settled state, not held, and whose run is not finished: exactly the rows
// of task_instances_open_settled_idx (migration 004), a superset of the
// rows that are not live. It is written the way the index's WHERE clause is
// written, so that the planner matches the index;
// TestOpenSettledIndexIsTheComplementOfLive holds the migration's text to
// openSettledWhere. Only a run with such a row can be orphaned.
func openSettledTI() string { return openSettledWhere("ti.") }

// openSettledWhere is the WHERE clause of task_instances_open_settled_idx,
// its columns prefixed with p ("" writes it as migration 004 does, one
// condition per line), built from the states in Go.
func openSettledWhere(p string) string {
	return `NOT ` + p + `run_closed
  AND ` + p + `state IN (` + sqlList(sdk.SettledStates()) + `)
  AND ` + p + `held_at IS NULL`
}

// sqlList writes states (plain words of a closed set) as a list of SQL
// literals.
func sqlList(states []string) string {
	return "'" + strings.Join(states, "', '") + "'"
}

// tiActivity is the latest activity stamped on a task instance (aliased
// ti): its ended_at only when no infra mark ended it, and never
// infra_marked_at (the reaper's own marks are not the run's activity).
// GREATEST skips NULLs. sdk.ActivityAt in SQL.
const tiActivity = `GREATEST(ti.queued_at, ti.running_at, ti.last_heartbeat_at, ti.released_at,
    CASE WHEN ti.infra_marked_at IS NULL THEN ti.ended_at END)`

// ListOrphanRuns returns one page of running runs that have no live task
// instance and whose last activity (the run's start, or the latest stamp on
// any of its task instances) is older than q.OlderThan, oldest activity
// first. It is a snapshot: ReapRun checks again before writing.
//
// It starts from the not-live task instances of unfinished runs (a partial
// index), so its cost follows the runs that could be orphaned, not the
// healthy population. A run with no task instance at all is not listed: it
// has nothing to be orphaned from, and finishing it is the scheduler's.
func (s *Store) ListOrphanRuns(ctx context.Context, q sdk.RunQuery) (sdk.RunPage, error) {
	if q.OlderThan.IsZero() {
		return sdk.RunPage{}, fmt.Errorf("board: list orphan runs: no threshold (OlderThan)")
	}
	sql, args, limit := orphanRunsSQL(q)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return sdk.RunPage{}, fmt.Errorf("board: list orphan runs: %w", err)
	}
	runs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (sdk.RunCandidate, error) {
		var rc sdk.RunCandidate
		err := row.Scan(&rc.RunID, &rc.DagID, &rc.StartedAt, &rc.LastActivity)
		return rc, err
	})
	if err != nil {
		return sdk.RunPage{}, fmt.Errorf("board: list orphan runs: %w", err)
	}
	page := sdk.RunPage{Runs: runs}
	if len(runs) == limit {
		last := runs[len(runs)-1]
		page.Next = &sdk.RunCursor{At: last.LastActivity, RunID: last.RunID}
	}
	return page, nil
}

// orphanRunsSQL is the listing of ListOrphanRuns: its statement, its
// arguments and its page size.
func orphanRunsSQL(q sdk.RunQuery) (string, []any, int) {
	limit := ladder.ListLimit(q.Limit)
	args := []any{q.OlderThan, nullTime(q.ProvisionalAfter)}
	after := ""
	if q.After != nil {
		args = append(args, q.After.At, q.After.RunID)
		after = " AND (a.last_activity, r.run_id) > ($3::timestamptz, $4::text)"
	}
	sql := `SELECT r.run_id, r.dag_id, r.started_at, a.last_activity
FROM (SELECT DISTINCT ti.run_id FROM task_instances ti WHERE ` + openSettledTI() + `) c
JOIN runs r ON r.run_id = c.run_id
CROSS JOIN LATERAL (
    SELECT GREATEST(r.started_at, max(` + tiActivity + `)) AS last_activity
    FROM task_instances ti WHERE ti.run_id = r.run_id
) a
WHERE r.state = 'running'
  AND NOT EXISTS (SELECT 1 FROM task_instances ti WHERE ti.run_id = r.run_id AND ` + liveTI("$2") + `)
  AND a.last_activity < $1` + after + `
ORDER BY a.last_activity, r.run_id
LIMIT ` + strconv.Itoa(limit)
	return sql, args, limit
}

// reapCheckSQL share-locks every task instance of the run ($1) without
// waiting and, over the locked rows, says whether any is live (the valve's
// cutoff is $2) and when the latest activity was.
func reapCheckSQL() string {
	return `WITH locked AS (
    SELECT ` + liveTI("$2") + ` AS live, ` + tiActivity + ` AS activity
    FROM task_instances ti WHERE ti.run_id = $1
    FOR SHARE NOWAIT
)
SELECT coalesce(bool_or(live), false), max(activity) FROM locked`
}

// ReapRun fails an orphaned run after checking the whole orphan predicate
// again inside one transaction: the run and its task instances are locked
// without waiting (a row another transaction holds makes the reap a no-op,
// NoopLocked), the run must still be running (NoopMovedOn), have no live
// task instance and no activity at or after r.OlderThan (NoopActive), and
// r.Term must be the current term (NoopDeposed). A no-op writes nothing.
//
// Attached lists the task instances whose last attempt was dispatched and
// ended failed: an execution of theirs may still be out there, and from now
// on it is answered should_terminate.
func (s *Store) ReapRun(ctx context.Context, r sdk.RunReap) (sdk.RunReapResult, error) {
	if r.RunID == "" || r.OlderThan.IsZero() || r.At.IsZero() || r.Term <= 0 {
		return sdk.RunReapResult{}, fmt.Errorf("board: reap run %q: run id, threshold, time and term are all required", r.RunID)
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return sdk.RunReapResult{}, fmt.Errorf("board: reap run %s: %w", r.RunID, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after commit

	noop := func(reason string) (sdk.RunReapResult, error) {
		return sdk.RunReapResult{NoopReason: reason}, nil
	}
	fail := func(what string, err error) (sdk.RunReapResult, error) {
		return sdk.RunReapResult{}, fmt.Errorf("board: reap run %s: %s: %w", r.RunID, what, err)
	}

	ok, seen, err := s.fence(ctx, tx, r.Term, r.At)
	if err != nil {
		return fail("read leader", err)
	}
	if !ok {
		s.refused(ctx, "reap run", r.Term, r.At, seen, sdk.Attempt{RunID: r.RunID})
		return noop(sdk.NoopDeposed)
	}

	var (
		state   string
		started *time.Time
	)
	err = tx.QueryRow(ctx, "SELECT state, started_at FROM runs WHERE run_id = $1 FOR UPDATE NOWAIT",
		r.RunID).Scan(&state, &started)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return noop(sdk.NoopNotFound)
	case isLockNotAvailable(err):
		return noop(sdk.NoopLocked)
	case err != nil:
		return fail("lock run", err)
	}
	if state != sdk.RunRunning {
		return noop(sdk.NoopMovedOn)
	}

	var (
		live     bool
		activity *time.Time
	)
	err = tx.QueryRow(ctx, reapCheckSQL(), r.RunID, nullTime(r.ProvisionalAfter)).Scan(&live, &activity)
	switch {
	case isLockNotAvailable(err):
		return noop(sdk.NoopLocked)
	case err != nil:
		return fail("lock task instances", err)
	}
	if live || (activity != nil && !activity.Before(r.OlderThan)) ||
		(started != nil && !started.Before(r.OlderThan)) {
		return noop(sdk.NoopActive)
	}

	rows, err := tx.Query(ctx, `SELECT run_id, task_id, try_number, attempt_epoch FROM task_instances
        WHERE run_id = $1 AND state = 'failed' AND queued_at IS NOT NULL ORDER BY task_id`, r.RunID)
	if err != nil {
		return fail("read attached attempts", err)
	}
	attached, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (sdk.Attempt, error) {
		var a sdk.Attempt
		err := row.Scan(&a.RunID, &a.TaskID, &a.Try, &a.Epoch)
		return a, err
	})
	if err != nil {
		return fail("read attached attempts", err)
	}
	if _, err := tx.Exec(ctx, `WITH failed AS (
    UPDATE runs SET state = 'failed', ended_at = $2, error_message = $3, updated_at = $2
    WHERE run_id = $1 RETURNING run_id
)
UPDATE task_instances ti SET run_closed = true FROM failed f WHERE ti.run_id = f.run_id`,
		r.RunID, r.At, s.Safe(FieldMessage, r.Message)); err != nil {
		return fail("fail run", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fail("commit", err)
	}
	return sdk.RunReapResult{Applied: true, Attached: attached}, nil
}

// fence share-locks the leader row inside tx and reports whether term is
// current and its lease unexpired at at, and the row as it saw it when
// it found it (seenHolding).
func (s *Store) fence(ctx context.Context, tx pgx.Tx, term int64, at time.Time) (bool, *LeaderSeen, error) {
	var (
		cur     int64
		expires *time.Time
	)
	err := tx.QueryRow(ctx, "SELECT term, expires_at FROM leader WHERE "+leaderRow+" FOR SHARE", s.fenceKey()).Scan(&cur, &expires)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil, nil
	}
	if err != nil {
		return false, nil, err
	}
	return cur == term && expires != nil && expires.After(at), s.seenHolding(&cur, expires), nil
}

func isLockNotAvailable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// nullTime is t as a query argument: NULL when zero.
func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

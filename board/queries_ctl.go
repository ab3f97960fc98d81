package board

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dexaflow/reaper/sdk/ladder"
)

// The operator's reads (reaperctl): listings of runs and of held attempts,
// and the timings tune derives thresholds from. They read settled history
// as well as live rows, so most of them scan rather than use the candidate
// indexes; each is bounded by its limit and by the store's query timeout.

// Limits of the operator's listings.
const (
	// ListLimitMax is the largest page ListRuns and ListHeld return.
	ListLimitMax = 1000
	// TimingLimitDefault is how many samples a timing read takes by default.
	TimingLimitDefault = 10000
	// TimingLimitMax is the most samples a timing read takes.
	TimingLimitMax = 100000
)

// RunSummary is a run with its task instances counted.
type RunSummary struct {
	Run
	// Tasks counts the run's task instances by state.
	Tasks map[string]int
	// Held counts the run's task instances held for review.
	Held int
}

// RunListCursor is a position in a run listing: the run's sort time (its
// start, or its last update when it has not started) and its id.
type RunListCursor struct {
	At    time.Time
	RunID string
}

// RunListQuery pages through runs, newest first.
type RunListQuery struct {
	// States keeps runs in these states only; empty: every state.
	States []string
	// After continues a listing after this position.
	After *RunListCursor
	// Limit is the page size: <= 0 means ladder.PageSize, at most ListLimitMax.
	Limit int
}

// RunListPage is one page of runs; Next is nil when it was the last.
type RunListPage struct {
	Runs []RunSummary
	Next *RunListCursor
}

var runStates = map[string]bool{"queued": true, "running": true, "success": true, "failed": true}

// IsRunState reports whether s is a run state.
func IsRunState(s string) bool { return runStates[s] }

// ListRuns returns one page of runs, the most recently started first, each
// with its task instances counted by state.
func (s *Store) ListRuns(ctx context.Context, q RunListQuery) (RunListPage, error) {
	for _, st := range q.States {
		if !runStates[st] {
			return RunListPage{}, fmt.Errorf("board: list runs: unknown run state %q", st)
		}
	}
	limit := pageLimit(q.Limit)
	args := []any{q.States}
	after := ""
	if q.After != nil {
		args = append(args, q.After.At, q.After.RunID)
		after = " AND (coalesce(r.started_at, r.updated_at), r.run_id) < ($2::timestamptz, $3::text)"
	}
	sql := `SELECT r.run_id, r.dag_id, r.state, r.started_at, r.ended_at, r.error_message, r.updated_at,
    coalesce(c.by_state, '{}'::jsonb), coalesce(c.held, 0)
FROM runs r
CROSS JOIN LATERAL (
    SELECT jsonb_object_agg(n.state, n.count) AS by_state, sum(n.held)::int AS held
    FROM (SELECT ti.state, count(*) AS count, count(ti.held_at) AS held
          FROM task_instances ti WHERE ti.run_id = r.run_id GROUP BY ti.state) n
) c
WHERE (coalesce(cardinality($1::text[]), 0) = 0 OR r.state = ANY ($1::text[]))` + after + `
ORDER BY coalesce(r.started_at, r.updated_at) DESC, r.run_id DESC
LIMIT ` + strconv.Itoa(limit)

	ctx, cancel := s.bound(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return RunListPage{}, fmt.Errorf("board: list runs: %w", err)
	}
	runs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (RunSummary, error) {
		var (
			rs             RunSummary
			started, ended *time.Time
			msg            *string
			byState        []byte
		)
		err := row.Scan(&rs.RunID, &rs.DagID, &rs.State, &started, &ended, &msg, &rs.UpdatedAt, &byState, &rs.Held)
		if err != nil {
			return RunSummary{}, err
		}
		rs.StartedAt, rs.EndedAt, rs.ErrorMessage = timeOrZero(started), timeOrZero(ended), deref(msg)
		if err := json.Unmarshal(byState, &rs.Tasks); err != nil {
			return RunSummary{}, fmt.Errorf("decode task counts of %s: %w", rs.RunID, err)
		}
		return rs, nil
	})
	if err != nil {
		return RunListPage{}, fmt.Errorf("board: list runs: %w", err)
	}
	page := RunListPage{Runs: runs}
	if len(runs) == limit {
		last := runs[len(runs)-1]
		page.Next = &RunListCursor{At: RunSortTime(last.Run), RunID: last.RunID}
	}
	return page, nil
}

// RunSortTime is the time ListRuns orders a run by: its start, or its last
// update when it has not started.
func RunSortTime(r Run) time.Time {
	if r.StartedAt.IsZero() {
		return r.UpdatedAt
	}
	return r.StartedAt
}

// HeldCursor is a position in the listing of held attempts.
type HeldCursor struct {
	HeldAt time.Time
	RunID  string
	TaskID string
}

// HeldQuery pages through the attempts held for review, oldest hold first.
type HeldQuery struct {
	After *HeldCursor
	// Limit is the page size: <= 0 means ladder.PageSize, at most ListLimitMax.
	Limit int
}

// HeldPage is one page of held attempts; Next is nil when it was the last.
type HeldPage struct {
	Attempts []TaskInstance
	Next     *HeldCursor
}

// ListHeld returns one page of the task instances whose attempt is held for
// an operator's review (held_at set), the oldest hold first.
func (s *Store) ListHeld(ctx context.Context, q HeldQuery) (HeldPage, error) {
	limit := pageLimit(q.Limit)
	var args []any
	after := ""
	if q.After != nil {
		args = append(args, q.After.HeldAt, q.After.RunID, q.After.TaskID)
		after = " AND (held_at, run_id, task_id) > ($1::timestamptz, $2::text, $3::text)"
	}
	sql := "SELECT " + TaskInstanceColumns + " FROM task_instances WHERE held_at IS NOT NULL" + after +
		" ORDER BY held_at, run_id, task_id LIMIT " + strconv.Itoa(limit)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return HeldPage{}, fmt.Errorf("board: list held attempts: %w", err)
	}
	tis, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TaskInstance, error) { return ScanTaskInstance(r) })
	if err != nil {
		return HeldPage{}, fmt.Errorf("board: list held attempts: %w", err)
	}
	page := HeldPage{Attempts: tis}
	if len(tis) == limit {
		last := tis[len(tis)-1]
		page.Next = &HeldCursor{HeldAt: last.HeldAt, RunID: last.RunID, TaskID: last.TaskID}
	}
	return page, nil
}

// TimingQuery bounds a read of timings: the newest Limit samples that ended
// at or after EndedAfter.
type TimingQuery struct {
	// EndedAfter drops samples that ended before it; zero: no bound.
	EndedAfter time.Time
	// Limit: <= 0 means TimingLimitDefault, at most TimingLimitMax.
	Limit int
}

func (q TimingQuery) limit() int { return clampLimit(q.Limit, TimingLimitDefault, TimingLimitMax) }

// clampLimit is a read's limit asked for as n: def when n is not positive,
// at most most.
func clampLimit(n, def, most int) int {
	switch {
	case n <= 0:
		return def
	case n > most:
		return most
	}
	return n
}

// AttemptTiming is when one successful attempt was queued, started and
// ended. QueuedAt is zero when the attempt was never stamped queued.
type AttemptTiming struct {
	RunID     string
	TaskID    string
	Executor  string
	QueuedAt  time.Time
	RunningAt time.Time
	EndedAt   time.Time
	// PodCreatedAt is when the API server created the attempt's pod (kube;
	// zero when none was recorded).
	PodCreatedAt time.Time
}

// Duration is how long the attempt ran: from running to its end.
func (a AttemptTiming) Duration() time.Duration { return a.EndedAt.Sub(a.RunningAt) }

// QueueWait is how long the attempt waited between queued and running; ok
// is false when it has no queued time.
func (a AttemptTiming) QueueWait() (time.Duration, bool) {
	if a.QueuedAt.IsZero() {
		return 0, false
	}
	return a.RunningAt.Sub(a.QueuedAt), true
}

// PodStart is how long the attempt's pod took from its creation to the
// attempt running; ok is false when no creation was recorded (not kube) or
// the stamps are out of order.
func (a AttemptTiming) PodStart() (time.Duration, bool) {
	if a.PodCreatedAt.IsZero() || a.PodCreatedAt.After(a.RunningAt) {
		return 0, false
	}
	return a.RunningAt.Sub(a.PodCreatedAt), true
}

// SuccessTimings reads the timings of successful attempts, the most recently
// ended first. A task instance holds only its current attempt, and for a
// success that is the attempt that succeeded, so every row is one finished
// attempt. Rows whose stamps are missing or out of order are left out.
func (s *Store) SuccessTimings(ctx context.Context, q TimingQuery) ([]AttemptTiming, error) {
	args := []any{}
	where := ""
	if !q.EndedAfter.IsZero() {
		args = append(args, q.EndedAfter)
		where = " AND ended_at >= $1"
	}
	sql := `SELECT run_id, task_id, executor, queued_at, running_at, ended_at, pod_created_at FROM task_instances
WHERE state = 'success' AND running_at IS NOT NULL AND ended_at IS NOT NULL AND ended_at >= running_at
  AND (queued_at IS NULL OR queued_at <= running_at)` + where + `
ORDER BY ended_at DESC, run_id, task_id
LIMIT ` + strconv.Itoa(q.limit())
	ctx, cancel := s.bound(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("board: read attempt timings: %w", err)
	}
	ts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (AttemptTiming, error) {
		var (
			a           AttemptTiming
			queued, pod *time.Time
		)
		err := row.Scan(&a.RunID, &a.TaskID, &a.Executor, &queued, &a.RunningAt, &a.EndedAt, &pod)
		a.QueuedAt, a.PodCreatedAt = timeOrZero(queued), timeOrZero(pod)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("board: read attempt timings: %w", err)
	}
	return ts, nil
}

// RunSettleTiming is how a successful run ended: the latest activity of its
// task instances and the run's end. Between the two the run has nothing
// live, which is exactly what the orphan-run reaper measures.
type RunSettleTiming struct {
	RunID        string
	LastActivity time.Time
	EndedAt      time.Time
}

// Lag is how long the run sat with nothing live before it was finished.
func (r RunSettleTiming) Lag() time.Duration { return r.EndedAt.Sub(r.LastActivity) }

// RunSettleTimings reads, for successful runs, the time between the latest
// activity of their task instances and the run's end, the most recently
// ended first. Failed runs are left out: a run the orphan-run reaper failed
// would only echo the threshold back.
func (s *Store) RunSettleTimings(ctx context.Context, q TimingQuery) ([]RunSettleTiming, error) {
	args := []any{}
	where := ""
	if !q.EndedAfter.IsZero() {
		args = append(args, q.EndedAfter)
		where = " AND r.ended_at >= $1"
	}
	sql := `SELECT r.run_id, a.last_activity, r.ended_at
FROM runs r
CROSS JOIN LATERAL (
    SELECT GREATEST(r.started_at, max(` + tiActivity + `)) AS last_activity
    FROM task_instances ti WHERE ti.run_id = r.run_id
) a
WHERE r.state = 'success' AND r.ended_at IS NOT NULL AND a.last_activity IS NOT NULL
  AND a.last_activity <= r.ended_at` + where + `
ORDER BY r.ended_at DESC, r.run_id
LIMIT ` + strconv.Itoa(q.limit())
	ctx, cancel := s.bound(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("board: read run settle timings: %w", err)
	}
	ts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (RunSettleTiming, error) {
		var r RunSettleTiming
		err := row.Scan(&r.RunID, &r.LastActivity, &r.EndedAt)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("board: read run settle timings: %w", err)
	}
	return ts, nil
}

// pageLimit is the page size of the operator's listings.
func pageLimit(n int) int { return clampLimit(n, ladder.PageSize, ListLimitMax) }

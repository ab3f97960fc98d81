package board

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

var timeFields = map[sdk.TimeField]bool{
	sdk.FieldQueuedAt: true, sdk.FieldRunningAt: true, sdk.FieldHeartbeatAt: true, sdk.FieldMarkedAt: true,
	sdk.FieldEndedAt: true,
}

const candidateColumns = `run_id, task_id, try_number, attempt_epoch, state, executor,
	queued_at, running_at, last_heartbeat_at, released_at, ended_at, infra_marked_at, infra_confirmed_at,
	last_failure_kind, failure_reason, warm_worker, execution_timeout_seconds, credential_minted_at, pod_uid`

// candidateSQL builds the listing statement for q. States, executors, the
// order column and the limit come from closed sets (validated here) and are
// written into the statement as literals, so that the planner can match the
// partial indexes even under a generic plan of a cached statement; the
// threshold, the cursor and the named attempts (Only) are parameters.
//
// One state is one range scan of the index for (state, column). Several
// states are one such scan each under a merge that keeps their order, never a
// sort of the whole set.
func candidateSQL(q sdk.CandidateQuery) (string, []any, int, error) {
	if len(q.States) == 0 {
		return "", nil, 0, fmt.Errorf("no states")
	}
	if !timeFields[q.OrderBy] {
		return "", nil, 0, fmt.Errorf("unknown order column %q", q.OrderBy)
	}
	if q.OlderThan.IsZero() {
		return "", nil, 0, fmt.Errorf("no threshold (OlderThan)")
	}
	switch q.Heartbeat {
	case sdk.HeartbeatAny, sdk.HeartbeatSeen, sdk.HeartbeatNever:
	default:
		return "", nil, 0, fmt.Errorf("unknown heartbeat filter %q", q.Heartbeat)
	}
	limit := ladder.ListLimit(q.Limit)
	states, err := literalList(q.States, taskStates, "state")
	if err != nil {
		return "", nil, 0, err
	}
	execFilter, err := executorFilter(q.Executors)
	if err != nil {
		return "", nil, 0, err
	}

	col := string(q.OrderBy)
	args := []any{q.OlderThan}
	var where strings.Builder
	where.WriteString(execFilter)
	// (A NULL timestamp fails the comparison: such rows are never listed.)
	fmt.Fprintf(&where, " AND %s < $1", col)
	switch q.Heartbeat {
	case sdk.HeartbeatSeen:
		where.WriteString(" AND last_heartbeat_at IS NOT NULL")
	case sdk.HeartbeatNever:
		where.WriteString(" AND last_heartbeat_at IS NULL")
	}
	if q.After != nil {
		args = append(args, q.After.At, q.After.RunID, q.After.TaskID)
		fmt.Fprintf(&where, " AND (%s, run_id, task_id) > ($%d::timestamptz, $%d::text, $%d::text)", col,
			len(args)-2, len(args)-1, len(args))
	}
	if len(q.Only) > 0 {
		if len(q.Only) > ladder.PageSize {
			return "", nil, 0, fmt.Errorf("%d attempts named, at most %d", len(q.Only), ladder.PageSize)
		}
		runs, tasks := make([]string, len(q.Only)), make([]string, len(q.Only))
		for i, a := range q.Only {
			runs[i], tasks[i] = a.RunID, a.TaskID
		}
		args = append(args, runs, tasks)
		fmt.Fprintf(&where, " AND (run_id, task_id) IN (SELECT * FROM unnest($%d::text[], $%d::text[]))",
			len(args)-1, len(args))
	}
	order := " ORDER BY " + col + ", run_id, task_id LIMIT " + strconv.Itoa(limit)

	branch := func(state string) string {
		return "SELECT " + candidateColumns + " FROM task_instances WHERE state = " + state + where.String() + order
	}
	if len(states) == 1 {
		return branch(states[0]), args, limit, nil
	}
	parts := make([]string, len(states))
	for i, st := range states {
		parts[i] = "(" + branch(st) + ")"
	}
	return strings.Join(parts, " UNION ALL ") + order, args, limit, nil
}

// literalList checks every value against its closed set and returns them,
// deduplicated, as quoted SQL literals.
func literalList(vals []string, allowed map[string]bool, what string) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	for _, v := range vals {
		if !allowed[v] {
			return nil, fmt.Errorf("unknown %s %q", what, v)
		}
		if seen[v] {
			continue
		}
		seen[v] = true
		out = append(out, "'"+v+"'") // a member of a closed set of plain words: no quoting needed
	}
	return out, nil
}

// ListCandidates returns one page of task instances matching q: oldest
// first by q.OrderBy, only rows whose timestamp is set and older than
// q.OlderThan (the threshold is applied before the limit), after q.After.
// Next is set only when the page is full.
func (s *Store) ListCandidates(ctx context.Context, q sdk.CandidateQuery) (sdk.CandidatePage, error) {
	sql, args, limit, err := candidateSQL(q)
	if err != nil {
		return sdk.CandidatePage{}, fmt.Errorf("board: list candidates: %w", err)
	}
	page, err := s.candidatePage(ctx, sql, args, limit, scanCandidate, func(c sdk.Candidate) time.Time { return candidateTime(c, q.OrderBy) })
	if err != nil {
		return sdk.CandidatePage{}, fmt.Errorf("board: list candidates: %w", err)
	}
	return page, nil
}

// candidatePage runs a candidate listing (sql selects candidateColumns,
// at most limit rows) and makes its page: Next, at the last row's key
// (keyAt its timestamp), only when the page is full.
func (s *Store) candidatePage(ctx context.Context, sql string, args []any, limit int,
	scan pgx.RowToFunc[sdk.Candidate], keyAt func(sdk.Candidate) time.Time) (sdk.CandidatePage, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var cands []sdk.Candidate
	err := s.listing(ctx, sql, args, func(rows pgx.Rows) error {
		var err error
		cands, err = pgx.CollectRows(rows, scan)
		return err
	})
	if err != nil {
		return sdk.CandidatePage{}, err
	}
	page := sdk.CandidatePage{Candidates: cands}
	if len(cands) == limit {
		last := cands[len(cands)-1]
		page.Next = &sdk.Cursor{At: keyAt(last), RunID: last.RunID, TaskID: last.TaskID}
	}
	return page, nil
}

// executorFilter is the condition (" AND executor IN (...)") of a listing
// of executors; empty when none are named (every executor).
func executorFilter(execs []string) (string, error) {
	if len(execs) == 0 {
		return "", nil
	}
	list, err := literalList(execs, executors, "executor")
	if err != nil {
		return "", err
	}
	return " AND executor IN (" + strings.Join(list, ", ") + ")", nil
}

// listingSettings are set for the listing's own (implicit) transaction. The
// planner multiplies the selectivity of the state by that of the timestamp,
// but the timestamp is NULL in most rows of other states, so it underrates how
// many rows a range holds and prefers a bitmap scan followed by a sort of the
// whole range. Without bitmap scans it walks the index in order and stops
// after one page, whatever the estimate.
const listingSettings = "SELECT set_config('enable_bitmapscan', 'off', true)"

// listing runs sql after listingSettings in one round trip and hands its
// rows to read.
func (s *Store) listing(ctx context.Context, sql string, args []any, read func(pgx.Rows) error) error {
	var batch pgx.Batch
	batch.Queue(listingSettings)
	batch.Queue(sql, args...)
	br := s.pool.SendBatch(ctx, &batch)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return err
	}
	rows, err := br.Query()
	if err == nil {
		err = read(rows)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

func scanCandidate(row pgx.CollectableRow) (sdk.Candidate, error) {
	return scanCandidateWith(row)
}

// scanCandidateWith scans candidateColumns, then extra (columns the
// statement selects after them).
func scanCandidateWith(row pgx.CollectableRow, extra ...any) (sdk.Candidate, error) {
	var (
		c                                                  sdk.Candidate
		queued, running, hb, released, ended, marked, conf *time.Time
		minted                                             *time.Time
		kind, reason, warm, podUID                         *string
		timeout                                            *int32
	)
	err := row.Scan(append([]any{&c.RunID, &c.TaskID, &c.Try, &c.Epoch, &c.State, &c.Executor,
		&queued, &running, &hb, &released, &ended, &marked, &conf, &kind, &reason, &warm, &timeout, &minted, &podUID}, extra...)...)
	if err != nil {
		return sdk.Candidate{}, err
	}
	c.QueuedAt, c.RunningAt, c.LastHeartbeatAt = timeOrZero(queued), timeOrZero(running), timeOrZero(hb)
	c.ReleasedAt, c.InfraMarkedAt, c.InfraConfirmedAt = timeOrZero(released), timeOrZero(marked), timeOrZero(conf)
	c.EndedAt, c.CredentialMintedAt = timeOrZero(ended), timeOrZero(minted)
	c.LastFailureKind, c.FailureReason, c.WarmWorker = deref(kind), deref(reason), deref(warm)
	c.PodUID = deref(podUID)
	if timeout != nil {
		c.ExecutionTimeout = time.Duration(*timeout) * time.Second
	}
	return c, nil
}

func candidateTime(c sdk.Candidate, f sdk.TimeField) time.Time {
	switch f {
	case sdk.FieldQueuedAt:
		return c.QueuedAt
	case sdk.FieldRunningAt:
		return c.RunningAt
	case sdk.FieldHeartbeatAt:
		return c.LastHeartbeatAt
	case sdk.FieldEndedAt:
		return c.EndedAt
	default:
		return c.InfraMarkedAt
	}
}

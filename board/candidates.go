package board

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

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
	page, err := s.candidatePage(ctx, sql, args, limit, newCandidateScan().scan, func(c sdk.Candidate) time.Time { return candidateTime(c, q.OrderBy) })
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
	// Room for the whole page from the start: a listing asks for more than
	// ladder.PageSize only after a full page, while it drains a backlog
	// (sdk/reap.Drain), and then its page is full or nearly so. Growing a
	// drain page of 1,000 by doubling would allocate three times its size.
	cands := make([]sdk.Candidate, 0, limit)
	err := s.listing(ctx, sql, args, func(rows pgx.Rows) error {
		var err error
		cands, err = pgx.AppendRows(cands, rows, scan)
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

// candidateScan holds the scan targets of candidateColumns, reused for
// every row of a listing. The NULL-able columns scan into pgtype values,
// not pointers: pgx scans a non-NULL value through a **time.Time or a
// **string by allocating the pointer (with reflect) for every value, and a
// page of Lite attempts has a dozen such columns a row. The row is the
// same whichever way it was scanned.
type candidateScan struct {
	c                                                  sdk.Candidate
	queued, running, hb, released, ended, marked, conf pgtype.Timestamptz
	minted                                             pgtype.Timestamptz
	kind, reason, warm, podUID                         pgtype.Text
	timeout                                            pgtype.Int4
	dest                                               []any // pointers to the fields above, then extra
}

// newCandidateScan makes the targets of candidateColumns, followed by
// extra (columns the statement selects after them).
func newCandidateScan(extra ...any) *candidateScan {
	sc := &candidateScan{}
	sc.dest = append([]any{&sc.c.RunID, &sc.c.TaskID, &sc.c.Try, &sc.c.Epoch,
		closedWord{&sc.c.State, stateWords}, closedWord{&sc.c.Executor, executorWords},
		&sc.queued, &sc.running, &sc.hb, &sc.released, &sc.ended, &sc.marked, &sc.conf,
		&sc.kind, &sc.reason, &sc.warm, &sc.timeout, &sc.minted, &sc.podUID}, extra...)
	return sc
}

// scan reads one row into the targets and returns its candidate (the
// extra targets hold the row's extra columns until the next scan).
func (sc *candidateScan) scan(row pgx.CollectableRow) (sdk.Candidate, error) {
	if err := row.Scan(sc.dest...); err != nil {
		return sdk.Candidate{}, err
	}
	c := &sc.c // every field is written again for every row
	var err error
	for _, t := range [...]struct {
		to   *time.Time
		from pgtype.Timestamptz
	}{
		{&c.QueuedAt, sc.queued}, {&c.RunningAt, sc.running}, {&c.LastHeartbeatAt, sc.hb},
		{&c.ReleasedAt, sc.released}, {&c.EndedAt, sc.ended}, {&c.InfraMarkedAt, sc.marked},
		{&c.InfraConfirmedAt, sc.conf}, {&c.CredentialMintedAt, sc.minted},
	} {
		if *t.to, err = timeOf(t.from); err != nil {
			return sdk.Candidate{}, err
		}
	}
	c.LastFailureKind, c.FailureReason, c.WarmWorker = sc.kind.String, sc.reason.String, sc.warm.String
	c.PodUID = sc.podUID.String
	c.ExecutionTimeout = time.Duration(sc.timeout.Int32) * time.Second // 0 when NULL
	return *c, nil
}

// closedWord scans a text column whose values come from a closed set of
// words (a state, an executor: the table's CHECK constraints) into to,
// handing out the set's own string instead of a new copy of the same
// word for every row. A value outside the set is copied, as a plain scan
// would; NULL is an error, as it is for a scan into a string.
type closedWord struct {
	to    *string
	words []string
}

func (w closedWord) ScanBytes(b []byte) error {
	if b == nil {
		return fmt.Errorf("cannot scan NULL into a string")
	}
	for _, s := range w.words {
		if string(b) == s {
			*w.to = s
			return nil
		}
	}
	*w.to = string(b)
	return nil
}

// timeOf is timeOrZero for a pgtype.Timestamptz: zero when NULL, and, as
// a scan into a time.Time, an error for an infinite timestamp.
func timeOf(t pgtype.Timestamptz) (time.Time, error) {
	if t.Valid && t.InfinityModifier != pgtype.Finite {
		return time.Time{}, fmt.Errorf("cannot scan %s into a time", t.InfinityModifier)
	}
	return t.Time, nil
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

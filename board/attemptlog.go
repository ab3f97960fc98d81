package board

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dexaflow/reaper/sdk"
)

// appendLogSQL appends the lines when the leader row picked by $1 holds
// term $2 with a lease unexpired at $3, and answers how many it appended
// and the row it saw (NULL, NULL: none of this holder).
const appendLogSQL = `
WITH lead AS (
    SELECT term, expires_at FROM leader WHERE ` + leaderRow + ` FOR SHARE
), ins AS (
    INSERT INTO attempt_log (run_id, task_id, try_number, attempt_epoch, at, line)
    SELECT l.run_id, l.task_id, l.try_number, l.attempt_epoch, l.at, l.line
    FROM unnest($4::text[], $5::text[], $6::int4[], $7::int4[], $8::timestamptz[], $9::text[])
        WITH ORDINALITY AS l(run_id, task_id, try_number, attempt_epoch, at, line, ord)
    WHERE EXISTS (SELECT 1 FROM lead WHERE term = $2 AND expires_at > $3)
    ORDER BY l.ord
    RETURNING 1
)
SELECT (SELECT count(*) FROM ins), (SELECT term FROM lead), (SELECT expires_at FROM lead)`

// AppendLog appends lines to attempts' try logs in one statement, fenced on
// term: when term is not current (or its lease has expired by the latest
// line's time) nothing is written and the error wraps ErrDeposed. Each line
// is made safe first (Safe); when PostgreSQL refuses the batch for one
// line's data, the lines are appended one by one and that line alone is
// left out (told to the observer).
func (s *Store) AppendLog(ctx context.Context, term int64, lines []sdk.LogLine) error {
	if len(lines) == 0 {
		return nil
	}
	if _, _, err := logArrays(lines); err != nil {
		return fmt.Errorf("board: append log: %w", err)
	}
	lines = s.safeLines(lines)
	err := s.appendLog(ctx, term, lines)
	if err == nil || !IsRowError(err) {
		return err
	}
	for _, l := range lines {
		err := s.appendLog(ctx, term, []sdk.LogLine{l})
		switch {
		case err == nil:
		case IsRowError(err):
			if s.observer != nil {
				s.observer.RowRefused("append log", l.Attempt, err)
			}
		default:
			return err
		}
	}
	return nil
}

// safeLines returns lines with each line's text made safe (Safe): lines
// itself when every line already is.
func (s *Store) safeLines(lines []sdk.LogLine) []sdk.LogLine {
	return safeEach(lines, func(l *sdk.LogLine) [2]*string { return [2]*string{&l.Line} }, s.observer, FieldLogLine)
}

// SafeLogLines is safeLines for the writers' side (package lifecycle).
func (s *Store) SafeLogLines(lines []sdk.LogLine) []sdk.LogLine { return s.safeLines(lines) }

func (s *Store) appendLog(ctx context.Context, term int64, lines []sdk.LogLine) error {
	args, latest, err := logArrays(lines)
	if err != nil {
		return fmt.Errorf("board: append log: %w", err)
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var (
		n       int64
		seen    *int64
		expires *time.Time
	)
	err = s.pool.QueryRow(ctx, appendLogSQL, append([]any{s.fenceKey(), term, latest}, args...)...).Scan(&n, &seen, &expires)
	if err != nil {
		return fmt.Errorf("board: append log: %w", err)
	}
	if n == 0 {
		s.refused(ctx, "append log", term, latest, s.seenHolding(seen, expires), lineAttempts(lines)...)
		return fmt.Errorf("board: append log: term %d: %w", term, ErrDeposed)
	}
	return nil
}

// logArrays turns lines into the parallel arrays the insert statements take,
// and returns the latest line time.
func logArrays(lines []sdk.LogLine) ([]any, time.Time, error) {
	n := len(lines)
	runIDs, taskIDs, texts := make([]string, n), make([]string, n), make([]string, n)
	tries, epochs := make([]int32, n), make([]int32, n)
	ats := make([]time.Time, n)
	var latest time.Time
	for i, l := range lines {
		if l.RunID == "" || l.TaskID == "" || l.At.IsZero() {
			return nil, time.Time{}, fmt.Errorf("line %d (%s): run id, task id and time are required", i, l.Attempt)
		}
		runIDs[i], taskIDs[i], tries[i], epochs[i], ats[i], texts[i] = l.RunID, l.TaskID, l.Try, l.Epoch, l.At, l.Line
		if l.At.After(latest) {
			latest = l.At
		}
	}
	return []any{runIDs, taskIDs, tries, epochs, ats, texts}, latest, nil
}

// AttemptLog returns the try log of a task instance, every attempt, in the
// order it was written.
func (s *Store) AttemptLog(ctx context.Context, runID, taskID string) ([]sdk.LogLine, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT run_id, task_id, try_number, attempt_epoch, at, line
        FROM attempt_log WHERE run_id = $1 AND task_id = $2 ORDER BY id`, runID, taskID)
	if err != nil {
		return nil, fmt.Errorf("board: read attempt log of %s/%s: %w", runID, taskID, err)
	}
	lines, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (sdk.LogLine, error) {
		var l sdk.LogLine
		err := row.Scan(&l.RunID, &l.TaskID, &l.Try, &l.Epoch, &l.At, &l.Line)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("board: read attempt log of %s/%s: %w", runID, taskID, err)
	}
	return lines, nil
}

// lineAttempts are the attempts lines name, each once, in order.
func lineAttempts(lines []sdk.LogLine) []sdk.Attempt {
	var out []sdk.Attempt
	seen := map[sdk.Attempt]bool{}
	for _, l := range lines {
		if !seen[l.Attempt] {
			seen[l.Attempt] = true
			out = append(out, l.Attempt)
		}
	}
	return out
}

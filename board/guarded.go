package board

import (
	"context"
	"fmt"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// The guarded batch writes (Mark, ConfirmInfra, OverrideInfra, Settle,
// RecordPodSightings)
// share one shape: one statement takes the batch as parallel arrays, share-
// locks the leader row, applies each request whose guard holds and returns
// the ordinals that applied with the lease it saw (leadCTE ... batchAnswer). A
// request that did not apply is deposed when its term or lease was not the
// current one; otherwise its row is read again and the request's own
// Refusal (package sdk) says why.

// sameAttempt is true when the row (ti) holds exactly the request's (alias
// r) attempt.
const sameAttempt = `ti.run_id = r.run_id AND ti.task_id = r.task_id
      AND ti.try_number = r.try_number AND ti.attempt_epoch = r.attempt_epoch`

// fenced is true when the request's (alias r) term is the leader row's and
// its lease has not expired at the request's time.
const fenced = `r.term = (SELECT term FROM lead) AND r.at < (SELECT expires_at FROM lead)`

// provisionalTI is true for a provisional infra mark (aliased ti): failed on
// the infra rail, not confirmed yet. sdk.TaskRow.Provisional in SQL.
const provisionalTI = `(ti.state = '` + sdk.StateFailed + `' AND ti.last_failure_kind = '` + sdk.FailureInfra + `'
    AND ti.infra_confirmed_at IS NULL)`

// A batch statement is leadCTE, then the batch's own CTEs (the last of them
// named "applied", returning the ordinals that applied), then batchAnswer.
// The leader row is picked by $1 (leaderRow): held by another replica, it
// is not there, and every request is deposed.
const (
	leadCTE = `
WITH lead AS (
    SELECT term, expires_at FROM leader WHERE ` + leaderRow + ` FOR SHARE
),`
	batchAnswer = `
SELECT (SELECT coalesce(array_agg(ord), '{}') FROM applied),
       (SELECT term FROM lead), (SELECT expires_at FROM lead)`
)

// batch is what the board needs of a batch write's requests to answer it.
type batch struct {
	what     string // for errors: "mark", "confirm infra", ...
	attempts []sdk.Attempt
	terms    []int64
	ats      timeArray
	// refusal says why request i did not apply to its row.
	refusal func(i int, row sdk.TaskRow) string
}

// newBatch checks the requests' common fields (attempt, term, time, each
// task instance once) and collects them.
func newBatch[T any](what string, reqs []T, fields func(T) (sdk.Attempt, int64, time.Time), refusal func(int, sdk.TaskRow) string) (*batch, error) {
	b := &batch{what: what, attempts: make([]sdk.Attempt, len(reqs)), terms: make([]int64, len(reqs)),
		ats: make(timeArray, len(reqs)), refusal: refusal}
	seen := make(map[[2]string]bool, len(reqs))
	for i, r := range reqs {
		a, term, at := fields(r)
		switch key := [2]string{a.RunID, a.TaskID}; {
		case a.RunID == "" || a.TaskID == "":
			return nil, fmt.Errorf("%s %s: no run or task id", what, a)
		case term <= 0:
			return nil, fmt.Errorf("%s %s: no leadership term", what, a)
		case at.IsZero():
			return nil, fmt.Errorf("%s %s: no time (At)", what, a)
		case seen[key]:
			return nil, fmt.Errorf("%s %s: task instance named twice in one batch", what, a)
		default:
			seen[key] = true
		}
		b.attempts[i], b.terms[i], b.ats[i] = a, term, at
	}
	return b, nil
}

// attemptArrays returns the batch's attempts as the four arrays every batch
// statement starts with: run ids, task ids, tries, epochs.
func (b *batch) attemptArrays() (runIDs, taskIDs textArray, tries, epochs []int32) {
	n := len(b.attempts)
	runIDs, taskIDs, tries, epochs = make(textArray, n), make(textArray, n), make([]int32, n), make([]int32, n)
	for i, a := range b.attempts {
		runIDs[i], taskIDs[i], tries[i], epochs[i] = a.RunID, a.TaskID, a.Try, a.Epoch
	}
	return runIDs, taskIDs, tries, epochs
}

// runBatch executes the batch's statement (leadCTE ... batchAnswer; the
// leader name is prepended to args) and answers one result per request, in order.
func (s *Store) runBatch(ctx context.Context, b *batch, sql string, args ...any) ([]sdk.MarkResult, error) {
	return s.runBatchScan(ctx, b, sql, args)
}

// runBatchScan is runBatch for a statement whose answer has columns after
// batchAnswer's: they are scanned into extra.
func (s *Store) runBatchScan(ctx context.Context, b *batch, sql string, args []any, extra ...any) ([]sdk.MarkResult, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var (
		applied []int64
		term    *int64
		expires *time.Time
	)
	if err := s.pool.QueryRow(ctx, sql, append([]any{s.fenceKey()}, args...)...).Scan(append([]any{&applied, &term, &expires}, extra...)...); err != nil {
		return nil, fmt.Errorf("board: %s: %w", b.what, err)
	}
	results := make([]sdk.MarkResult, len(b.attempts))
	for i, a := range b.attempts {
		results[i] = sdk.MarkResult{Attempt: a}
	}
	for _, ord := range applied {
		results[ord-1].Applied = true
	}
	var (
		missed []int // requests that did not apply and whose reason needs the row
		fenced []int // requests the fence refused
	)
	for i := range results {
		switch {
		case results[i].Applied:
		case term == nil || *term != b.terms[i] || expires == nil || !expires.After(b.ats[i]):
			results[i].NoopReason = sdk.NoopDeposed
			fenced = append(fenced, i)
		default:
			missed = append(missed, i)
		}
	}
	if len(fenced) > 0 {
		// One refusal for the batch, under its first refused request's
		// term and time.
		as := make([]sdk.Attempt, len(fenced))
		for j, i := range fenced {
			as[j] = b.attempts[i]
		}
		s.refused(ctx, b.what, b.terms[fenced[0]], b.ats[fenced[0]], s.seenHolding(term, expires), as...)
	}
	if len(missed) == 0 {
		return results, nil
	}
	rows, err := s.guardRows(ctx, b.attempts, missed)
	if err != nil {
		return nil, fmt.Errorf("board: %s: %w", b.what, err)
	}
	for j, i := range missed {
		switch {
		case rows[j] == nil:
			results[i].NoopReason = sdk.NoopNotFound
		default:
			// A row that shows nothing wrong changed in between (a
			// concurrent write won the row lock): moved on.
			if results[i].NoopReason = b.refusal(i, *rows[j]); results[i].NoopReason == "" {
				results[i].NoopReason = sdk.NoopMovedOn
			}
		}
	}
	return results, nil
}

// guardRows reads the rows of the requests at the positions missed (a
// second round trip, only when some did not apply): nil for a row that
// does not exist.
func (s *Store) guardRows(ctx context.Context, attempts []sdk.Attempt, missed []int) ([]*sdk.TaskRow, error) {
	runIDs, taskIDs := make([]string, len(missed)), make([]string, len(missed))
	for j, i := range missed {
		runIDs[j], taskIDs[j] = attempts[i].RunID, attempts[i].TaskID
	}
	rows, err := s.pool.Query(ctx, `SELECT m.ord, ti.run_id, ti.task_id, ti.try_number, ti.attempt_epoch, ti.state,
            ti.last_failure_kind, ti.last_heartbeat_at, ti.infra_marked_at, ti.infra_confirmed_at,
            ti.held_at IS NOT NULL, r.state, ti.pod_uid, ti.executor, ti.running_at
        FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS m(run_id, task_id, ord)
        LEFT JOIN task_instances ti ON ti.run_id = m.run_id AND ti.task_id = m.task_id
        LEFT JOIN runs r ON r.run_id = ti.run_id`, runIDs, taskIDs)
	if err != nil {
		return nil, fmt.Errorf("read rows of no-ops: %w", err)
	}
	defer rows.Close()
	out := make([]*sdk.TaskRow, len(missed))
	for rows.Next() {
		var (
			ord                   int64
			runID, taskID, state  *string
			try, epoch            *int32
			kind, runState        *string
			hb, marked, confirmed *time.Time
			held                  *bool
			podUID, executor      *string
			runningAt             *time.Time
		)
		if err := rows.Scan(&ord, &runID, &taskID, &try, &epoch, &state, &kind, &hb, &marked, &confirmed,
			&held, &runState, &podUID, &executor, &runningAt); err != nil {
			return nil, fmt.Errorf("read rows of no-ops: %w", err)
		}
		if state == nil {
			continue
		}
		out[ord-1] = &sdk.TaskRow{
			Attempt: sdk.Attempt{RunID: *runID, TaskID: *taskID, Try: *try, Epoch: *epoch},
			State:   *state, LastFailureKind: deref(kind),
			LastHeartbeatAt: timeOrZero(hb), InfraMarkedAt: timeOrZero(marked), InfraConfirmedAt: timeOrZero(confirmed),
			Held: *held, RunState: deref(runState), PodUID: deref(podUID),
			Executor: deref(executor), RunningAt: timeOrZero(runningAt),
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read rows of no-ops: %w", err)
	}
	return out, nil
}

package board

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/dexaflow/reaper/sdk"
)

// markStates numbers the task instance states for the source-state bits of
// a mark's flags, in the order of the array in markSQL.
var markStates = []string{
	sdk.StateNone, sdk.StateScheduled, sdk.StateQueued, sdk.StateRunning, sdk.StateSuccess, sdk.StateFailed,
	sdk.StateSkipped, sdk.StateUpstreamFailed, sdk.StateUpForRetry, sdk.StateUpForReschedule, sdk.StateDeferred,
}

// The bits of a mark's flags: its kind and options, then one bit per source
// state (markStates[i] is bit flagFirstState+i). Packing them keeps the
// statement's arrays few, which is most of its cost after the row updates.
const (
	flagInfra       = 1 << 0
	flagConfirm     = 1 << 1
	flagHold        = 1 << 2
	flagNoHeartbeat = 1 << 3
	flagFirstState  = 4
)

// markSQL applies a batch of marks in one statement. The batch arrives as
// parallel arrays; the leader row is share-locked so that a takeover waits
// for the batch (and a batch after a takeover sees the new term). It returns
// the ordinals of the marks that applied and the lease as it saw it.
const markSQL = `
WITH lead AS (
    SELECT term, expires_at FROM leader WHERE name = $11 FOR SHARE
),
marked AS (
    UPDATE task_instances ti SET
        state              = 'failed',
        last_failure_kind  = CASE WHEN m.flags & 1 <> 0 THEN 'infra' ELSE 'task' END,
        failure_reason     = m.reason,
        error_message      = m.message,
        ended_at           = m.at,
        infra_marked_at    = CASE WHEN m.flags & 1 <> 0 THEN m.at END,
        infra_confirmed_at = CASE WHEN m.flags & 3 = 3 THEN m.at END,
        held_at            = CASE WHEN m.flags & 4 <> 0 THEN m.at ELSE ti.held_at END,
        updated_at         = m.at
    FROM unnest($1::text[], $2::text[], $3::int4[], $4::int4[], $5::int4[],
                $6::timestamptz[], $7::text[], $8::text[], $9::int8[], $10::timestamptz[])
        WITH ORDINALITY AS m(run_id, task_id, try_number, attempt_epoch, flags,
            heartbeat_before, reason, message, term, at, ord)
    WHERE ti.run_id = m.run_id AND ti.task_id = m.task_id
      AND ti.try_number = m.try_number AND ti.attempt_epoch = m.attempt_epoch
      AND (m.flags >> (3 + array_position(
            '{none,scheduled,queued,running,success,failed,skipped,upstream_failed,up_for_retry,up_for_reschedule,deferred}'::text[],
            ti.state))) & 1 = 1
      AND (m.heartbeat_before IS NULL OR ti.last_heartbeat_at IS NULL
           OR ti.last_heartbeat_at < m.heartbeat_before)
      AND (m.flags & 8 = 0 OR ti.last_heartbeat_at IS NULL)
      AND m.term = (SELECT term FROM lead) AND m.at < (SELECT expires_at FROM lead)
    RETURNING m.ord
)
SELECT (SELECT coalesce(array_agg(ord), '{}') FROM marked),
       (SELECT term FROM lead), (SELECT expires_at FROM lead)`

// Mark applies a batch of guarded marks in one statement (one round trip).
// Each mark applies only while its row holds exactly its attempt, in one of
// its FromStates, with its heartbeat guard satisfied, and while its Term is
// the leader row's term with a lease not expired at its At. A mark that does
// not apply writes nothing and is reported with its reason; that is never an
// error. An error means the batch itself was malformed or the database could
// not be asked, and then nothing was written.
func (s *Store) Mark(ctx context.Context, marks []sdk.Mark) ([]sdk.MarkResult, error) {
	if len(marks) == 0 {
		return nil, nil
	}
	n := len(marks)
	var (
		runIDs, taskIDs, reasons, messages = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		tries, epochs, flags               = make([]int32, n), make([]int32, n), make([]int32, n)
		hbBefore, ats                      = make([]pgtype.Timestamptz, n), make([]time.Time, n)
		terms                              = make([]int64, n)
	)
	seen := make(map[[2]string]bool, n)
	for i, m := range marks {
		if err := validateMark(m); err != nil {
			return nil, fmt.Errorf("board: mark %s: %w", m.Attempt, err)
		}
		key := [2]string{m.RunID, m.TaskID}
		if seen[key] {
			return nil, fmt.Errorf("board: mark %s: task instance named twice in one batch", m.Attempt)
		}
		seen[key] = true
		runIDs[i], taskIDs[i], tries[i], epochs[i] = m.RunID, m.TaskID, m.Try, m.Epoch
		flags[i] = markFlags(m)
		hbBefore[i] = pgtype.Timestamptz{Time: m.HeartbeatBefore, Valid: !m.HeartbeatBefore.IsZero()}
		reasons[i], messages[i], terms[i], ats[i] = m.Reason, m.Message, m.Term, m.At
	}

	ctx, cancel := s.bound(ctx)
	defer cancel()
	var (
		applied []int64
		term    *int64
		expires *time.Time
	)
	err := s.pool.QueryRow(ctx, markSQL, runIDs, taskIDs, tries, epochs, flags,
		hbBefore, reasons, messages, terms, ats, s.leader).
		Scan(&applied, &term, &expires)
	if err != nil {
		return nil, fmt.Errorf("board: mark: %w", err)
	}
	results := make([]sdk.MarkResult, n)
	for i, m := range marks {
		results[i] = sdk.MarkResult{Attempt: m.Attempt}
	}
	for _, ord := range applied {
		results[ord-1].Applied = true
	}
	var missed []int // marks that did not apply and whose reason needs the row
	for i, m := range marks {
		switch {
		case results[i].Applied:
		case term == nil || *term != m.Term || expires == nil || !expires.After(m.At):
			results[i].NoopReason = sdk.NoopDeposed
		default:
			missed = append(missed, i)
		}
	}
	if len(missed) > 0 {
		if err := s.explainNoops(ctx, marks, missed, results); err != nil {
			return nil, fmt.Errorf("board: mark: %w", err)
		}
	}
	return results, nil
}

// explainNoops reads the rows of the marks that did not apply (a second
// round trip, only when some did not) and says why each did not.
func (s *Store) explainNoops(ctx context.Context, marks []sdk.Mark, missed []int, results []sdk.MarkResult) error {
	runIDs, taskIDs := make([]string, len(missed)), make([]string, len(missed))
	for j, i := range missed {
		runIDs[j], taskIDs[j] = marks[i].RunID, marks[i].TaskID
	}
	rows, err := s.pool.Query(ctx, `SELECT m.ord, ti.state, ti.try_number, ti.attempt_epoch, ti.last_heartbeat_at
        FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS m(run_id, task_id, ord)
        LEFT JOIN task_instances ti ON ti.run_id = m.run_id AND ti.task_id = m.task_id`, runIDs, taskIDs)
	if err != nil {
		return fmt.Errorf("read rows of no-op marks: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			ord        int64
			state      *string
			try, epoch *int32
			hb         *time.Time
		)
		if err := rows.Scan(&ord, &state, &try, &epoch, &hb); err != nil {
			return fmt.Errorf("read rows of no-op marks: %w", err)
		}
		i := missed[ord-1]
		results[i].NoopReason = markNoopReason(marks[i], state, try, epoch, hb)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read rows of no-op marks: %w", err)
	}
	return nil
}

// markNoopReason says why a mark under a current term did not apply, from
// its row as read after the statement. When the row shows nothing wrong it
// changed in between (a concurrent write won the row lock): moved on.
func markNoopReason(m sdk.Mark, state *string, try, epoch *int32, hb *time.Time) string {
	switch {
	case state == nil:
		return sdk.NoopNotFound
	case *try != m.Try || *epoch != m.Epoch || !contains(m.FromStates, *state):
		return sdk.NoopMovedOn
	case m.RequireNoHeartbeat && hb != nil:
		return sdk.NoopHeartbeated
	case !m.HeartbeatBefore.IsZero() && hb != nil && !hb.Before(m.HeartbeatBefore):
		return sdk.NoopHeartbeated
	default:
		return sdk.NoopMovedOn
	}
}

// markFlags packs a (validated) mark's kind, options and source states.
func markFlags(m sdk.Mark) int32 {
	var f int32
	if m.Kind == sdk.MarkInfra {
		f |= flagInfra
	}
	if m.Confirm {
		f |= flagConfirm
	}
	if m.Hold {
		f |= flagHold
	}
	if m.RequireNoHeartbeat {
		f |= flagNoHeartbeat
	}
	for _, st := range m.FromStates {
		for i, known := range markStates {
			if st == known {
				f |= 1 << (flagFirstState + i)
			}
		}
	}
	return f
}

func validateMark(m sdk.Mark) error {
	if m.RunID == "" || m.TaskID == "" {
		return fmt.Errorf("no run or task id")
	}
	if len(m.FromStates) == 0 {
		return fmt.Errorf("no source states")
	}
	for _, st := range m.FromStates {
		if !taskStates[st] {
			return fmt.Errorf("unknown source state %q", st)
		}
	}
	if m.Kind != sdk.MarkInfra && m.Kind != sdk.MarkTask {
		return fmt.Errorf("unknown mark kind %q", m.Kind)
	}
	if m.Term <= 0 {
		return fmt.Errorf("no leadership term")
	}
	if m.At.IsZero() {
		return fmt.Errorf("no time (At)")
	}
	return nil
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

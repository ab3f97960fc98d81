package board

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dexaflow/reaper/sdk"
)

// The reconciler's writes (kube): what a sweep does with a provisional infra
// mark once it has read the attempt's pods. Both are guarded on the exact
// attempt and fenced on term like a mark.

// ConfirmInfra confirms the provisional infra mark of attempt a at at: the
// planner may then re-place it. It reports whether it applied: it does not
// when the row moved on, the mark was already confirmed, or term is not
// current.
func (s *Store) ConfirmInfra(ctx context.Context, term int64, a sdk.Attempt, at time.Time) (bool, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	tag, err := s.pool.Exec(ctx, `
WITH lead AS (SELECT term, expires_at FROM leader WHERE name = $1 FOR SHARE)
UPDATE task_instances ti SET infra_confirmed_at = $6, updated_at = $6
FROM lead l
WHERE ti.run_id = $2 AND ti.task_id = $3 AND ti.try_number = $4 AND ti.attempt_epoch = $5
  AND ti.state = 'failed' AND ti.last_failure_kind = 'infra' AND ti.infra_confirmed_at IS NULL
  AND l.term = $7 AND l.expires_at > $6`, s.leader, a.RunID, a.TaskID, a.Try, a.Epoch, at, term)
	if err != nil {
		return false, fmt.Errorf("board: confirm infra mark of %s: %w", a, err)
	}
	return tag.RowsAffected() == 1, nil
}

// OverrideInfraMark settles attempt a as a success over its provisional
// infra mark, because the attempt left a durable SUCCESS record. It applies
// only while the mark is unconfirmed, was made after markedAfter (the valve
// has not opened), and the run is still running; it clears the infra kind
// and appends "outcome recovered from the durable record over <reason>" to
// the attempt's log, in the same statement. It returns the reason of the mark
// it overrode (agent_lost, pod_lost, ...) and whether it applied.
func (s *Store) OverrideInfraMark(ctx context.Context, term int64, a sdk.Attempt, markedAfter, at time.Time) (string, bool, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var reason *string
	err := s.pool.QueryRow(ctx, `
WITH lead AS (SELECT term, expires_at FROM leader WHERE name = $1 FOR SHARE),
prev AS (SELECT failure_reason FROM task_instances WHERE run_id = $2 AND task_id = $3),
settled AS (
    UPDATE task_instances ti SET
        state = 'success', last_failure_kind = NULL, failure_reason = NULL, infra_marked_at = NULL,
        infra_confirmed_at = NULL, error_message = NULL, ended_at = $6, updated_at = $6
    FROM lead l, runs r
    WHERE ti.run_id = $2 AND ti.task_id = $3 AND ti.try_number = $4 AND ti.attempt_epoch = $5
      AND ti.state = 'failed' AND ti.last_failure_kind = 'infra' AND ti.infra_confirmed_at IS NULL
      AND ti.infra_marked_at > $8
      AND r.run_id = ti.run_id AND r.state = 'running'
      AND l.term = $7 AND l.expires_at > $6
    RETURNING ti.run_id, ti.task_id, ti.try_number, ti.attempt_epoch
),
logged AS (
    INSERT INTO attempt_log (run_id, task_id, try_number, attempt_epoch, at, line)
    SELECT run_id, task_id, try_number, attempt_epoch, $6,
        'outcome recovered from the durable record over ' || coalesce(prev.failure_reason, 'an infra mark')
    FROM settled, prev
)
SELECT prev.failure_reason FROM settled, prev`, s.leader, a.RunID, a.TaskID, a.Try, a.Epoch, at, term, markedAfter).Scan(&reason)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("board: override infra mark of %s: %w", a, err)
	}
	return deref(reason), true, nil
}

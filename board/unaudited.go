package board

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dexaflow/reaper/sdk"
)

// MarkReasons are the failure reasons only a reaper's mark writes on a task
// instance (failure_reason): a row failed with one of them was failed by a
// reaper, not by its own agent or by the reconciler. credential_ceiling is
// not one: a warm worker's attempt watchdog reports it too.
var MarkReasons = []string{
	sdk.LabelAgentLost, sdk.LabelDispatchLost, sdk.LabelStartExpired, sdk.LabelPodLost, sdk.LabelWarmWorkerLost,
}

// unauditedMarksSQL finds the writes still visible on the board that no
// applied decision in the audit is about, made from $2 on:
//   - attempts a reaper's mark failed (their failure reason one of $1), the
//     current attempt of a task or one released since (retried or
//     re-placed: attempt_history keeps its reason), decided by any applied
//     decision about the attempt;
//   - attempts the reconciler wrote (reconciled_as, migration 016), current
//     or released, decided only by an applied decision of that label (a
//     confirmation or an override follows a mark on the same attempt, whose
//     decision does not cover it);
//   - runs an orphan reap failed (their error_message starts with the
//     orphan_run label, $3).
//
// A released attempt's row keeps no error message.
const unauditedMarksSQL = `
WITH w AS (
    SELECT ti.run_id, ti.task_id, ti.try_number, ti.attempt_epoch, ti.failure_reason AS label,
           coalesce(ti.error_message, '') AS message, ti.ended_at AS at, false AS reconciled
      FROM task_instances ti
     WHERE ti.state = 'failed' AND ti.failure_reason = ANY ($1::text[]) AND ti.ended_at >= $2
    UNION ALL
    SELECT h.run_id, h.task_id, h.try_number, h.attempt_epoch, h.failure_reason, '', h.ended_at, false
      FROM attempt_history h
     WHERE h.released_at >= $2 AND h.failure_reason = ANY ($1::text[]) AND h.ended_at >= $2
    UNION ALL
    SELECT ti.run_id, ti.task_id, ti.try_number, ti.attempt_epoch, ti.reconciled_as,
           coalesce(ti.error_message, ''), ti.reconciled_at, true
      FROM task_instances ti
     WHERE ti.reconciled_at >= $2
    UNION ALL
    SELECT h.run_id, h.task_id, h.try_number, h.attempt_epoch, h.reconciled_as, '', h.reconciled_at, true
      FROM attempt_history h
     WHERE h.released_at >= $2 AND h.reconciled_at >= $2
)
SELECT w.run_id, w.task_id, w.try_number, w.attempt_epoch, w.label, w.message, w.at, w.reconciled
  FROM w
 WHERE NOT EXISTS (
        SELECT 1 FROM reap_decisions d
         WHERE d.run_id = w.run_id AND d.task_id = w.task_id
           AND d.try_number = w.try_number AND d.attempt_epoch = w.attempt_epoch
           AND d.applied AND (NOT w.reconciled OR d.label = w.label))
UNION ALL
SELECT r.run_id, '', 0, 0, 'orphan_run', coalesce(r.error_message, ''), r.ended_at, false
  FROM runs r
 WHERE r.state = 'failed'
   AND r.error_message LIKE $3
   AND r.ended_at >= $2
   AND NOT EXISTS (
        SELECT 1 FROM reap_decisions d
         WHERE d.run_id = r.run_id AND d.task_id IS NULL AND d.applied)
ORDER BY 1, 2, 3, 4, 8`

// UnauditedMark is a reaper's write the board shows with no applied
// decision about it in the audit.
type UnauditedMark struct {
	sdk.Attempt        // only RunID for a run
	Reason      string // the failure reason a mark left (orphan_run for a run); the label of a reconciler's write
	Message     string // the error message it left (none once the attempt was released)
	At          time.Time
	// Reconciled: the write was the reconciler's (a substrate's sweep), not
	// a reaper's; Reason is its reconcile_* label.
	Reconciled bool
}

// UnauditedMarks checks the rule that every write a reaper or the
// reconciler applied has its decision in the audit. It returns the
// attempts (and, with only RunID set, the runs) that the board shows
// written at or after since by a reaper's mark, an orphan reap or a
// reconciler's write, whose attempt has been released since or not, and
// that no applied decision in the audit covers (unauditedMarksSQL), ordered
// by run, task and attempt. Empty is the rule holding. declared adds
// failure reasons to MarkReasons: the ones the configured plugins' marks
// carry (sdk.Info.MarkReasons), which the caller has checked are not
// reasons anything but a mark writes. The test suites call it at the end
// of a scenario; the host, once a term, to audit what a leader that died
// between its writes and their audit left behind. It reads the current
// rows without an index (the history by its release): a query for a
// check, not for every cycle.
func (s *Store) UnauditedMarks(ctx context.Context, since time.Time, declared ...string) ([]UnauditedMark, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	reasons := slices.Clone(MarkReasons)
	for _, r := range declared {
		if !slices.Contains(reasons, r) {
			reasons = append(reasons, r)
		}
	}
	rows, err := s.pool.Query(ctx, unauditedMarksSQL, reasons, since, sdk.LabelOrphanRun+":%")
	if err != nil {
		return nil, fmt.Errorf("board: find unaudited marks: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (UnauditedMark, error) {
		var m UnauditedMark
		err := row.Scan(&m.RunID, &m.TaskID, &m.Try, &m.Epoch, &m.Reason, &m.Message, &m.At, &m.Reconciled)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("board: find unaudited marks: %w", err)
	}
	return out, nil
}

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

// unauditedMarksSQL finds the reapers' writes still visible on the board
// that no applied decision in the audit is about: task instances whose
// current attempt a mark failed (its reason one of $1), and runs an orphan
// reap failed (their error_message starts with the orphan_run label).
// Writes from $2 on only. An attempt that moved on since its mark (a retry,
// a re-place) no longer shows it, and is not listed.
const unauditedMarksSQL = `
SELECT ti.run_id, ti.task_id, ti.try_number, ti.attempt_epoch,
       ti.failure_reason, coalesce(ti.error_message, ''), ti.ended_at
  FROM task_instances ti
 WHERE ti.state = 'failed'
   AND ti.failure_reason = ANY ($1::text[])
   AND ti.ended_at >= $2
   AND NOT EXISTS (
        SELECT 1 FROM reap_decisions d
         WHERE d.run_id = ti.run_id AND d.task_id = ti.task_id
           AND d.try_number = ti.try_number AND d.attempt_epoch = ti.attempt_epoch
           AND d.applied)
UNION ALL
SELECT r.run_id, '', 0, 0, 'orphan_run', coalesce(r.error_message, ''), r.ended_at
  FROM runs r
 WHERE r.state = 'failed'
   AND r.error_message LIKE $3
   AND r.ended_at >= $2
   AND NOT EXISTS (
        SELECT 1 FROM reap_decisions d
         WHERE d.run_id = r.run_id AND d.task_id IS NULL AND d.applied)
ORDER BY 1, 2`

// UnauditedMark is a reaper's write the board shows with no applied
// decision about it in the audit.
type UnauditedMark struct {
	sdk.Attempt        // only RunID for a run
	Reason      string // the failure reason the write left (orphan_run for a run)
	Message     string // the error message it left
	At          time.Time
}

// UnauditedMarks checks the rule that every write a reaper applied has its
// decision in the audit. It returns the attempts (and, with only RunID
// set, the runs) that the board shows failed by a reaper's write made at or
// after since, and that no applied decision in the audit is about, ordered
// by run and task. Empty is the rule holding. declared adds failure
// reasons to MarkReasons: the ones the configured plugins' marks carry
// (sdk.Info.MarkReasons), which the caller has checked are not reasons
// anything but a mark writes. The test suites call it at
// the end of a scenario; the host, once a term, to audit what a leader
// that died between its writes and their audit left behind. It reads the
// failed rows ended since since (no index serves it): a query for a check,
// not for every cycle.
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
		err := row.Scan(&m.RunID, &m.TaskID, &m.Try, &m.Epoch, &m.Reason, &m.Message, &m.At)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("board: find unaudited marks: %w", err)
	}
	return out, nil
}

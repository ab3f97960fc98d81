package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dexaflow/reaper/sdk"
)

// Release is the answer of a rail.
type Release struct {
	// Applied is true when the attempt was released and a new one begun.
	Applied bool
	// Reason says why not (ReasonMovedOn, ReasonHeld, ...), when not applied.
	Reason string
	// Attempt is the new attempt when applied.
	Attempt sdk.Attempt
	// UnavailableSince is when the task's dispatch outage began
	// (DispatchBackoff; zero for the other rails).
	UnavailableSince time.Time
}

// rail is one way of starting a new execution. The rails below are fixed
// tables, never modified.
type rail struct {
	name    string
	to      string // the state the new attempt starts in
	bumpTry bool   // else the epoch
	// operator: an operator's rail (clear) works on a task of a finished
	// run too, and reopens the run; every other rail starts a new execution
	// only while the task's run is running.
	operator  bool
	guard     string // SQL on ti: which released attempts qualify
	set       string // SQL assignments of this rail, beyond the common ones
	fromState func(state, kind string) bool
}

// clearAttempt is what every rail clears of the attempt it releases.
const clearAttempt = `queued_at = NULL, running_at = NULL, last_heartbeat_at = NULL, ended_at = NULL,
    last_failure_kind = NULL, failure_reason = NULL, error_message = NULL,
    infra_marked_at = NULL, infra_confirmed_at = NULL, warm_worker = NULL, pod_uid = NULL, pod_name = NULL,
    credential_minted_at = NULL, credential_renewed_at = NULL, credential_capped_at = NULL,
    credential_exchanged_at = NULL, max_heartbeat_gap = NULL, pod_created_at = NULL,
    pod_missing_max = NULL, pod_missing_since = NULL, reconciled_as = NULL, reconciled_at = NULL`

var (
	retryRail = rail{
		name: "retry", to: sdk.StateNone, bumpTry: true,
		guard: `(ti.state = 'up_for_retry' OR (ti.state = 'failed' AND ti.last_failure_kind = 'task'))
            AND ti.held_at IS NULL AND ti.retries > 0`,
		set: `retries = ti.retries - 1, dispatch_unavailable_since = NULL`,
		fromState: func(s, k string) bool {
			return s == sdk.StateUpForRetry || (s == sdk.StateFailed && k == sdk.FailureTask)
		},
	}
	clearRail = rail{
		name: "clear", to: sdk.StateNone, bumpTry: true, operator: true,
		guard:     `true`,
		set:       `retries = ti.max_retries, infra_used = 0, held_at = NULL, dispatch_unavailable_since = NULL`,
		fromState: func(string, string) bool { return true },
	}
	replaceRail = rail{
		name: "re-place", to: sdk.StateNone,
		guard: `ti.state = 'failed' AND ti.last_failure_kind = 'infra' AND ti.held_at IS NULL
            AND ti.infra_used < ti.infra_budget`,
		set:       `infra_used = ti.infra_used + 1, dispatch_unavailable_since = NULL`,
		fromState: func(s, k string) bool { return s == sdk.StateFailed && k == sdk.FailureInfra },
	}
	rescheduleRail = rail{
		name: "reschedule", to: sdk.StateNone,
		guard:     `ti.state = 'up_for_reschedule' AND ti.held_at IS NULL`,
		set:       `dispatch_unavailable_since = NULL`,
		fromState: func(s, _ string) bool { return s == sdk.StateUpForReschedule },
	}
	warmRequeueRail = rail{
		name: "warm requeue", to: sdk.StateScheduled,
		guard:     `ti.state IN ('queued', 'running') AND ti.held_at IS NULL`,
		fromState: func(s, _ string) bool { return s == sdk.StateQueued || s == sdk.StateRunning },
	}
	// warmUnstartedRail is the warm requeue of an attempt its worker never
	// started: queued only, so a RUNNING report that lands first keeps the
	// attempt where it runs.
	warmUnstartedRail = rail{
		name: "warm requeue (unstarted)", to: sdk.StateScheduled,
		guard:     `ti.state = 'queued' AND ti.held_at IS NULL`,
		fromState: func(s, _ string) bool { return s == sdk.StateQueued },
	}
	backoffRail = rail{
		name: "dispatch backoff", to: sdk.StateScheduled,
		guard:     `ti.state IN ('scheduled', 'queued') AND ti.held_at IS NULL`,
		set:       `dispatch_unavailable_since = coalesce(ti.dispatch_unavailable_since, $5)`,
		fromState: func(s, _ string) bool { return s == sdk.StateScheduled || s == sdk.StateQueued },
	}
)

// Retry starts the next try of a task that failed with retries left
// (up_for_retry, or failed as a task failure): try+1, one retry spent, back
// to none. The dispatch outage clock starts over.
func (w *Writer) Retry(ctx context.Context, a sdk.Attempt, now time.Time) (Release, error) {
	return w.release(ctx, retryRail, a, now)
}

// Clear is the operator's clear, from any state: try+1, the declared retries
// and the whole infra budget restored, any hold lifted, back to none. A
// clear of a task whose run has finished reopens the run, in the same
// transaction; against the runner finishing the run at the same moment it
// is serialised on the run's row (see FinishSettledRuns), so a clear is
// never lost in a run that finishes behind it.
func (w *Writer) Clear(ctx context.Context, a sdk.Attempt, now time.Time) (Release, error) {
	return w.release(ctx, clearRail, a, now)
}

// Replace re-places an infra failure on the infra budget: epoch+1, one
// re-place spent, retries untouched, back to none. It refuses a held attempt
// and a spent budget. Whether the mark is confirmed (or its valve open) is
// the planner's judgment, made before calling.
func (w *Writer) Replace(ctx context.Context, a sdk.Attempt, now time.Time) (Release, error) {
	return w.release(ctx, replaceRail, a, now)
}

// Reschedule starts the next poke of a reschedule-mode sensor
// (up_for_reschedule): epoch+1, back to none.
func (w *Writer) Reschedule(ctx context.Context, a sdk.Attempt, now time.Time) (Release, error) {
	return w.release(ctx, rescheduleRail, a, now)
}

// WarmRequeue takes a queued or running attempt off its warm worker and
// offers the task again: epoch+1, unbound, back to scheduled.
func (w *Writer) WarmRequeue(ctx context.Context, a sdk.Attempt, now time.Time) (Release, error) {
	return w.release(ctx, warmRequeueRail, a, now)
}

// WarmRequeueUnstarted is WarmRequeue for an attempt its worker never
// started: it applies only while the attempt is still queued, so it can
// never move one that a worker reported running meanwhile (that report
// wins, and the requeue is a no-op, ReasonMovedOn; or the requeue wins,
// and the worker's RUNNING is answered should_terminate).
func (w *Writer) WarmRequeueUnstarted(ctx context.Context, a sdk.Attempt, now time.Time) (Release, error) {
	return w.release(ctx, warmUnstartedRail, a, now)
}

// DispatchBackoff records a dispatch that failed (a pod create refused as
// unavailable, say) and offers the task again under a new epoch, so whatever
// the failed dispatch may have started is told to stop: epoch+1, back to
// scheduled. It starts the task's outage clock if it is not running and
// returns it (Release.UnavailableSince), so the caller can give up once it
// has run long enough (see Fail with Terminal).
func (w *Writer) DispatchBackoff(ctx context.Context, a sdk.Attempt, now time.Time) (Release, error) {
	return w.release(ctx, backoffRail, a, now)
}

// runRunning is the guard of the automatic rails: the task's run is
// running (a finished run starts nothing new).
const runRunning = `EXISTS (SELECT 1 FROM runs r WHERE r.run_id = ti.run_id AND r.state = 'running')`

func (w *Writer) release(ctx context.Context, rl rail, a sdk.Attempt, now time.Time) (Release, error) {
	// A new try starts its sensor bounds over; a new epoch of the same try
	// (a reschedule's next poke, a re-place) keeps them.
	bump := "try_number = ti.try_number + 1, first_poke_at = NULL, try_dispatched_at = NULL"
	if !rl.bumpTry {
		bump = "attempt_epoch = ti.attempt_epoch + 1"
	}
	set := ""
	if rl.set != "" {
		set = rl.set + ", "
	}
	guard := rl.guard
	if !rl.operator {
		guard += " AND " + runRunning
	}
	fence, fenceArgs := w.fence(6, now)
	sql := `UPDATE task_instances ti SET state = '` + rl.to + `', ` + bump + `, ` + clearAttempt + `,
        ` + set + `released_at = $5, updated_at = $5
    WHERE ti.run_id = $1 AND ti.task_id = $2 AND ti.try_number = $3 AND ti.attempt_epoch = $4
      AND ` + guard + `
      AND ` + fence + `
    RETURNING ti.try_number, ti.attempt_epoch, ti.dispatch_unavailable_since`
	ctx, cancel := w.bound(ctx)
	defer cancel()
	var (
		next  = sdk.Attempt{RunID: a.RunID, TaskID: a.TaskID}
		since *time.Time
	)
	err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if rl.operator {
			// Take the run's row first: a runner finishing the run waits
			// for this clear, or this clear for it (see reopen).
			if _, err := tx.Exec(ctx, `SELECT 1 FROM runs WHERE run_id = $1 FOR UPDATE`, a.RunID); err != nil {
				return err
			}
		}
		args := append([]any{a.RunID, a.TaskID, a.Try, a.Epoch, now}, fenceArgs...)
		if err := tx.QueryRow(ctx, sql, args...).Scan(&next.Try, &next.Epoch, &since); err != nil {
			return err
		}
		if rl.operator {
			return reopen(ctx, tx, a.RunID, now)
		}
		return nil
	})
	if err == nil {
		r := Release{Applied: true, Attempt: next}
		if rl.name == backoffRail.name && since != nil {
			r.UnavailableSince = *since
		}
		return r, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return Release{}, fmt.Errorf("board: %s %s: %w", rl.name, a, err)
	}
	if err := w.deposed(ctx, rl.name, now, a); err != nil {
		return Release{}, fmt.Errorf("board: %s %s: %w", rl.name, a, err)
	}
	reason, err := w.whyNot(ctx, rl, a)
	if err != nil {
		return Release{}, fmt.Errorf("board: %s %s: %w", rl.name, a, err)
	}
	return Release{Reason: reason}, nil
}

// reopen makes the run of a task an operator cleared run again: a finished
// run is running once more (its task instances back among the orphan-run
// candidates); a running one gets a new row version, which tells a runner
// that read the run before the clear not to finish it (FinishSettledRuns
// compares the version it read).
func reopen(ctx context.Context, tx pgx.Tx, runID string, now time.Time) error {
	var reopened bool
	err := tx.QueryRow(ctx, `UPDATE runs SET
        state = CASE WHEN state IN ('success', 'failed') THEN 'running' ELSE state END,
        ended_at = CASE WHEN state IN ('success', 'failed') THEN NULL ELSE ended_at END,
        error_message = CASE WHEN state IN ('success', 'failed') THEN NULL ELSE error_message END,
        updated_at = $2
    WHERE run_id = $1
    RETURNING ended_at IS NULL AND state = 'running'`, runID, now).Scan(&reopened)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reopen run %s: %w", runID, err)
	}
	_, err = tx.Exec(ctx, `UPDATE task_instances SET run_closed = false WHERE run_id = $1 AND run_closed`, runID)
	if err != nil {
		return fmt.Errorf("reopen run %s: %w", runID, err)
	}
	return nil
}

// whyNot reads the row a rail did not apply to and says why.
func (w *Writer) whyNot(ctx context.Context, rl rail, a sdk.Attempt) (string, error) {
	var (
		try, epoch, retries, used, budget int32
		state, runState                   string
		kind                              *string
		held                              *time.Time
	)
	err := w.pool.QueryRow(ctx, `SELECT ti.try_number, ti.attempt_epoch, ti.state, ti.last_failure_kind, ti.held_at,
            ti.retries, ti.infra_used, ti.infra_budget, r.state
        FROM task_instances ti JOIN runs r ON r.run_id = ti.run_id
        WHERE ti.run_id = $1 AND ti.task_id = $2`, a.RunID, a.TaskID).
		Scan(&try, &epoch, &state, &kind, &held, &retries, &used, &budget, &runState)
	if errors.Is(err, pgx.ErrNoRows) {
		return ReasonNotFound, nil
	}
	if err != nil {
		return "", err
	}
	k := ""
	if kind != nil {
		k = *kind
	}
	switch {
	case try != a.Try || epoch != a.Epoch || !rl.fromState(state, k):
		return ReasonMovedOn, nil
	case !rl.operator && runState != sdk.RunRunning:
		return ReasonRunNotRunning, nil
	case held != nil && !rl.operator:
		return ReasonHeld, nil
	case rl.name == retryRail.name && retries <= 0:
		return ReasonNoRetries, nil
	case rl.name == replaceRail.name && used >= budget:
		return ReasonBudgetSpent, nil
	default:
		return ReasonMovedOn, nil // it changed between the update and this read
	}
}

// ReleaseHold lifts an operator hold from the attempt, so the rails may
// re-place it again, and in the same transaction appends a line to its try
// log and an operator_release decision to the audit, both naming the
// operator (CheckOperator). It reports whether the attempt was held; when
// it was not, nothing is written.
func (w *Writer) ReleaseHold(ctx context.Context, a sdk.Attempt, operator string, now time.Time) (bool, error) {
	if err := CheckOperator(operator); err != nil {
		return false, fmt.Errorf("board: release hold of %s: %w", a, err)
	}
	ctx, cancel := w.bound(ctx)
	defer cancel()
	released := false
	err := pgx.BeginTxFunc(ctx, w.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE task_instances SET held_at = NULL, updated_at = $5
            WHERE run_id = $1 AND task_id = $2 AND try_number = $3 AND attempt_epoch = $4 AND held_at IS NOT NULL`,
			a.RunID, a.TaskID, a.Try, a.Epoch, now)
		if err != nil || tag.RowsAffected() != 1 {
			return err
		}
		released = true
		if _, err := tx.Exec(ctx, `INSERT INTO attempt_log (run_id, task_id, try_number, attempt_epoch, at, line)
            VALUES ($1, $2, $3, $4, $5, $6)`, a.RunID, a.TaskID, a.Try, a.Epoch, now,
			"hold released by operator "+operator); err != nil {
			return err
		}
		return auditOperator(ctx, tx, now, w.holder, sdk.Decision{Reaper: OperatorReaper, Label: sdk.LabelOperatorRelease,
			Attempt: a, Applied: true, Detail: fmt.Sprintf("operator %s released the hold", operator),
			Evidence: map[string]string{"operator": operator}})
	})
	if err != nil {
		return false, fmt.Errorf("board: release hold of %s: %w", a, err)
	}
	return released, nil
}

// auditOperator writes an operator's decision to the audit (term 0: an
// operator's write is not fenced), in the operator's transaction.
func auditOperator(ctx context.Context, tx pgx.Tx, now time.Time, holder string, d sdk.Decision) error {
	ev, err := json.Marshal(d.Evidence)
	if err != nil {
		return err
	}
	var task, try, epoch any // NULL for a decision about a run
	if d.Attempt.TaskID != "" {
		task, try, epoch = d.Attempt.TaskID, d.Attempt.Try, d.Attempt.Epoch
	}
	_, err = tx.Exec(ctx, `INSERT INTO reap_decisions (at, term, reaper, label, run_id, task_id, try_number,
            attempt_epoch, applied, dry_run, detail, evidence, holder)
        VALUES ($1, 0, $2, $3, $4, $5, $6, $7, $8, false, $9, $10::jsonb, nullif($11, ''))`,
		now, d.Reaper, d.Label, d.Attempt.RunID, task, try, epoch, d.Applied, d.Detail, string(ev), holder)
	return err
}

package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dexaflow/reaper/sdk"
)

// The operator's verdict (reaperctl mark): a person who knows what an
// attempt did says so, and the board takes it as settled. It is the
// specification's mark-state action: a verdict, not a guess, so it clears
// the infra kind and neither the planner's infra re-place nor the
// reconciler's durable-SUCCESS override (both read only provisional or
// infra failures) touches the task afterwards.

// OperatorReaper is the name in the Reaper column of an operator's
// decisions in the audit.
const OperatorReaper = "reaperctl"

// MarkFrom lists the states an operator may mark an attempt from, to either
// verdict: every state of an attempt that is not settled by an outcome of
// its own (a success, a skip, an upstream failure). A failed attempt is
// among them: a provisional infra mark, a confirmed one waiting for its
// re-place, a task failure with retries left. A success, a skip or an
// upstream failure is changed only by a clear.
var MarkFrom = []string{
	sdk.StateNone, sdk.StateScheduled, sdk.StateQueued, sdk.StateRunning, sdk.StateFailed,
	sdk.StateUpForRetry, sdk.StateUpForReschedule, sdk.StateDeferred,
}

// CanMark reports whether an attempt in state may be marked (see MarkFrom).
func CanMark(state string) bool { return slices.Contains(MarkFrom, state) }

// OperatorNameMax bounds an operator's name, in bytes.
const OperatorNameMax = 64

// Verdict is what an operator marks an attempt.
type Verdict struct {
	// State is sdk.StateFailed or sdk.StateSuccess.
	State string
	// Operator names who marked it: printable, no spaces, at most
	// OperatorNameMax bytes.
	Operator string
}

// Marked is the answer of MarkState.
type Marked struct {
	// Applied is true when the verdict was written.
	Applied bool
	// Reason says why not: ReasonMovedOn (another try, epoch or state than
	// the one read), ReasonNotFound, ReasonRunNotRunning.
	Reason string
	// Decision is the operator_mark decision written to the audit (Applied
	// only).
	Decision sdk.Decision
}

// OperatorMessage is the error_message an operator's verdict leaves.
func OperatorMessage(v Verdict) string {
	return fmt.Sprintf("%s: marked %s by operator %s", sdk.LabelOperatorMark, v.State, v.Operator)
}

// markSQL writes the verdict on exactly the attempt read ($1-$4) in the
// state it was read in ($5), on a running run. A failed verdict spends the
// retries left, so no retry rail starts it again: the verdict is final
// until a clear, which restores them.
const markSQL = `UPDATE task_instances ti SET
        state = $6, ended_at = $7, updated_at = $7,
        last_failure_kind = NULL,
        failure_reason = CASE WHEN $6 = 'failed' THEN $8 END,
        error_message = $9,
        infra_marked_at = NULL, infra_confirmed_at = NULL,
        retries = CASE WHEN $6 = 'failed' THEN 0 ELSE ti.retries END,
        held_at = NULL
    FROM runs r
    WHERE -- the row still holds exactly the attempt the operator read,
          ti.run_id = $1 AND ti.task_id = $2 AND ti.try_number = $3 AND ti.attempt_epoch = $4
          -- in the state it was read in, one an operator may mark,
      AND ti.state = $5 AND ti.state = ANY ($10::text[])
          -- on a run that is still running.
      AND r.run_id = ti.run_id AND r.state = 'running'
    RETURNING ti.state`

// MarkState writes an operator's verdict on the attempt a, which the
// operator read in state seen: the task instance becomes v.State, ended
// now, with no failure kind (so not an infra failure), no infra mark and
// no hold, and an error message naming the operator (OperatorMessage); a
// failed verdict also spends the retries left. In the same transaction a
// line is appended to the attempt's try log and an operator_mark decision
// to the audit, with the operator, the verdict and what the row held in its
// evidence. The run's row is locked and given a new version first, so a
// runner finishing the run at the same moment either finishes it after the
// verdict or leaves it for its next tick (see FinishSettledRuns).
//
// It applies only while the row holds exactly a in state seen (else
// ReasonMovedOn) and the run is running (else ReasonRunNotRunning). It is an
// operator's write: not fenced by a leadership term.
//
// A queued or running attempt's execution is not stopped here: its agent's
// next RUNNING report, heartbeat or terminal report no longer matches the
// row and is answered should_terminate (see Running, Heartbeat, Report).
func (w *Writer) MarkState(ctx context.Context, a sdk.Attempt, seen string, v Verdict, now time.Time) (Marked, error) {
	if err := v.check(); err != nil {
		return Marked{}, fmt.Errorf("board: mark %s: %w", a, err)
	}
	if !CanMark(seen) {
		return Marked{}, fmt.Errorf("board: mark %s: an attempt in state %s is not marked (only %s)",
			a, seen, strings.Join(MarkFrom, ", "))
	}
	var prev struct {
		kind, reason, message string
		marked, confirmed     *time.Time
		held                  *time.Time
		retries               int32
	}
	dec := sdk.Decision{
		Reaper: OperatorReaper, Label: sdk.LabelOperatorMark, Attempt: a, Applied: true,
		Detail: fmt.Sprintf("operator %s marked the attempt %s (was %s)", v.Operator, v.State, seen),
	}
	line := fmt.Sprintf("marked %s by operator %s (was %s)", v.State, v.Operator, seen)
	ctx, cancel := w.bound(ctx)
	defer cancel()
	err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		// The run first, as a clear takes it: a runner finishing the run
		// waits for the verdict, or the verdict for it.
		var running bool
		err := tx.QueryRow(ctx, `UPDATE runs SET updated_at = GREATEST(updated_at, $2)
            WHERE run_id = $1 RETURNING state = 'running'`, a.RunID, now).Scan(&running)
		if err != nil {
			return err
		}
		if !running {
			return pgx.ErrNoRows
		}
		// What the verdict replaces, for the log and the audit.
		err = tx.QueryRow(ctx, `SELECT coalesce(last_failure_kind, ''), coalesce(failure_reason, ''),
                coalesce(error_message, ''), infra_marked_at, infra_confirmed_at, held_at, retries
            FROM task_instances
            WHERE run_id = $1 AND task_id = $2 AND try_number = $3 AND attempt_epoch = $4 AND state = $5
            FOR UPDATE`, a.RunID, a.TaskID, a.Try, a.Epoch, seen).
			Scan(&prev.kind, &prev.reason, &prev.message, &prev.marked, &prev.confirmed, &prev.held, &prev.retries)
		if err != nil {
			return err
		}
		var state string
		if err := tx.QueryRow(ctx, markSQL, a.RunID, a.TaskID, a.Try, a.Epoch, seen, v.State, now,
			sdk.LabelOperatorMark, OperatorMessage(v), MarkFrom).Scan(&state); err != nil {
			return err
		}
		dec.Evidence = markEvidence(seen, v, prev.kind, prev.reason, prev.marked, prev.confirmed, prev.held, prev.retries)
		if prev.kind != "" {
			line += ", " + prev.kind + " failure"
			if prev.reason != "" {
				line += " " + prev.reason
			}
			if m := dec.Evidence["infra_mark"]; m != "" {
				line += ", " + m
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO attempt_log (run_id, task_id, try_number, attempt_epoch, at, line)
            VALUES ($1, $2, $3, $4, $5, $6)`, a.RunID, a.TaskID, a.Try, a.Epoch, now, line); err != nil {
			return err
		}
		ev, err := json.Marshal(dec.Evidence)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO reap_decisions (at, term, reaper, label, run_id, task_id, try_number,
                attempt_epoch, applied, dry_run, detail, evidence, holder)
            VALUES ($1, 0, $2, $3, $4, $5, $6, $7, true, false, $8, $9::jsonb, nullif($10, ''))`,
			now, dec.Reaper, dec.Label, a.RunID, a.TaskID, a.Try, a.Epoch, dec.Detail, string(ev), w.holder)
		return err
	})
	if err == nil {
		return Marked{Applied: true, Decision: dec}, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return Marked{}, fmt.Errorf("board: mark %s %s: %w", a, v.State, err)
	}
	reason, err := w.whyNotMarked(ctx, a, seen)
	if err != nil {
		return Marked{}, fmt.Errorf("board: mark %s %s: %w", a, v.State, err)
	}
	return Marked{Reason: reason}, nil
}

func (v Verdict) check() error {
	if v.State != sdk.StateFailed && v.State != sdk.StateSuccess {
		return fmt.Errorf("an attempt is marked failed or success, not %q", v.State)
	}
	return CheckOperator(v.Operator)
}

// CheckOperator checks an operator's name: 1 to OperatorNameMax bytes of
// printable ASCII without spaces (a login name, an e-mail address).
func CheckOperator(name string) error {
	if name == "" {
		return errors.New("no operator named")
	}
	if len(name) > OperatorNameMax {
		return fmt.Errorf("operator name of %d bytes: at most %d", len(name), OperatorNameMax)
	}
	for _, c := range []byte(name) {
		if c <= ' ' || c > '~' {
			return fmt.Errorf("operator name %q: printable ASCII without spaces only", name)
		}
	}
	return nil
}

// markEvidence is the evidence of an operator_mark decision: the verdict,
// who gave it, and what the row held before it.
func markEvidence(seen string, v Verdict, kind, reason string, marked, confirmed, held *time.Time, retries int32) map[string]string {
	ev := map[string]string{
		"operator": v.Operator,
		"verdict":  v.State,
		"state":    seen,
	}
	if kind != "" {
		ev["failure_kind"] = kind
	}
	if reason != "" {
		ev["failure"] = reason
	}
	if kind == sdk.FailureInfra {
		switch {
		case confirmed != nil:
			ev["infra_mark"] = "confirmed"
		case marked != nil:
			ev["infra_mark"] = "provisional"
		}
	}
	if held != nil {
		ev["hold"] = "lifted"
	}
	if v.State == sdk.StateFailed && retries > 0 {
		ev["retries_spent"] = fmt.Sprint(retries)
	}
	return ev
}

// whyNotMarked reads the row a verdict did not apply to and says why.
func (w *Writer) whyNotMarked(ctx context.Context, a sdk.Attempt, seen string) (string, error) {
	var (
		try, epoch      int32
		state, runState string
	)
	err := w.pool.QueryRow(ctx, `SELECT ti.try_number, ti.attempt_epoch, ti.state, r.state
        FROM task_instances ti JOIN runs r ON r.run_id = ti.run_id
        WHERE ti.run_id = $1 AND ti.task_id = $2`, a.RunID, a.TaskID).Scan(&try, &epoch, &state, &runState)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return ReasonNotFound, nil
	case err != nil:
		return "", err
	case runState != sdk.RunRunning:
		return ReasonRunNotRunning, nil
	case try != a.Try || epoch != a.Epoch || state != seen:
		return ReasonMovedOn, nil
	}
	return ReasonMovedOn, nil // it changed between the write and this read
}

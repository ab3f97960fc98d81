package board

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/dexaflow/reaper/sdk"
)

// markSQL applies a batch of marks in one statement. The batch arrives as
// parallel arrays, one element per mark; the leader row is share-locked so
// that a takeover waits for the batch (and a batch after a takeover sees the
// new term). It returns the ordinals of the marks that applied and the lease
// as it saw it.
//
// This is the statement that must never fail a live attempt. Its WHERE
// clause is the rule, one condition per line.
const markSQL = leadCTE + `
r AS (
    SELECT * FROM unnest($2::text[], $3::text[], $4::int4[], $5::int4[],
                         $6::text[], $7::timestamptz[], $8::bool[],
                         $9::text[], $10::bool[], $11::bool[], $12::text[], $13::text[],
                         $14::int8[], $15::timestamptz[])
        WITH ORDINALITY AS r(run_id, task_id, try_number, attempt_epoch,
                             from_states, heartbeat_before, require_no_heartbeat,
                             kind, confirm, hold, reason, message,
                             term, at, ord)
),
applied AS (
    UPDATE task_instances ti SET
        state              = 'failed',
        last_failure_kind  = r.kind,
        failure_reason     = r.reason,
        error_message      = r.message,
        ended_at           = r.at,
        infra_marked_at    = CASE WHEN r.kind = 'infra' THEN r.at END,
        infra_confirmed_at = CASE WHEN r.kind = 'infra' AND r.confirm THEN r.at END,
        held_at            = CASE WHEN r.hold THEN r.at ELSE ti.held_at END,
        updated_at         = r.at
    FROM r
    WHERE -- the row still holds exactly the attempt the reaper judged,
          ` + sameAttempt + `
          -- in one of the states the mark may move it from (from_states is
          -- the mark's list, comma-separated),
      AND ti.state = ANY (string_to_array(r.from_states, ','))
          -- and one a mark of its kind may come from at all: the board's
          -- list, never a terminal state, whatever the mark asks,
      AND ti.state = ANY (CASE r.kind WHEN 'infra' THEN $16::text[] ELSE $17::text[] END)
          -- on a run that is still running,
      AND EXISTS (SELECT 1 FROM runs WHERE runs.run_id = ti.run_id AND runs.state = 'running')
          -- it has not heartbeated since the reaper's threshold,
      AND (r.heartbeat_before IS NULL OR ti.last_heartbeat_at IS NULL
           OR ti.last_heartbeat_at < r.heartbeat_before)
          -- nor at all when the mark is for an attempt that never heartbeated,
      AND (NOT r.require_no_heartbeat OR ti.last_heartbeat_at IS NULL)
          -- and the mark's term still leads, its lease unexpired when marked.
      AND ` + fenced + `
    RETURNING r.ord
)` + batchAnswer

// Mark applies a batch of guarded marks in one statement (one round trip).
// Each mark applies only while its row holds exactly its attempt, in one of
// its FromStates, with its heartbeat guard satisfied, on a running run
// (else NoopRunFinished), and while its Term is the leader row's term with
// a lease not expired at its At. A mark that names a source state its kind
// may not come from (sdk.MarkSourceStates) is refused whole, whatever its
// row holds: NoopSourceRefused. A mark that does
// not apply writes nothing and is reported with its reason; that is never an
// error. The reason and message are made safe first (Safe); a batch that
// PostgreSQL refuses for one mark's data is written mark by mark, and that
// mark is answered NoopRowRefused. An error means the batch itself was
// malformed or the database could not be asked, and then nothing was
// written.
func (s *Store) Mark(ctx context.Context, marks []sdk.Mark) ([]sdk.MarkResult, error) {
	if len(marks) == 0 {
		return nil, nil
	}
	// A malformed batch is an error before anything is written.
	if _, err := newBatch("mark", marks, markFields, nil); err != nil {
		return nil, fmt.Errorf("board: %w", err)
	}
	for _, m := range marks {
		if err := validateMark(m); err != nil {
			return nil, fmt.Errorf("board: mark %s: %w", m.Attempt, err)
		}
	}
	marks = safeEach(marks, func(m *sdk.Mark) [2]*string { return [2]*string{&m.Reason, &m.Message} },
		s.observer, FieldReason, FieldMessage)
	return rowByRow(ctx, s.observer, "mark", marks, func(m sdk.Mark) sdk.Attempt { return m.Attempt }, s.mark)
}

func markFields(m sdk.Mark) (sdk.Attempt, int64, time.Time) { return m.Attempt, m.Term, m.At }

// mark writes a batch of valid marks, their text made safe, in one
// statement.
func (s *Store) mark(ctx context.Context, marks []sdk.Mark) ([]sdk.MarkResult, error) {
	b, err := newBatch("mark", marks, markFields, func(i int, row sdk.TaskRow) string { return marks[i].Refusal(row) })
	if err != nil {
		return nil, fmt.Errorf("board: %w", err)
	}
	n := len(marks)
	var (
		fromStates, kinds, reasons, messages = make(textArray, n), make(textArray, n), make(textArray, n), make(textArray, n)
		noHeartbeat, confirm, hold           = make([]bool, n), make([]bool, n), make([]bool, n)
		hbBefore                             = make(nullTimeArray, n)
	)
	for i, m := range marks {
		if !m.SourceRefused() { // a refused mark matches no row
			fromStates[i] = strings.Join(m.FromStates, ",")
		}
		hbBefore[i] = pgtype.Timestamptz{Time: m.HeartbeatBefore, Valid: !m.HeartbeatBefore.IsZero()}
		noHeartbeat[i], confirm[i], hold[i] = m.RequireNoHeartbeat, m.Confirm, m.Hold
		kinds[i], reasons[i], messages[i] = string(m.Kind), m.Reason, m.Message
	}
	runIDs, taskIDs, tries, epochs := b.attemptArrays()
	return s.runBatch(ctx, b, markSQL, runIDs, taskIDs, tries, epochs,
		fromStates, hbBefore, noHeartbeat, kinds, confirm, hold, reasons, messages, b.terms, b.ats,
		sdk.MarkSourceStates(sdk.MarkInfra), sdk.MarkSourceStates(sdk.MarkTask))
}

func validateMark(m sdk.Mark) error {
	if err := validateStates(m.FromStates); err != nil {
		return err
	}
	if m.Kind != sdk.MarkInfra && m.Kind != sdk.MarkTask {
		return fmt.Errorf("unknown mark kind %q", m.Kind)
	}
	return nil
}

// validateStates checks a request's source states: at least one, each a
// task instance state (they travel comma-separated).
func validateStates(states []string) error {
	if len(states) == 0 {
		return fmt.Errorf("no source states")
	}
	for _, st := range states {
		if !taskStates[st] {
			return fmt.Errorf("unknown source state %q", st)
		}
	}
	return nil
}

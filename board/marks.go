package board

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/dexaflow/reaper/sdk"
)

// markSQL applies a batch of marks in one statement. The batch arrives as
// parallel arrays, one element per mark, and the term and the time the
// marks share as two values ($14, $15: a pass marks under one term at one
// time, so they travel once, not once per mark); the leader row is
// share-locked so that a takeover waits for the batch (and a batch after a
// takeover sees the new term). It returns the ordinals of the marks that
// applied and the lease as it saw it.
//
// This is the statement that must never fail a live attempt. Its WHERE
// clause is the rule, one condition per line.
const markSQL = leadCTE + `
r AS (
    SELECT u.*, $14::int8 AS term, $15::timestamptz AS at
    FROM unnest($2::text[], $3::text[], $4::int4[], $5::int4[],
                $6::text[], $7::timestamptz[], $8::bool[],
                $9::text[], $10::bool[], $11::bool[], $12::text[], $13::text[])
        WITH ORDINALITY AS u(run_id, task_id, try_number, attempt_epoch,
                             from_states, heartbeat_before, require_no_heartbeat,
                             kind, confirm, hold, reason, message, ord)
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
          -- it has not heartbeated since the reaper's threshold,
      AND (r.heartbeat_before IS NULL OR ti.last_heartbeat_at IS NULL
           OR ti.last_heartbeat_at < r.heartbeat_before)
          -- nor at all when the mark is for an attempt that never heartbeated,
      AND (NOT r.require_no_heartbeat OR ti.last_heartbeat_at IS NULL)
          -- and the mark's term still leads, its lease unexpired when marked.
      AND ` + fenced + `
    RETURNING r.ord
)` + batchAnswer

// markSettings are set for a mark statement's own transaction. A batch is a
// large share of a small table at times (a thousand marks over ten thousand
// rows), and the planner, which knows how many marks it holds, then hashes
// the whole table to join them; each mark is one primary-key probe whatever
// the table's size, so the joins other than a nested loop are off.
const markSettings = "SELECT set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)"

// Mark applies a batch of guarded marks. Each mark applies only while its
// row holds exactly its attempt, in one of its FromStates, with its
// heartbeat guard satisfied, and while its Term is the leader row's term
// with a lease not expired at its At. A mark that does not apply writes
// nothing and is reported with its reason; that is never an error. An error
// means the batch itself was malformed or the database could not be asked,
// and then nothing was written.
//
// Marks that share a term and a time (every mark of one pass) are one
// statement, one round trip. A batch that mixes terms or times is one
// statement per (term, time), in one transaction.
func (s *Store) Mark(ctx context.Context, marks []sdk.Mark) ([]sdk.MarkResult, error) {
	if len(marks) == 0 {
		return nil, nil
	}
	for _, m := range marks {
		if err := validateMark(m); err != nil {
			return nil, fmt.Errorf("board: mark %s: %w", m.Attempt, err)
		}
	}
	b, err := newBatch("mark", marks, func(m sdk.Mark) (sdk.Attempt, int64, time.Time) { return m.Attempt, m.Term, m.At },
		func(i int, row sdk.TaskRow) string { return marks[i].Refusal(row) })
	if err != nil {
		return nil, fmt.Errorf("board: %w", err)
	}
	b.settings = markSettings
	groups := fenceGroups(marks)
	if len(groups) == 1 {
		return s.markGroup(ctx, s.pool, b, marks)
	}
	results := make([]sdk.MarkResult, len(marks))
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		for _, idx := range groups {
			group := make([]sdk.Mark, len(idx))
			for j, i := range idx {
				group[j] = marks[i]
			}
			gb := b.subset(idx, func(j int, row sdk.TaskRow) string { return group[j].Refusal(row) })
			res, err := s.markGroup(ctx, tx, gb, group)
			if err != nil {
				return err
			}
			for j, i := range idx {
				results[i] = res[j]
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("board: mark: %w", err)
	}
	return results, nil
}

// fenceGroups splits a batch of marks by (term, time), each group in the
// batch's order: the positions of its marks.
func fenceGroups(marks []sdk.Mark) [][]int {
	type fence struct {
		term int64
		at   time.Time
	}
	var (
		order []fence
		byKey = map[fence][]int{}
	)
	for i, m := range marks {
		k := fence{m.Term, m.At.UTC()}
		if _, ok := byKey[k]; !ok {
			order = append(order, k)
		}
		byKey[k] = append(byKey[k], i)
	}
	out := make([][]int, len(order))
	for i, k := range order {
		out[i] = byKey[k]
	}
	return out
}

// markGroup runs markSQL on q for marks that share one term and one time
// (b is their batch).
func (s *Store) markGroup(ctx context.Context, q querier, b *batch, marks []sdk.Mark) ([]sdk.MarkResult, error) {
	n := len(marks)
	var (
		fromStates, kinds, reasons, messages = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		noHeartbeat, confirm, hold           = make([]bool, n), make([]bool, n), make([]bool, n)
		hbBefore                             = make([]pgtype.Timestamptz, n)
	)
	for i, m := range marks {
		fromStates[i] = strings.Join(m.FromStates, ",")
		hbBefore[i] = pgtype.Timestamptz{Time: m.HeartbeatBefore, Valid: !m.HeartbeatBefore.IsZero()}
		noHeartbeat[i], confirm[i], hold[i] = m.RequireNoHeartbeat, m.Confirm, m.Hold
		kinds[i], reasons[i], messages[i] = string(m.Kind), m.Reason, m.Message
	}
	runIDs, taskIDs, tries, epochs := b.attemptArrays()
	return s.runBatchOn(ctx, q, b, markSQL, runIDs, taskIDs, tries, epochs,
		fromStates, hbBefore, noHeartbeat, kinds, confirm, hold, reasons, messages, marks[0].Term, marks[0].At)
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

package board

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// The reconciler's writes (a substrate's sweep, kube): what it does with a
// provisional infra mark once it has read the attempt's pods, and how it
// settles a finished attempt from its outcome record. Each is a guarded
// batch fenced on the term, like a mark.

// ListProvisional returns one page of provisional infra marks (failed on
// the infra rail, infra_confirmed_at NULL) of q.Executors (all when
// empty), oldest mark first by (infra_marked_at, run, task), after q.After.
// Next is set only when the page is full.
func (s *Store) ListProvisional(ctx context.Context, q sdk.ProvisionalQuery) (sdk.CandidatePage, error) {
	limit := ladder.ListLimit(q.Limit)
	execFilter, err := executorFilter(q.Executors)
	if err != nil {
		return sdk.CandidatePage{}, fmt.Errorf("board: list provisional marks: %w", err)
	}
	var args []any
	after := ""
	if q.After != nil {
		args = append(args, q.After.At, q.After.RunID, q.After.TaskID)
		after = " AND (infra_marked_at, run_id, task_id) > ($1::timestamptz, $2::text, $3::text)"
	}
	// infra_marked_at IS NOT NULL matches the partial index of marks.
	sql := "SELECT " + candidateColumns + " FROM task_instances ti WHERE " + provisionalTI +
		" AND infra_marked_at IS NOT NULL" + execFilter + after +
		" ORDER BY infra_marked_at, run_id, task_id LIMIT " + strconv.Itoa(limit)
	page, err := s.candidatePage(ctx, sql, args, limit, func(c sdk.Candidate) time.Time { return c.InfraMarkedAt })
	if err != nil {
		return sdk.CandidatePage{}, fmt.Errorf("board: list provisional marks: %w", err)
	}
	return page, nil
}

// confirmSQL confirms a batch of provisional infra marks.
const confirmSQL = leadCTE + `
r AS (
    SELECT * FROM unnest($2::text[], $3::text[], $4::int4[], $5::int4[], $6::int8[], $7::timestamptz[])
        WITH ORDINALITY AS r(run_id, task_id, try_number, attempt_epoch, term, at, ord)
),
applied AS (
    UPDATE task_instances ti SET infra_confirmed_at = r.at, updated_at = r.at
    FROM r
    WHERE -- the row still holds exactly the attempt whose pods were read,
          ` + sameAttempt + `
          -- its infra mark is still provisional,
      AND ` + provisionalTI + `
          -- and the sweep's term still leads.
      AND ` + fenced + `
    RETURNING r.ord
)` + batchAnswer

// ConfirmInfra confirms provisional infra marks: the planner may then
// re-place their tasks (or fail them for good when the infra budget is
// spent). A confirmation applies only while the row holds exactly its
// attempt with its mark still provisional, under the current term.
func (s *Store) ConfirmInfra(ctx context.Context, cs []sdk.Confirm) ([]sdk.MarkResult, error) {
	if len(cs) == 0 {
		return nil, nil
	}
	b, err := newBatch("confirm infra", cs, func(c sdk.Confirm) (sdk.Attempt, int64, time.Time) { return c.Attempt, c.Term, c.At },
		func(i int, row sdk.TaskRow) string { return cs[i].Refusal(row) })
	if err != nil {
		return nil, fmt.Errorf("board: %w", err)
	}
	runIDs, taskIDs, tries, epochs := b.attemptArrays()
	return s.runBatch(ctx, b, confirmSQL, runIDs, taskIDs, tries, epochs, b.terms, b.ats)
}

// overrideSQL settles a batch of attempts as successes over their
// provisional infra marks and, in the same statement, appends to each one's
// try log the line naming the mark it overrode ($9 the line's prefix, $10
// the whole line when the mark named no reason).
const overrideSQL = leadCTE + `
r AS (
    SELECT r.*, prev.failure_reason AS mark_reason
    FROM unnest($2::text[], $3::text[], $4::int4[], $5::int4[], $6::timestamptz[], $7::int8[], $8::timestamptz[],
                $11::timestamptz[])
        WITH ORDINALITY AS r(run_id, task_id, try_number, attempt_epoch, marked_after, term, at, ended_at, ord)
    JOIN task_instances prev ON prev.run_id = r.run_id AND prev.task_id = r.task_id
),
applied AS (
    UPDATE task_instances ti SET
        state = 'success', last_failure_kind = NULL, failure_reason = NULL, error_message = NULL,
        infra_marked_at = NULL, infra_confirmed_at = NULL, ended_at = r.ended_at, updated_at = r.at
    FROM r, runs
    WHERE -- the row still holds exactly the attempt that left the SUCCESS record,
          ` + sameAttempt + `
          -- its infra mark is still provisional,
      AND ` + provisionalTI + `
          -- and was made inside the confirmation valve,
      AND ti.infra_marked_at > r.marked_after
          -- on a run that is still running,
      AND runs.run_id = ti.run_id AND runs.state = 'running'
          -- and the sweep's term still leads.
      AND ` + fenced + `
    RETURNING r.ord, ti.run_id, ti.task_id, ti.try_number, ti.attempt_epoch, r.at, r.mark_reason
),
logged AS (
    INSERT INTO attempt_log (run_id, task_id, try_number, attempt_epoch, at, line)
    SELECT run_id, task_id, try_number, attempt_epoch, at,
        CASE WHEN coalesce(mark_reason, '') = '' THEN $10 ELSE $9 || mark_reason END
    FROM applied ORDER BY ord
)` + batchAnswer

// OverrideInfra settles attempts as successes over their provisional infra
// marks because each left a durable SUCCESS record: the infra kind is
// cleared and "outcome recovered from the durable record over <mark>" is
// appended to the attempt's log in the same statement. An override applies
// only while the row holds exactly its attempt, the mark is still
// provisional and was made after MarkedAfter (else NoopValveOpen), the run
// is still running (else NoopRunFinished), under the current term.
func (s *Store) OverrideInfra(ctx context.Context, os []sdk.Override) ([]sdk.MarkResult, error) {
	if len(os) == 0 {
		return nil, nil
	}
	b, err := newBatch("override infra mark", os, func(o sdk.Override) (sdk.Attempt, int64, time.Time) { return o.Attempt, o.Term, o.At },
		func(i int, row sdk.TaskRow) string { return os[i].Refusal(row) })
	if err != nil {
		return nil, fmt.Errorf("board: %w", err)
	}
	markedAfter, ended := make([]time.Time, len(os)), make([]time.Time, len(os))
	for i, o := range os {
		markedAfter[i], ended[i] = o.MarkedAfter, sdk.EndOf(o.EndedAt, o.At)
	}
	runIDs, taskIDs, tries, epochs := b.attemptArrays()
	return s.runBatch(ctx, b, overrideSQL, runIDs, taskIDs, tries, epochs, markedAfter, b.terms, b.ats,
		sdk.OverrideLogPrefix, sdk.OverrideLogLine(""), ended)
}

// settleSQL settles a batch of finished attempts. Each request carries the
// state and failure kind its outcome leaves (sdk.Outcome); the columns
// change as an agent's own report changes them (lifecycle.Report), and an
// infra outcome is confirmed as it is made.
const settleSQL = leadCTE + `
r AS (
    SELECT * FROM unnest($2::text[], $3::text[], $4::int4[], $5::int4[], $6::text[],
                         $7::text[], $8::text[], $9::text[], $10::text[], $11::int8[], $12::timestamptz[],
                         $13::timestamptz[])
        WITH ORDINALITY AS r(run_id, task_id, try_number, attempt_epoch, from_states,
                             to_state, failure_kind, reason, message, term, at, ended_at, ord)
),
applied AS (
    UPDATE task_instances ti SET
        state              = r.to_state,
        last_failure_kind  = NULLIF(r.failure_kind, ''),
        failure_reason     = CASE WHEN r.failure_kind <> '' THEN NULLIF(r.reason, '') END,
        error_message      = CASE WHEN r.failure_kind <> '' THEN NULLIF(r.message, '') END,
        infra_marked_at    = CASE WHEN r.failure_kind = 'infra' THEN r.at END,
        infra_confirmed_at = CASE WHEN r.failure_kind = 'infra' THEN r.at END,
        ended_at           = r.ended_at,
        updated_at         = r.at
    FROM r, runs
    WHERE -- the row still holds exactly the attempt the outcome record names,
          ` + sameAttempt + `
          -- in one of the states the settlement may move it from,
      AND ti.state = ANY (string_to_array(r.from_states, ','))
          -- on a run that is still running,
      AND runs.run_id = ti.run_id AND runs.state = 'running'
          -- and the sweep's term still leads.
      AND ` + fenced + `
    RETURNING r.ord
)` + batchAnswer

// Settle settles finished attempts from their outcome records: a success,
// a task failure (its retry policy applies, exactly as for the agent's own
// failed report), a reschedule poke parked up_for_reschedule, or an infra
// failure confirmed at once (a disrupted pod, a start the control plane
// never answered). A settlement applies only while the row holds exactly
// its attempt in one of its FromStates, on a running run (else
// NoopRunFinished), under the current term.
func (s *Store) Settle(ctx context.Context, ss []sdk.Settlement) ([]sdk.MarkResult, error) {
	if len(ss) == 0 {
		return nil, nil
	}
	b, err := newBatch("settle", ss, func(st sdk.Settlement) (sdk.Attempt, int64, time.Time) { return st.Attempt, st.Term, st.At },
		func(i int, row sdk.TaskRow) string { return ss[i].Refusal(row) })
	if err != nil {
		return nil, fmt.Errorf("board: %w", err)
	}
	n := len(ss)
	fromStates, toStates, kinds := make([]string, n), make([]string, n), make([]string, n)
	reasons, messages, ended := make([]string, n), make([]string, n), make([]time.Time, n)
	for i, st := range ss {
		ended[i] = sdk.EndOf(st.EndedAt, st.At)
		if err := validateSettlement(st); err != nil {
			return nil, fmt.Errorf("board: settle %s: %w", st.Attempt, err)
		}
		fromStates[i] = strings.Join(st.FromStates, ",")
		toStates[i], kinds[i] = st.Outcome.State(), st.Outcome.FailureKind()
		reasons[i], messages[i] = st.Reason, st.Message
	}
	runIDs, taskIDs, tries, epochs := b.attemptArrays()
	return s.runBatch(ctx, b, settleSQL, runIDs, taskIDs, tries, epochs, fromStates, toStates, kinds,
		reasons, messages, b.terms, b.ats, ended)
}

func validateSettlement(st sdk.Settlement) error {
	if st.Outcome.State() == "" {
		return fmt.Errorf("unknown outcome %q", st.Outcome)
	}
	if st.Outcome == sdk.OutcomeInfra && st.Reason == "" {
		return fmt.Errorf("an infra outcome names no reason")
	}
	return validateStates(st.FromStates)
}

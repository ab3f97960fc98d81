package board

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

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
	// infra_marked_at IS NOT NULL matches the partial index of marks. A
	// warm attempt's row carries its worker's last claim (one primary-key
	// lookup per row of the page).
	sql := "SELECT " + candidateColumns + ", " + warmClaimColumns +
		" FROM task_instances ti LEFT JOIN warm_worker_claims wc ON wc.worker = ti.warm_worker WHERE " + provisionalTI +
		" AND infra_marked_at IS NOT NULL" + execFilter + after +
		" ORDER BY infra_marked_at, run_id, task_id LIMIT " + strconv.Itoa(limit)
	page, err := s.candidatePage(ctx, sql, args, limit, newProvisionalScan().scan, func(c sdk.Candidate) time.Time { return c.InfraMarkedAt })
	if err != nil {
		return sdk.CandidatePage{}, fmt.Errorf("board: list provisional marks: %w", err)
	}
	return page, nil
}

// warmClaimColumns are the worker's last claim of a warm candidate: its
// time when the claim said what the worker runs (NULL otherwise: no record,
// or an older worker that did not say), and whether it listed exactly the
// row's attempt.
const warmClaimColumns = `CASE WHEN wc.running IS NOT NULL THEN wc.claimed_at END,
	coalesce(wc.running @> jsonb_build_array(jsonb_build_object('run_id', ti.run_id, 'task_id', ti.task_id,
		'try', ti.try_number, 'epoch', ti.attempt_epoch)), false)`

// provisionalScan scans candidateColumns and warmClaimColumns, reusing
// its targets for every row (as candidateScan does).
type provisionalScan struct {
	*candidateScan
	claimed pgtype.Timestamptz
	holds   bool
}

func newProvisionalScan() *provisionalScan {
	ps := &provisionalScan{}
	ps.candidateScan = newCandidateScan(&ps.claimed, &ps.holds)
	return ps
}

func (ps *provisionalScan) scan(row pgx.CollectableRow) (sdk.Candidate, error) {
	c, err := ps.candidateScan.scan(row)
	if err != nil {
		return sdk.Candidate{}, err
	}
	if c.WarmClaimedAt, err = timeOf(ps.claimed); err != nil {
		return sdk.Candidate{}, err
	}
	c.WarmClaimHolds = ps.holds && ps.claimed.Valid
	return c, nil
}

// confirmSQL confirms a batch of provisional infra marks.
const confirmSQL = leadCTE + `
r AS (
    SELECT * FROM unnest($2::text[], $3::text[], $4::int4[], $5::int4[], $6::int8[], $7::timestamptz[])
        WITH ORDINALITY AS r(run_id, task_id, try_number, attempt_epoch, term, at, ord)
),
applied AS (
    UPDATE task_instances ti SET infra_confirmed_at = r.at, updated_at = r.at,
        reconciled_as = '` + sdk.LabelReconcileInfraConfirmed + `', reconciled_at = r.at
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
	return rowByRow(ctx, s.observer, "confirm infra", cs, func(c sdk.Confirm) sdk.Attempt { return c.Attempt }, s.confirm)
}

func (s *Store) confirm(ctx context.Context, cs []sdk.Confirm) ([]sdk.MarkResult, error) {
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
                $11::timestamptz[], $12::text[], $13::bool[])
        WITH ORDINALITY AS r(run_id, task_id, try_number, attempt_epoch, marked_after, term, at, ended_at,
                             pod_uid, lossy_pod, ord)
    JOIN task_instances prev ON prev.run_id = r.run_id AND prev.task_id = r.task_id
),
applied AS (
    UPDATE task_instances ti SET
        state = 'success', last_failure_kind = NULL, failure_reason = NULL, error_message = NULL,
        infra_marked_at = NULL, infra_confirmed_at = NULL, ended_at = r.ended_at, updated_at = r.at,
        reconciled_as = '` + sdk.LabelReconcileInfraOverride + `', reconciled_at = r.at
    FROM r, runs
    WHERE -- the row still holds exactly the attempt that left the SUCCESS record,
          ` + sameAttempt + `
          -- its infra mark is still provisional,
      AND ` + provisionalTI + `
          -- and was made inside the confirmation valve,
      AND ti.infra_marked_at > r.marked_after
          -- on a run that is still running,
      AND runs.run_id = ti.run_id AND runs.state = 'running'
          -- (a record on a pod that names its task only by the lossy label:
          -- the attempt records that pod as its own),
      AND (NOT r.lossy_pod OR ti.pod_uid = r.pod_uid)
          -- (any pod: the attempt records that pod, or none: a pod from
          -- before UIDs were recorded keeps the label rule),
      AND (r.pod_uid = '' OR ti.pod_uid IS NULL OR ti.pod_uid = r.pod_uid)
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
// is still running (else NoopRunFinished), and, for a record on a pod that
// names its task only by the lossy label (LossyPod), while the attempt
// records that pod's UID (else NoopPodNotRecorded); for any other pod, while
// the attempt records that pod's UID or none (else NoopPodNotRecorded),
// under the current term.
func (s *Store) OverrideInfra(ctx context.Context, os []sdk.Override) ([]sdk.MarkResult, error) {
	if len(os) == 0 {
		return nil, nil
	}
	if _, err := newBatch("override infra mark", os, overrideFields, nil); err != nil {
		return nil, fmt.Errorf("board: %w", err)
	}
	return rowByRow(ctx, s.observer, "override infra mark", os, func(o sdk.Override) sdk.Attempt { return o.Attempt }, s.override)
}

func overrideFields(o sdk.Override) (sdk.Attempt, int64, time.Time) { return o.Attempt, o.Term, o.At }

func (s *Store) override(ctx context.Context, os []sdk.Override) ([]sdk.MarkResult, error) {
	b, err := newBatch("override infra mark", os, func(o sdk.Override) (sdk.Attempt, int64, time.Time) { return o.Attempt, o.Term, o.At },
		func(i int, row sdk.TaskRow) string { return os[i].Refusal(row) })
	if err != nil {
		return nil, fmt.Errorf("board: %w", err)
	}
	markedAfter, ended := make([]time.Time, len(os)), make([]time.Time, len(os))
	podUIDs, lossy := make([]string, len(os)), make([]bool, len(os))
	for i, o := range os {
		markedAfter[i], ended[i] = o.MarkedAfter, sdk.EndOf(o.EndedAt, o.At)
		podUIDs[i], lossy[i] = o.PodUID, o.LossyPod
	}
	runIDs, taskIDs, tries, epochs := b.attemptArrays()
	return s.runBatch(ctx, b, overrideSQL, runIDs, taskIDs, tries, epochs, markedAfter, b.terms, b.ats,
		sdk.OverrideLogPrefix, sdk.OverrideLogLine(""), ended, podUIDs, lossy)
}

// settleSQL settles a batch of finished attempts. Each request carries the
// state and failure kind its outcome leaves (sdk.Outcome); the columns
// change as an agent's own report changes them (lifecycle.Report), and an
// infra outcome is confirmed as it is made. A reschedule the row's task may
// not take ($16 the credential ceiling in microseconds) fails it as a task
// failure with the reason instead (refused): the row's sensor columns are
// fixed for the attempt the request names, so reading them before the
// update's lock is reading them under it.
var settleSQL = leadCTE + `
r AS (
    SELECT r.*, CASE WHEN r.to_state = '` + sdk.StateUpForReschedule + `' AND p.run_id IS NOT NULL
                     THEN ` + RescheduleRefusalSQL("p", "r.at", "$16::int8") + ` ELSE '' END AS refused
    FROM unnest($2::text[], $3::text[], $4::int4[], $5::int4[], $6::text[],
                $7::text[], $8::text[], $9::text[], $10::text[], $11::int8[], $12::timestamptz[],
                $13::timestamptz[], $14::text[], $15::bool[])
        WITH ORDINALITY AS r(run_id, task_id, try_number, attempt_epoch, from_states,
                             to_state, failure_kind, reason, message, term, at, ended_at,
                             pod_uid, lossy_pod, ord)
    LEFT JOIN task_instances p ON p.run_id = r.run_id AND p.task_id = r.task_id
),
applied AS (
    UPDATE task_instances ti SET
        state              = CASE WHEN r.refused <> '' THEN '` + sdk.StateFailed + `' ELSE r.to_state END,
        last_failure_kind  = CASE WHEN r.refused <> '' THEN '` + sdk.FailureTask + `' ELSE NULLIF(r.failure_kind, '') END,
        failure_reason     = CASE WHEN r.refused <> '' THEN r.refused
                                  WHEN r.failure_kind <> '' THEN NULLIF(r.reason, '') END,
        error_message      = CASE WHEN r.refused <> '' THEN ` + RescheduleMessageSQL("r.refused") + `
                                  WHEN r.failure_kind <> '' THEN NULLIF(r.message, '') END,
        retries            = CASE WHEN ` + RescheduleSpendsRetriesSQL("r.refused") + ` THEN 0 ELSE ti.retries END,
        infra_marked_at    = CASE WHEN r.failure_kind = 'infra' THEN r.at END,
        infra_confirmed_at = CASE WHEN r.failure_kind = 'infra' THEN r.at END,
        ended_at           = r.ended_at,
        updated_at         = r.at,
        reconciled_as      = '` + sdk.LabelReconcileSettled + `',
        reconciled_at      = r.at
    FROM r, runs
    WHERE -- the row still holds exactly the attempt the outcome record names,
          ` + sameAttempt + `
          -- (a pod that names its task only by the lossy label: and still
          -- records that pod as the attempt's own),
      AND (NOT r.lossy_pod OR ti.pod_uid = r.pod_uid)
          -- (any pod: the attempt records that pod, or none: a pod from
          -- before UIDs were recorded keeps the label rule),
      AND (r.pod_uid = '' OR ti.pod_uid IS NULL OR ti.pod_uid = r.pod_uid)
          -- in one of the states the settlement may move it from, and one
          -- a settlement may come from at all (never a terminal state),
      AND ti.state = ANY (string_to_array(r.from_states, ','))
      AND ti.state = ANY ($17::text[])
          -- on a run that is still running,
      AND runs.run_id = ti.run_id AND runs.state = 'running'
          -- and the sweep's term still leads.
      AND ` + fenced + `
    RETURNING r.ord, r.refused
)` + batchAnswer + `,
       (SELECT coalesce(array_agg(ord ORDER BY ord), '{}') FROM applied WHERE refused <> ''),
       (SELECT coalesce(array_agg(refused ORDER BY ord), '{}') FROM applied WHERE refused <> '')`

// Settle settles finished attempts from their outcome records: a success,
// a task failure (its retry policy applies, exactly as for the agent's own
// failed report), a reschedule poke parked up_for_reschedule, or an infra
// failure confirmed at once (a disrupted pod, a start the control plane
// never answered). A settlement applies only while the row holds exactly
// its attempt in one of its FromStates, on a running run (else
// NoopRunFinished), while the attempt records the pod's UID or none (else
// NoopPodNotRecorded: someone else made that pod), under the current term;
// one that names a source state outside sdk.SettleSourceStates is refused
// whole (NoopSourceRefused).
//
// A settlement read from a pod that names its task only by the lossy label
// (LossyPod) is first resolved to the task instance of its run that records
// the pod's UID, and applies only while that row still records it; none
// records it: NoopNotFound, and nothing is written for it.
//
// The reason and message, a task's or an agent's own words, are made safe
// first (Safe); a batch PostgreSQL refuses for one settlement's data (an
// end time out of its range, say) is written settlement by settlement, and
// that one is answered NoopRowRefused.
func (s *Store) Settle(ctx context.Context, ss []sdk.Settlement) ([]sdk.MarkResult, error) {
	if len(ss) == 0 {
		return nil, nil
	}
	// A malformed batch is an error before anything is resolved or written.
	if _, err := newBatch("settle", ss, settlementFields, nil); err != nil {
		return nil, fmt.Errorf("board: %w", err)
	}
	for _, st := range ss {
		if err := validateSettlement(st); err != nil {
			return nil, fmt.Errorf("board: settle %s: %w", st.Attempt, err)
		}
	}
	ss = safeEach(ss, func(st *sdk.Settlement) [2]*string { return [2]*string{&st.Reason, &st.Message} },
		s.observer, FieldReason, FieldMessage)
	resolved, unresolved, err := s.resolveLossy(ctx, ss)
	if err != nil {
		return nil, fmt.Errorf("board: settle: %w", err)
	}
	if len(unresolved) == 0 {
		return s.settleRows(ctx, resolved)
	}
	// The unresolved are answered without a write; the others settle as
	// one batch, their results put back in the caller's order.
	var (
		write []sdk.Settlement
		pos   []int
	)
	out := make([]sdk.MarkResult, len(ss))
	for i, st := range resolved {
		if unresolved[i] {
			out[i] = sdk.MarkResult{Attempt: st.Attempt, NoopReason: sdk.NoopNotFound}
			continue
		}
		write, pos = append(write, st), append(pos, i)
	}
	if len(write) == 0 {
		return out, nil
	}
	res, err := s.settleRows(ctx, write)
	if err != nil {
		return nil, err
	}
	for j, i := range pos {
		out[i] = res[j]
	}
	return out, nil
}

// resolveLossy returns the settlements with the task id of each LossyPod
// one replaced by the task that records its pod's UID, and the positions of
// those no task instance of their run records (exactly one must).
func (s *Store) resolveLossy(ctx context.Context, ss []sdk.Settlement) ([]sdk.Settlement, map[int]bool, error) {
	var runIDs, uids []string
	var pos []int
	for i, st := range ss {
		if st.LossyPod {
			runIDs, uids, pos = append(runIDs, st.RunID), append(uids, st.PodUID), append(pos, i)
		}
	}
	if len(pos) == 0 {
		return ss, nil, nil
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT m.ord, ti.task_id
        FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS m(run_id, pod_uid, ord)
        JOIN task_instances ti ON ti.run_id = m.run_id AND ti.pod_uid = m.pod_uid
        WHERE m.pod_uid <> ''`, runIDs, uids)
	if err != nil {
		return nil, nil, fmt.Errorf("resolving %d pods by their recorded UID: %w", len(pos), err)
	}
	found := make(map[int][]string, len(pos))
	for rows.Next() {
		var (
			ord  int64
			task string
		)
		if err := rows.Scan(&ord, &task); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("resolving pods by their recorded UID: %w", err)
		}
		found[pos[ord-1]] = append(found[pos[ord-1]], task)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("resolving pods by their recorded UID: %w", err)
	}
	out, unresolved := slices.Clone(ss), map[int]bool{}
	for _, i := range pos {
		if tasks := found[i]; len(tasks) == 1 {
			out[i].TaskID = tasks[0]
		} else {
			unresolved[i] = true
		}
	}
	return out, unresolved, nil
}

// settleRows settles a batch whose task ids are resolved, row by row when
// PostgreSQL refuses the batch for one settlement's data (rowByRow).
func (s *Store) settleRows(ctx context.Context, ss []sdk.Settlement) ([]sdk.MarkResult, error) {
	return rowByRow(ctx, s.observer, "settle", ss, func(st sdk.Settlement) sdk.Attempt { return st.Attempt }, s.settle)
}

// settle writes a batch of settlements whose task ids are resolved.
func (s *Store) settle(ctx context.Context, ss []sdk.Settlement) ([]sdk.MarkResult, error) {
	b, err := newBatch("settle", ss, settlementFields, func(i int, row sdk.TaskRow) string { return ss[i].Refusal(row) })
	if err != nil {
		return nil, fmt.Errorf("board: %w", err)
	}
	n := len(ss)
	fromStates, toStates, kinds := make([]string, n), make([]string, n), make([]string, n)
	reasons, messages, ended := make([]string, n), make([]string, n), make([]time.Time, n)
	podUIDs, lossy := make([]string, n), make([]bool, n)
	for i, st := range ss {
		podUIDs[i], lossy[i] = st.PodUID, st.LossyPod
		ended[i] = sdk.EndOf(st.EndedAt, st.At)
		if err := validateSettlement(st); err != nil {
			return nil, fmt.Errorf("board: settle %s: %w", st.Attempt, err)
		}
		if !st.SourceRefused() { // a refused settlement matches no row
			fromStates[i] = strings.Join(st.FromStates, ",")
		}
		toStates[i], kinds[i] = st.Outcome.State(), st.Outcome.FailureKind()
		reasons[i], messages[i] = st.Reason, st.Message
	}
	runIDs, taskIDs, tries, epochs := b.attemptArrays()
	var (
		refusedOrds []int64
		refused     []string
	)
	res, err := s.runBatchScan(ctx, b, settleSQL, []any{runIDs, taskIDs, tries, epochs, fromStates, toStates, kinds,
		reasons, messages, b.terms, b.ats, ended, podUIDs, lossy, s.ceiling.Microseconds(),
		sdk.SettleSourceStates()}, &refusedOrds, &refused)
	if err != nil {
		return nil, err
	}
	for j, ord := range refusedOrds {
		if j < len(refused) && ord >= 1 && int(ord) <= len(res) {
			res[ord-1].RescheduleRefused = refused[j]
		}
	}
	return res, nil
}

func settlementFields(st sdk.Settlement) (sdk.Attempt, int64, time.Time) {
	return st.Attempt, st.Term, st.At
}

func validateSettlement(st sdk.Settlement) error {
	if st.Outcome.State() == "" {
		return fmt.Errorf("unknown outcome %q", st.Outcome)
	}
	if st.Outcome == sdk.OutcomeInfra && st.Reason == "" {
		return fmt.Errorf("an infra outcome names no reason")
	}
	if st.LossyPod && st.PodUID == "" {
		return fmt.Errorf("a settlement from a lossy pod names no pod UID")
	}
	return validateStates(st.FromStates)
}

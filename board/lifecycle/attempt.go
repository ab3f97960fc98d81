package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
)

// guardAttempt is the WHERE clause every transition of one attempt shares:
// $1 run, $2 task, $3 try, $4 epoch, and the run still running.
const guardAttempt = `ti.run_id = $1 AND ti.task_id = $2 AND ti.try_number = $3 AND ti.attempt_epoch = $4
    AND r.run_id = ti.run_id AND r.state = 'running'`

// step runs one guarded UPDATE of one attempt and reports whether it applied.
func (w *Writer) step(ctx context.Context, what string, a sdk.Attempt, sql string, args ...any) (bool, error) {
	ctx, cancel := w.bound(ctx)
	defer cancel()
	tag, err := w.pool.Exec(ctx, sql, append([]any{a.RunID, a.TaskID, a.Try, a.Epoch}, args...)...)
	if err != nil {
		return false, fmt.Errorf("board: %s %s: %w", what, a, err)
	}
	return tag.RowsAffected() == 1, nil
}

// runnerStep is step for a runner's write, fenced by the writer's term
// (see Fenced) at now: a write the fence refused is ErrDeposed.
func (w *Writer) runnerStep(ctx context.Context, what string, a sdk.Attempt, now time.Time, sql string, args ...any) (bool, error) {
	cond, fenceArgs := w.fence(5+len(args), now)
	ok, err := w.step(ctx, what, a, sql+`
      AND `+cond, append(args, fenceArgs...)...)
	if err != nil || ok {
		return ok, err
	}
	if err := w.deposed(ctx, what, now, a); err != nil {
		return false, fmt.Errorf("board: %s %s: %w", what, a, err)
	}
	return false, nil
}

// Enqueue moves the attempt from none to scheduled, once its upstreams all
// succeeded. It reports whether it applied.
func (w *Writer) Enqueue(ctx context.Context, a sdk.Attempt, now time.Time) (bool, error) {
	return w.runnerStep(ctx, "enqueue", a, now, `UPDATE task_instances ti SET state = 'scheduled', updated_at = $5
        FROM runs r WHERE `+guardAttempt+` AND ti.state = 'none' AND `+upstreamsSucceeded, now)
}

// Queue moves the attempt from scheduled to queued (handed to an executor)
// and stamps queued_at.
func (w *Writer) Queue(ctx context.Context, a sdk.Attempt, now time.Time) (bool, error) {
	return w.runnerStep(ctx, "queue", a, now, `UPDATE task_instances ti SET state = 'queued', queued_at = $5, updated_at = $5,
            try_dispatched_at = coalesce(ti.try_dispatched_at, $5)
        FROM runs r WHERE `+guardAttempt+` AND ti.state = 'scheduled'`, now)
}

// QueuePod is Queue for an attempt whose pod the runner is about to create
// under podName: the name is recorded with the move, before the create, so
// that a pod whose create answered but whose UID was never recorded (the
// runner deposed, killed or cut off from the board in between) can still
// be known for the attempt's by the name the board holds (see
// UnrecordedPods). The pod's UID is recorded once the create answers
// (RecordCreatedPod).
func (w *Writer) QueuePod(ctx context.Context, a sdk.Attempt, podName string, now time.Time) (bool, error) {
	if podName == "" {
		return false, fmt.Errorf("board: queue %s for its pod: no pod name", a)
	}
	return w.runnerStep(ctx, "queue", a, now, `UPDATE task_instances ti SET state = 'queued', queued_at = $5, updated_at = $5,
            try_dispatched_at = coalesce(ti.try_dispatched_at, $5), pod_name = $6, pod_uid = NULL
        FROM runs r WHERE `+guardAttempt+` AND ti.state = 'scheduled'`, now, podName)
}

// UnrecordedPod is a queued attempt whose pod name is recorded and whose
// pod UID is not: its create may have made the pod, unrecorded.
type UnrecordedPod struct {
	sdk.Attempt
	PodName  string
	QueuedAt time.Time
}

// UnrecordedPods lists up to limit queued attempts of executor, of running
// runs, whose pod name is recorded (QueuePod) and whose pod UID is not,
// queued at or before before, oldest first.
func (w *Writer) UnrecordedPods(ctx context.Context, executor string, before time.Time, limit int) ([]UnrecordedPod, error) {
	if err := checkExecutor(executor); err != nil {
		return nil, fmt.Errorf("board: list unrecorded pods: %w", err)
	}
	ctx, cancel := w.bound(ctx)
	defer cancel()
	rows, err := w.pool.Query(ctx, `SELECT ti.run_id, ti.task_id, ti.try_number, ti.attempt_epoch, ti.pod_name, ti.queued_at
FROM task_instances ti JOIN runs r ON r.run_id = ti.run_id AND r.state = 'running'
WHERE ti.state = 'queued' AND ti.executor = $1 AND ti.queued_at <= $2
  AND ti.pod_name IS NOT NULL AND ti.pod_uid IS NULL
ORDER BY ti.queued_at, ti.run_id, ti.task_id LIMIT `+strconv.Itoa(pageLimit(limit)), executor, before)
	if err != nil {
		return nil, fmt.Errorf("board: list unrecorded %s pods: %w", executor, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (UnrecordedPod, error) {
		var u UnrecordedPod
		err := row.Scan(&u.RunID, &u.TaskID, &u.Try, &u.Epoch, &u.PodName, &u.QueuedAt)
		return u, err
	})
	if err != nil {
		return nil, fmt.Errorf("board: list unrecorded %s pods: %w", executor, err)
	}
	return out, nil
}

// QueueWarm is Queue onto a warm pool worker: it also binds the attempt to
// the worker.
func (w *Writer) QueueWarm(ctx context.Context, a sdk.Attempt, worker string, now time.Time) (bool, error) {
	if worker == "" {
		return false, fmt.Errorf("board: queue %s on a warm worker: no worker named", a)
	}
	return w.runnerStep(ctx, "queue", a, now, `UPDATE task_instances ti SET state = 'queued', queued_at = $5, warm_worker = $6,
        updated_at = $5, try_dispatched_at = coalesce(ti.try_dispatched_at, $5)
        FROM runs r WHERE `+guardAttempt+` AND ti.state = 'scheduled'`, now, worker)
}

// RecordPod records the UID of the pod created for the attempt and when the
// API server created it (zero: unknown; kept for replay as the pod's time
// to start), as the kube runner learns them once the create answered,
// while the row holds the attempt queued or running and its run is
// running. It reports whether it applied. It records no name: see
// RecordCreatedPod.
func (w *Writer) RecordPod(ctx context.Context, a sdk.Attempt, uid string, created, now time.Time) (bool, error) {
	return w.RecordCreatedPod(ctx, a, CreatedPod{UID: uid, Created: created}, now)
}

// CreatedPod is what the kube runner records of the pod it created for an
// attempt.
type CreatedPod struct {
	// Name is the pod's name ("" none recorded: a pod recorded before names
	// were, whose name was the attempt's deterministic one).
	Name string
	UID  string
	// Created is when the API server created the pod (zero: unknown).
	Created time.Time
}

// RecordCreatedPod records the name and UID of the pod created for the
// attempt and when the API server created it, as RecordPod (an empty Name
// leaves the name recorded as it was).
func (w *Writer) RecordCreatedPod(ctx context.Context, a sdk.Attempt, p CreatedPod, now time.Time) (bool, error) {
	if p.UID == "" {
		return false, fmt.Errorf("board: record the pod of %s: no UID", a)
	}
	var at *time.Time
	if !p.Created.IsZero() {
		at = &p.Created
	}
	return w.runnerStep(ctx, "record the pod of", a, now, `UPDATE task_instances ti SET pod_uid = $6,
            pod_created_at = COALESCE($7::timestamptz, ti.pod_created_at),
            pod_name = COALESCE(NULLIF($8, ''), ti.pod_name), updated_at = $5
        FROM runs r WHERE `+guardAttempt+` AND ti.state IN ('queued', 'running')`, now, p.UID, at, p.Name)
}

// PodUID reads the pod UID recorded on the attempt ("" when none is, or
// the row holds another attempt).
func (w *Writer) PodUID(ctx context.Context, a sdk.Attempt) (string, error) {
	p, err := w.RecordedPod(ctx, a)
	return p.UID, err
}

// RecordedPod reads the pod recorded on the attempt (the zero CreatedPod
// when none is, or the row holds another attempt).
func (w *Writer) RecordedPod(ctx context.Context, a sdk.Attempt) (CreatedPod, error) {
	ctx, cancel := w.bound(ctx)
	defer cancel()
	var (
		name, uid *string
		created   *time.Time
	)
	err := w.pool.QueryRow(ctx, `SELECT pod_name, pod_uid, pod_created_at FROM task_instances
        WHERE run_id = $1 AND task_id = $2 AND try_number = $3 AND attempt_epoch = $4`,
		a.RunID, a.TaskID, a.Try, a.Epoch).Scan(&name, &uid, &created)
	if errors.Is(err, pgx.ErrNoRows) {
		return CreatedPod{}, nil
	}
	if err != nil {
		return CreatedPod{}, fmt.Errorf("board: read the pod of %s: %w", a, err)
	}
	var p CreatedPod
	if name != nil {
		p.Name = *name
	}
	if uid != nil {
		p.UID = *uid
	}
	if created != nil {
		p.Created = *created
	}
	return p, nil
}

// Running records the attempt's RUNNING report: queued to running, stamping
// running_at. When the row no longer holds this queued attempt, or the run
// is no longer running, nothing changes and shouldTerminate is true: the
// agent must not start the task. It is not fenced on the credential (see
// RunningFor).
func (w *Writer) Running(ctx context.Context, a sdk.Attempt, now time.Time) (shouldTerminate bool, err error) {
	return w.RunningFor(ctx, a, time.Time{}, now)
}

// RunningFor is Running for the holder of the attempt's credential first
// minted at minted (the token's claim): it applies only while the row
// records that mint (see credentialFence). A zero minted fences nothing.
func (w *Writer) RunningFor(ctx context.Context, a sdk.Attempt, minted, now time.Time) (shouldTerminate bool, err error) {
	ok, err := w.step(ctx, "report running", a, `UPDATE task_instances ti SET state = 'running', running_at = $5,
        updated_at = $5, first_poke_at = CASE WHEN ti.sensor THEN coalesce(ti.first_poke_at, $5) END
        FROM runs r WHERE `+guardAttempt+` AND ti.state = 'queued' AND `+credentialFence("$6::timestamptz"),
		now, mintedParam(minted))
	return !ok && err == nil, err
}

// credentialFence is the condition that a call made with the credential
// first minted at the millisecond minted (a timestamptz expression; NULL:
// a caller that holds no credential) is made by the attempt's current
// execution: the row records that mint, or records none (a row from
// before credentials, or a writer that mints without RecordMint). A
// re-dispatch of the same try and epoch (after a failover lost the first
// dispatch's writes) records a new mint, so the first execution's token,
// which keeps its first mint across renewals, no longer passes. minted is
// whole milliseconds (mintedParam), so the recorded mint falls in its
// millisecond exactly when it truncates to it; the range compares without
// date_trunc's time zone work on every row of a heartbeat batch.
func credentialFence(minted string) string {
	return `(` + minted + ` IS NULL OR ti.credential_minted_at IS NULL
            OR (ti.credential_minted_at >= ` + minted + `
                AND ti.credential_minted_at < ` + minted + ` + interval '1 millisecond'))`
}

// mintedParam is minted to the millisecond a token carries; NULL when zero.
func mintedParam(minted time.Time) pgtype.Timestamptz {
	if minted.IsZero() {
		return pgtype.Timestamptz{}
	}
	return pgtype.Timestamptz{Time: time.UnixMilli(minted.UnixMilli()).UTC(), Valid: true}
}

// Heartbeat records a heartbeat of a running attempt that renews nothing of
// its credential: HeartbeatCredentials' write for one call. When the row no
// longer holds this running attempt, or the run is no longer running,
// nothing changes and shouldTerminate is true: the agent must stop the task.
func (w *Writer) Heartbeat(ctx context.Context, a sdk.Attempt, now time.Time) (shouldTerminate bool, err error) {
	return w.HeartbeatCredential(ctx, a, NotRenewed, now)
}

// TerminalReport is what an attempt reports at its end: the board's side of
// the agent's outcome.
type TerminalReport struct {
	// State is sdk.StateSuccess, StateFailed, StateUpForRetry (a task failure
	// with retries left), StateUpForReschedule (a reschedule-mode sensor's
	// poke ended) or StateSkipped.
	State string
	// Reason is a short label for a failure (execution_timeout, exit_code, ...).
	Reason string
	// Message is the error message of a failure.
	Message string
}

// Report records the attempt's terminal report, guarded like Heartbeat:
// when the row no longer holds this running attempt, or the run is no longer
// running, nothing changes and shouldTerminate is true. A failure reported
// here is a task failure; so is a reschedule the task may not take (see
// ReportOutcome).
func (w *Writer) Report(ctx context.Context, a sdk.Attempt, o TerminalReport, now time.Time) (shouldTerminate bool, err error) {
	r, err := w.ReportOutcome(ctx, a, o, now)
	return r.ShouldTerminate, err
}

// ReportResult is what a report did.
type ReportResult struct {
	// ShouldTerminate: the row no longer holds this running attempt, or
	// the run is no longer running; nothing changed.
	ShouldTerminate bool
	// RescheduleRefused: the report asked for up_for_reschedule and the
	// task may not take it (a sdk.Sensor.RescheduleRefusal label): the
	// attempt was failed as a task failure with that reason instead.
	RescheduleRefused string
}

// reportSQL is the terminal report's write. A reschedule the row's task may
// not take (refused) is a task failure with the reason; past a sensor's own
// timeout its retries are spent. The sensor columns are fixed for the
// running attempt the guard names, so the CTE's read is the row's state
// under the update's lock.
var reportSQL = `WITH p AS (
    SELECT CASE WHEN $5 = '` + sdk.StateUpForReschedule + `'
                THEN ` + board.RescheduleRefusalSQL("p", "$6::timestamptz", "$9::int8") + ` ELSE '' END AS refused
    FROM task_instances p WHERE p.run_id = $1 AND p.task_id = $2
)
UPDATE task_instances ti SET
        state = CASE WHEN p.refused <> '' THEN '` + sdk.StateFailed + `' ELSE $5 END,
        ended_at = $6, updated_at = $6,
        last_failure_kind = CASE WHEN p.refused <> '' OR $5 IN ('failed', 'up_for_retry') THEN 'task' END,
        failure_reason = CASE WHEN p.refused <> '' THEN p.refused ELSE NULLIF($7, '') END,
        error_message = CASE WHEN p.refused <> '' THEN ` + board.RescheduleMessageSQL("p.refused") + ` ELSE NULLIF($8, '') END,
        retries = CASE WHEN ` + board.RescheduleSpendsRetriesSQL("p.refused") + ` THEN 0 ELSE ti.retries END
    FROM runs r, p WHERE ` + guardAttempt + ` AND ti.state = 'running' AND ` + credentialFence("$10::timestamptz") + `
    RETURNING p.refused`

// ReportOutcome is Report, answering also whether a reschedule was refused
// (the reason and message, the agent's words, are made safe first:
// board.Store.Safe):
// only a task declared a sensor may end up_for_reschedule, and only before
// its own timeout (counted from the first poke of its try) and the
// credential ceiling (counted from the first dispatch of its try) have
// passed. Any other reschedule fails the attempt as a task failure with the
// reason (reschedule_not_sensor, sensor_timeout,
// sensor_credential_ceiling) in the same guarded write.
func (w *Writer) ReportOutcome(ctx context.Context, a sdk.Attempt, o TerminalReport, now time.Time) (ReportResult, error) {
	return w.ReportOutcomeFor(ctx, a, time.Time{}, o, now)
}

// ReportOutcomeFor is ReportOutcome for the holder of the attempt's
// credential first minted at minted (the token's claim): it applies only
// while the row records that mint (see credentialFence); otherwise nothing
// changes and the answer is ShouldTerminate. A zero minted fences nothing.
func (w *Writer) ReportOutcomeFor(ctx context.Context, a sdk.Attempt, minted time.Time, o TerminalReport, now time.Time) (ReportResult, error) {
	switch o.State {
	case sdk.StateSuccess, sdk.StateSkipped, sdk.StateUpForReschedule:
		o.Reason, o.Message = "", ""
	case sdk.StateFailed, sdk.StateUpForRetry:
	default:
		return ReportResult{}, fmt.Errorf("board: report %s: %q is not an outcome", a, o.State)
	}
	ctx, cancel := w.bound(ctx)
	defer cancel()
	var refused string
	err := w.pool.QueryRow(ctx, reportSQL, a.RunID, a.TaskID, a.Try, a.Epoch, o.State, now,
		w.store.Safe(board.FieldReason, o.Reason), w.store.Safe(board.FieldMessage, o.Message),
		w.ceiling.Microseconds(), mintedParam(minted)).Scan(&refused)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return ReportResult{ShouldTerminate: true}, nil
	case err != nil:
		return ReportResult{}, fmt.Errorf("board: report %s: %w", a, err)
	}
	return ReportResult{RescheduleRefused: refused}, nil
}

// Failure is a failure the scheduler itself records (not an agent's report).
type Failure struct {
	Kind    sdk.MarkKind // sdk.MarkTask or sdk.MarkInfra
	Reason  string       // dispatch_failed, ...
	Message string
	// Terminal spends the retries left, and for an infra failure the infra
	// budget left: the task does not run again unless cleared (a dispatch
	// that failed for good, say). With its budget spent, a terminal infra
	// failure no longer reads as one the planner will re-place, so it does
	// not keep its run alive (sdk.TaskRow.Replaceable).
	Terminal bool
	// Confirm confirms an infra failure as it is made (no reconciler will).
	Confirm bool
}

// Fail fails the attempt from one of the from states. It reports whether it
// applied.
func (w *Writer) Fail(ctx context.Context, a sdk.Attempt, from []string, f Failure, now time.Time) (bool, error) {
	if len(from) == 0 {
		return false, fmt.Errorf("board: fail %s: no source states", a)
	}
	if f.Kind != sdk.MarkTask && f.Kind != sdk.MarkInfra {
		return false, fmt.Errorf("board: fail %s: unknown failure kind %q", a, f.Kind)
	}
	return w.runnerStep(ctx, "fail", a, now, `UPDATE task_instances ti SET
            state = 'failed', ended_at = $5, updated_at = $5, last_failure_kind = $6,
            failure_reason = NULLIF($7, ''), error_message = NULLIF($8, ''),
            retries = CASE WHEN $9::bool THEN 0 ELSE ti.retries END,
            infra_used = CASE WHEN $9::bool AND $6 = 'infra' THEN ti.infra_budget ELSE ti.infra_used END,
            infra_marked_at = CASE WHEN $6 = 'infra' THEN $5::timestamptz END,
            infra_confirmed_at = CASE WHEN $6 = 'infra' AND $10::bool THEN $5::timestamptz END
        FROM runs r WHERE `+guardAttempt+` AND ti.state = ANY ($11::text[])`,
		now, string(f.Kind), w.store.Safe(board.FieldReason, f.Reason), w.store.Safe(board.FieldMessage, f.Message),
		f.Terminal, f.Confirm, from)
}

// RecordMint records when the queued attempt's credential was minted (the
// runner mints at dispatch, right after Queue). It reports whether it
// applied.
func (w *Writer) RecordMint(ctx context.Context, a sdk.Attempt, mintedAt time.Time) (bool, error) {
	return w.runnerStep(ctx, "record the credential mint of", a, mintedAt, `UPDATE task_instances ti SET credential_minted_at = $5
        FROM runs r WHERE `+guardAttempt+` AND ti.state = 'queued'`, mintedAt)
}

// Renewal is what an accepted heartbeat did to the attempt's credential.
type Renewal int

const (
	// NotRenewed: the heartbeat renewed nothing.
	NotRenewed Renewal = iota
	// Renewed: the heartbeat was answered with a fresh token.
	Renewed
	// Capped: the credential reached its ceiling; no renewal, and the first
	// such heartbeat is recorded.
	Capped
)

// HeartbeatCredential records one heartbeat and what it did to the
// attempt's credential, in one write (HeartbeatCredentials' for one call).
func (w *Writer) HeartbeatCredential(ctx context.Context, a sdk.Attempt, r Renewal, now time.Time) (shouldTerminate bool, err error) {
	term, err := w.HeartbeatCredentials(ctx, []HeartbeatCall{{Attempt: a, Renewal: r, At: now}})
	if err != nil {
		return false, err
	}
	return term[0], nil
}

// HeartbeatCall is one heartbeat of a batch: its attempt, what it did to the
// attempt's credential, and when it arrived.
type HeartbeatCall struct {
	Attempt sdk.Attempt
	// MintedAt is the first mint of the credential the heartbeat was made
	// with (its token's claim): the heartbeat applies only while the row
	// records that mint, or none (see credentialFence). Zero: not fenced
	// (a caller that holds no credential).
	MintedAt time.Time
	Renewal  Renewal
	At       time.Time
}

// HeartbeatCredentials records a batch of heartbeats in one statement and
// one commit: it is the board's only heartbeat write (Heartbeat and
// HeartbeatCredential are this one for a single call). Each heartbeat moves
// last_heartbeat_at to its arrival, never backwards, keeps the attempt's
// longest silence (max_heartbeat_gap, never counted from before
// Options.HeardSince), and records what it did to the attempt's
// credential. Each row is guarded on its own attempt (try and epoch), on
// the credential the call holds (credentialFence, in the same statement),
// on its state running and on its run running, so one superseded attempt
// changes nothing of the others. It answers, per call and in order,
// shouldTerminate: true when that call's row no longer holds its running
// attempt (or the row holds it under another credential: an earlier
// execution of the same try and epoch). Calls of the same attempt and
// credential are merged into one row's write
// (mergeBeats) that records what each of them would have: the latest
// arrival, the longest silence before or between them, the latest renewal
// and the first cap; they get the same answer.
func (w *Writer) HeartbeatCredentials(ctx context.Context, calls []HeartbeatCall) (shouldTerminate []bool, err error) {
	if len(calls) == 0 {
		return nil, nil
	}
	beats := mergeBeats(calls)
	n := len(beats)
	var (
		runs, tasks     = make([]string, n), make([]string, n)
		tries, epochs   = make([]int32, n), make([]int32, n)
		firsts, lasts   = make([]time.Time, n), make([]time.Time, n)
		gaps            = make([]int64, n)
		renewed, capped = make([]pgtype.Timestamptz, n), make([]pgtype.Timestamptz, n)
		minted          = make([]pgtype.Timestamptz, n)
	)
	for i, b := range beats {
		runs[i], tasks[i], tries[i], epochs[i] = b.key.attempt.RunID, b.key.attempt.TaskID, b.key.attempt.Try, b.key.attempt.Epoch
		firsts[i], lasts[i], gaps[i] = b.first, b.last, b.gap.Microseconds()
		renewed[i], capped[i] = b.renewed, b.capped
		minted[i] = mintedParam(b.key.minted)
	}
	what := fmt.Sprintf("board: heartbeat %s", calls[0].Attempt)
	if len(calls) > 1 {
		what = fmt.Sprintf("board: heartbeat %d attempts (%s, ...)", len(calls), calls[0].Attempt)
	}
	// The state guards are written "(... = 'running') IS TRUE" (the same
	// test: both columns are NOT NULL) so that no state index can serve
	// them: each heartbeat then finds its row by its key, rather than the
	// plan reading every running row once per batch when the statistics
	// undercount running rows.
	ctx, cancel := w.bound(ctx)
	defer cancel()
	rows, err := w.pool.Query(ctx, heartbeatSQL,
		runs, tasks, tries, epochs, firsts, lasts, gaps, renewed, capped, w.since, minted)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	applied := make(map[beatKey]bool, n)
	var (
		a sdk.Attempt
		m pgtype.Timestamptz
	)
	if _, err := pgx.ForEachRow(rows, []any{&a.RunID, &a.TaskID, &a.Try, &a.Epoch, &m}, func() error {
		var minted time.Time
		if m.Valid {
			minted = m.Time
		}
		applied[keyOf(a, minted)] = true
		return nil
	}); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	shouldTerminate = make([]bool, len(calls))
	for i, c := range calls {
		shouldTerminate[i] = !applied[keyOf(c.Attempt, c.MintedAt)]
	}
	return shouldTerminate, nil
}

// heartbeatSQL is HeartbeatCredentials' statement: $1 to $9 and $11 are
// the merged calls' arrays (see there), $10 Options.HeardSince.
var heartbeatSQL = `UPDATE task_instances ti
        SET last_heartbeat_at = GREATEST(ti.last_heartbeat_at, hb.last), updated_at = hb.last,
            max_heartbeat_gap = GREATEST(ti.max_heartbeat_gap, interval '0',
                hb.first - GREATEST(COALESCE(ti.last_heartbeat_at, ti.running_at), $10::timestamptz),
                hb.gap_us * interval '1 microsecond'),
            credential_renewed_at = COALESCE(hb.renewed_at, ti.credential_renewed_at),
            credential_capped_at = COALESCE(ti.credential_capped_at, hb.capped_at)
        FROM unnest($1::text[], $2::text[], $3::int[], $4::int[], $5::timestamptz[], $6::timestamptz[], $7::int8[],
                    $8::timestamptz[], $9::timestamptz[], $11::timestamptz[])
                AS hb (run_id, task_id, try, epoch, first, last, gap_us, renewed_at, capped_at, minted),
             runs r
        WHERE ti.run_id = hb.run_id AND ti.task_id = hb.task_id AND ti.try_number = hb.try
            AND ti.attempt_epoch = hb.epoch AND (ti.state = 'running') IS TRUE
            AND ` + credentialFence("hb.minted") + `
            AND r.run_id = ti.run_id AND (r.state = 'running') IS TRUE
        RETURNING ti.run_id, ti.task_id, ti.try_number, ti.attempt_epoch, hb.minted`

// mergedBeat is what one attempt's calls of a batch record, as one row's
// write.
type mergedBeat struct {
	key beatKey
	// first and last are its earliest and latest arrivals; gap is the
	// longest silence between two of its arrivals (0 for one call). With
	// the silence before first, counted on the row, they are the silences
	// each call measured.
	first, last time.Time
	gap         time.Duration
	// renewed is its latest arrival that renewed the credential, capped
	// its earliest that found it capped; NULL: none did.
	renewed, capped pgtype.Timestamptz
}

// beatKey is what the calls merged into one row's write share: the
// attempt and the first mint of the credential they were made with (zero:
// none; else to the millisecond a token carries). Two executions of the
// same attempt heartbeating in one batch are two writes, of which the
// credential fence lets at most one apply.
type beatKey struct {
	attempt sdk.Attempt
	minted  time.Time
}

func keyOf(a sdk.Attempt, minted time.Time) beatKey {
	k := beatKey{attempt: a}
	if !minted.IsZero() {
		k.minted = time.UnixMilli(minted.UnixMilli()).UTC()
	}
	return k
}

// mergeBeats merges the calls of each attempt and credential, in the order
// they first appear.
func mergeBeats(calls []HeartbeatCall) []mergedBeat {
	idx := make(map[beatKey]int, len(calls))
	beats := make([]mergedBeat, 0, len(calls))
	var arrivals map[int][]time.Time // of the attempts called more than once
	for _, c := range calls {
		k := keyOf(c.Attempt, c.MintedAt)
		j, dup := idx[k]
		if !dup {
			j = len(beats)
			idx[k] = j
			beats = append(beats, mergedBeat{key: k, first: c.At, last: c.At})
		} else {
			if arrivals == nil {
				arrivals = map[int][]time.Time{}
			}
			if arrivals[j] == nil {
				arrivals[j] = []time.Time{beats[j].first}
			}
			arrivals[j] = append(arrivals[j], c.At)
		}
		b := &beats[j]
		b.first, b.last = minTime(b.first, c.At), maxTime(b.last, c.At)
		switch {
		case c.Renewal == Renewed && (!b.renewed.Valid || c.At.After(b.renewed.Time)):
			b.renewed = pgtype.Timestamptz{Time: c.At, Valid: true}
		case c.Renewal == Capped && (!b.capped.Valid || c.At.Before(b.capped.Time)):
			b.capped = pgtype.Timestamptz{Time: c.At, Valid: true}
		}
	}
	for j, ats := range arrivals {
		slices.SortFunc(ats, time.Time.Compare)
		for k := 1; k < len(ats); k++ {
			beats[j].gap = max(beats[j].gap, ats[k].Sub(ats[k-1]))
		}
	}
	return beats
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

package board

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/dexaflow/reaper/sdk"
)

// The history reads of reaperctl replay: for each rung of the timing ladder
// that a reaper judges by, the values the board saw in a window that later
// proved the attempt (or run) alive, and the attempts (or runs) that really
// were lost with the value at which they were settled. A threshold under
// one of the first is a false reap; the second say how much sooner or later
// a threshold would have recovered what was lost.
//
// The attempts are attempt_history (every attempt a rail released, by its
// released_at, index attempt_history_released_at_idx of migration 011) and
// the current attempt of each task instance in task_instances (by its
// updated_at, its last write). Each read is one statement and one scan of
// those rows: the values go into one materialized set, and the counts above
// each threshold, the quantiles, the largest values and the lost rows are
// read from it. No further index is kept: the quantiles need every value of
// the window anyway, and an index on a task instance's stamps would be one
// more write on every heartbeat, which these reads must not cost.

// Limits of the history reads.
const (
	// ReplayListDefault is how many of the largest values a read lists
	// by default.
	ReplayListDefault = 20
	// ReplayListMax is the most it lists.
	ReplayListMax = 1000
	// ReplayTimeoutDefault bounds one history read: a week of a fleet's
	// history is more than a listing's work, so it gets more than the
	// store's query timeout (never less).
	ReplayTimeoutDefault = time.Minute
	// ReplayWorkMem is the memory a history read's sorts may take (work_mem,
	// for its own transaction): a week of a large fleet's values sorts in
	// memory instead of on disk.
	ReplayWorkMem = "128MB"
)

// Proofs: what showed that a value did not mean the attempt was lost.
const (
	ProofHeartbeat  = "heartbeat"   // it heartbeated again after the silence
	ProofReport     = "report"      // its own outcome (not success) arrived after the silence
	ProofSuccess    = "success"     // it succeeded after it
	ProofStarted    = "started"     // it reported running after the wait
	ProofActivity   = "activity"    // the run had activity after its quiet
	ProofRunSuccess = "run_success" // the run succeeded after its quiet
	ProofPodSeen    = "pod_seen"    // the pod cache received the attempt's pod, Running
)

// ReplayQuery is the window and the thresholds of a history read.
type ReplayQuery struct {
	// Since keeps the attempts released or last written at or after it
	// (the runs ended at or after it, or not ended); zero: all history.
	Since time.Time
	// Thresholds are the candidates: Replay.Exceeding counts, for each,
	// the values above it.
	Thresholds []time.Duration
	// Quantiles are fractions in [0, 1] whose values Replay.Quantiles
	// holds, in the same order.
	Quantiles []float64
	// List: how many of the largest values Replay.Largest holds; <= 0 means
	// ReplayListDefault, at most ReplayListMax.
	List int
}

func (q ReplayQuery) list() int { return clampLimit(q.List, ReplayListDefault, ReplayListMax) }

// Observation is one value that did not mean loss: the attempt that showed
// it (for a run's quiet, the attempt whose activity ended it; only the run
// when its success did), the value and what proved it. From and To bound
// the period measured when the board knows them (a heartbeat gap is kept
// as its length only).
type Observation struct {
	Attempt  sdk.Attempt
	Value    time.Duration
	Proof    string
	From, To time.Time
}

// LostObservation is one attempt (or run) that was settled as lost: the
// value it had reached when it was (its silence, its wait, its run's quiet,
// its time running), the reason it was settled with and when. Own is true
// when the rung's own reaper settled it; another path's settlement (a
// pod_lost mark, for agent_lost) is recovered by this rung only under a
// threshold below its value.
type LostObservation struct {
	Attempt sdk.Attempt
	Value   time.Duration
	Reason  string
	Own     bool
	At      time.Time
}

// Replay is what a history read found for one rung.
type Replay struct {
	// Count is how many values proved alive in the window.
	Count int
	// Exceeding counts, for each of the query's thresholds, the values
	// above it: the false reaps at that threshold.
	Exceeding []int
	// Quantiles are the values at the query's fractions (nearest rank);
	// empty when Count is 0.
	Quantiles []time.Duration
	// Largest are the largest values, the largest first (ties by run, task,
	// try, epoch): the false reaps at a threshold are its first
	// Exceeding[i].
	Largest []Observation
	// Lost are every attempt (or run) of the window settled as lost, the
	// largest value first.
	Lost []LostObservation
}

// usSQL is an interval expression in whole microseconds (bigint). It is
// computed in double precision (date_part), exact to the microsecond for
// any interval under a century, at about half the cost of extract's
// numeric arithmetic (measured over 2,000,000 intervals).
func usSQL(x string) string { return `round(date_part('epoch', ` + x + `) * 1000000)::bigint` }

// replayAttemptsWith is every attempt of the window ($1): the released
// ones and the current ones, with the columns the rungs read and more
// (", col, col": one rung's own, which the others need not carry).
func replayAttemptsWith(more string) string {
	cols := func(t string) string {
		out := ""
		for _, c := range strings.Split(`run_id, task_id, try_number, attempt_epoch, state, queued_at, running_at,
            last_heartbeat_at, ended_at, last_failure_kind, failure_reason, infra_marked_at,
            credential_minted_at, max_heartbeat_gap`+more, ",") {
			if c = strings.TrimSpace(c); c != "" {
				if out != "" {
					out += ", "
				}
				out += t + "." + c
			}
		}
		return out
	}
	return `
    SELECT ` + cols("h") + `
    FROM attempt_history h WHERE h.released_at >= $1
    UNION ALL
    SELECT ` + cols("ti") + `
    FROM task_instances ti WHERE ti.updated_at >= $1`
}

// ownOutcomeSQL is true for an attempt (aliased a) whose end came from its
// own outcome, reported by its agent or read from its pod: ended, no infra
// mark, and not failed by a reaper's task failure (credential_ceiling) or
// an operator's mark.
const ownOutcomeSQL = `(a.ended_at IS NOT NULL AND a.infra_marked_at IS NULL
    AND a.state IN ('` + sdk.StateSuccess + `', '` + sdk.StateFailed + `', '` + sdk.StateUpForRetry + `', '` + sdk.StateUpForReschedule + `')
    AND coalesce(a.failure_reason, '') NOT IN ('` + sdk.LabelCredentialCeiling + `', '` + sdk.LabelOperatorMark + `'))`

// The observations of each rung, one row per attempt (or run) of the
// window, in the columns replayTail reads: run_id, task_id, try_number,
// attempt_epoch, alive_us (the value that proved alive, NULL: none),
// alive_from, alive_to, proof, lost_us (the value at which it was settled
// lost, NULL: it was not), own, reason, lost_at, lost_run (what was lost is
// the run, not the attempt named).

// agentLostObsSQL: an attempt's longest silence between heartbeats (the
// first from running_at; every such gap was ended by a heartbeat), and the
// silence before its own outcome; lost: marked while running by agent_lost
// (own) or another reaper that found it gone (pod_lost, warm_worker_lost),
// silent since its last heartbeat (or its running report).
var agentLostObsSQL = `SELECT a.run_id, a.task_id, a.try_number, a.attempt_epoch,
    GREATEST(o.gap_us, o.tail_us) AS alive_us, NULL::timestamptz AS alive_from, NULL::timestamptz AS alive_to,
    CASE WHEN o.tail_us IS NOT NULL AND o.tail_us >= coalesce(o.gap_us, 0)
        THEN CASE WHEN a.state = '` + sdk.StateSuccess + `' THEN '` + ProofSuccess + `' ELSE '` + ProofReport + `' END
        ELSE '` + ProofHeartbeat + `' END AS proof,
    CASE WHEN a.infra_marked_at IS NOT NULL AND a.running_at IS NOT NULL
            AND a.failure_reason IN ('` + sdk.LabelAgentLost + `', '` + sdk.LabelPodLost + `', '` + sdk.LabelWarmWorkerLost + `')
        THEN GREATEST(0, ` + usSQL("a.infra_marked_at - coalesce(a.last_heartbeat_at, a.running_at)") + `) END AS lost_us,
    a.failure_reason = '` + sdk.LabelAgentLost + `' AS own, a.failure_reason AS reason, a.infra_marked_at AS lost_at,
    false AS lost_run
FROM a CROSS JOIN LATERAL (SELECT
    ` + usSQL("a.max_heartbeat_gap") + ` AS gap_us,
    CASE WHEN ` + ownOutcomeSQL + ` AND a.running_at IS NOT NULL
        THEN GREATEST(0, ` + usSQL("a.ended_at - coalesce(a.last_heartbeat_at, a.running_at)") + `) END AS tail_us) o`

// dispatchLostObsSQL: an attempt's wait from queued to running, for one
// that started; lost: marked dispatch_lost, after waiting since queued.
var dispatchLostObsSQL = `SELECT a.run_id, a.task_id, a.try_number, a.attempt_epoch,
    CASE WHEN a.queued_at IS NOT NULL AND a.running_at >= a.queued_at
        THEN ` + usSQL("a.running_at - a.queued_at") + ` END AS alive_us,
    a.queued_at AS alive_from, a.running_at AS alive_to, '` + ProofStarted + `' AS proof,
    CASE WHEN a.failure_reason = '` + sdk.LabelDispatchLost + `' AND a.infra_marked_at IS NOT NULL AND a.queued_at IS NOT NULL
        THEN GREATEST(0, ` + usSQL("a.infra_marked_at - a.queued_at") + `) END AS lost_us,
    true AS own, a.failure_reason AS reason, a.infra_marked_at AS lost_at, false AS lost_run
FROM a`

// ceilingObsSQL: how long a successful attempt lived on its credentials,
// from their mint (from its queueing when no mint is recorded) to its end;
// lost: failed credential_ceiling.
var ceilingObsSQL = `SELECT a.run_id, a.task_id, a.try_number, a.attempt_epoch,
    CASE WHEN a.state = '` + sdk.StateSuccess + `' AND a.ended_at >= coalesce(a.credential_minted_at, a.queued_at)
        THEN ` + usSQL("a.ended_at - coalesce(a.credential_minted_at, a.queued_at)") + ` END AS alive_us,
    coalesce(a.credential_minted_at, a.queued_at) AS alive_from, a.ended_at AS alive_to, '` + ProofSuccess + `' AS proof,
    CASE WHEN a.failure_reason = '` + sdk.LabelCredentialCeiling + `' AND a.ended_at >= coalesce(a.credential_minted_at, a.queued_at)
        THEN ` + usSQL("a.ended_at - coalesce(a.credential_minted_at, a.queued_at)") + ` END AS lost_us,
    true AS own, a.failure_reason AS reason, a.ended_at AS lost_at, false AS lost_run
FROM a`

// orphanRunSQL is the observations of orphan_run, one row per run of the
// window: a run's longest quiet period, the longest stretch with no
// attempt live and no activity stamped, taken from the union of its
// attempts' intervals. An attempt is an interval from its first stamp to
// its last (its end only when no infra mark ended it, as tiActivity), and
// up to its release, or open (infinity) when it is current, while its
// state keeps the run alive; each release, and the run's start, is an
// instant of activity. Every gap between them was ended by activity (the
// attempt named); for a run that succeeded, so was the quiet between its
// last activity and its end. Lost: a run the orphan-run reap failed, quiet
// since its last activity.
var orphanRunSQL = `WITH r AS (
    SELECT run_id, state, started_at, ended_at, error_message FROM runs
    WHERE started_at IS NOT NULL AND (ended_at IS NULL OR ended_at >= $1)
),
iv AS (
    SELECT r.run_id, NULL::text AS task_id, NULL::int AS try_number, NULL::int AS attempt_epoch,
        r.started_at AS s, r.started_at AS e
    FROM r
    UNION ALL
    SELECT h.run_id, h.task_id, h.try_number, h.attempt_epoch, v.s, GREATEST(v.s, v.e)
    FROM attempt_history h JOIN r ON r.run_id = h.run_id
    -- Two rows: the attempt's interval (starts, then ends), and the instant of its release.
    CROSS JOIN LATERAL unnest(
        ARRAY[LEAST(h.queued_at, h.running_at, h.last_heartbeat_at, h.ended_at), h.released_at],
        ARRAY[CASE WHEN h.state IN (` + sqlList(sdk.LiveStates()) + `)
                OR (h.state = '` + sdk.StateFailed + `' AND h.last_failure_kind = '` + sdk.FailureInfra + `')
             THEN h.released_at
             ELSE GREATEST(h.queued_at, h.running_at, h.last_heartbeat_at,
                 CASE WHEN h.infra_marked_at IS NULL THEN h.ended_at END) END, h.released_at]) v (s, e)
    WHERE v.s IS NOT NULL
    UNION ALL
    SELECT ti.run_id, ti.task_id, ti.try_number, ti.attempt_epoch, v.s, GREATEST(v.s, v.e)
    FROM task_instances ti JOIN r ON r.run_id = ti.run_id
    -- Two rows: the attempt's interval (starts, then ends), and the instant of its release.
    CROSS JOIN LATERAL unnest(
        ARRAY[LEAST(ti.queued_at, ti.running_at, ti.last_heartbeat_at, ti.ended_at), ti.released_at],
        ARRAY[CASE WHEN ` + liveTI("NULL") + ` THEN 'infinity'::timestamptz
             ELSE GREATEST(ti.queued_at, ti.running_at, ti.last_heartbeat_at,
                 CASE WHEN ti.infra_marked_at IS NULL THEN ti.ended_at END) END, ti.released_at]) v (s, e)
    WHERE v.s IS NOT NULL
),
g AS (
    SELECT run_id, task_id, try_number, attempt_epoch, s,
        max(e) OVER (PARTITION BY run_id ORDER BY s, e, try_number, attempt_epoch, task_id
            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end,
        max(e) OVER (PARTITION BY run_id) AS last_end
    FROM iv
),
gaps AS (
    SELECT g.*, max(g.gap_us) OVER (PARTITION BY g.run_id) AS run_gap_us
    FROM (SELECT g.*, CASE WHEN s > prev_end THEN ` + usSQL("s - prev_end") + ` END AS gap_us FROM g) g
),
quiet AS (
    SELECT DISTINCT ON (run_id) run_id, task_id, try_number, attempt_epoch, prev_end, s, last_end, gap_us
    FROM gaps
    WHERE gap_us = run_gap_us OR run_gap_us IS NULL
    ORDER BY run_id, s, try_number, attempt_epoch, task_id
),
runq AS (
    SELECT r.run_id, r.state, r.ended_at, r.error_message, q.task_id, q.try_number, q.attempt_epoch,
        q.prev_end, q.s, q.gap_us, q.last_end,
        CASE WHEN r.state = '` + sdk.RunSuccess + `' AND q.last_end < 'infinity' AND r.ended_at >= q.last_end
            THEN ` + usSQL("r.ended_at - q.last_end") + ` END AS tail_us
    FROM r JOIN quiet q ON q.run_id = r.run_id
),
obs AS MATERIALIZED (
    SELECT run_id,
        CASE WHEN tail_us >= coalesce(gap_us, 0) THEN NULL ELSE task_id END AS task_id,
        CASE WHEN tail_us >= coalesce(gap_us, 0) THEN NULL ELSE try_number END AS try_number,
        CASE WHEN tail_us >= coalesce(gap_us, 0) THEN NULL ELSE attempt_epoch END AS attempt_epoch,
        GREATEST(gap_us, tail_us) AS alive_us,
        CASE WHEN tail_us >= coalesce(gap_us, 0) THEN last_end ELSE prev_end END AS alive_from,
        CASE WHEN tail_us >= coalesce(gap_us, 0) THEN ended_at ELSE s END AS alive_to,
        CASE WHEN tail_us >= coalesce(gap_us, 0) THEN '` + ProofRunSuccess + `' ELSE '` + ProofActivity + `' END AS proof,
        CASE WHEN state = '` + sdk.RunFailed + `' AND error_message LIKE '` + sdk.LabelOrphanRun + `%'
                AND last_end < 'infinity' AND ended_at >= last_end
            THEN ` + usSQL("ended_at - last_end") + ` END AS lost_us,
        true AS own, CASE WHEN state = '` + sdk.RunFailed + `' THEN '` + sdk.LabelOrphanRun + `' END AS reason,
        ended_at AS lost_at, true AS lost_run
    FROM runq
)`

// podLostFloorColumns are the attempts' columns only pod_lost_floor reads
// (migration 013).
const podLostFloorColumns = ", pod_missing_max, pod_missing_since"

// podLostFloorObsSQL: the largest end of a window in which the pod cache
// held no pod of a running kube attempt, minus its running_at. A closed
// window (pod_missing_max) was ended by the cache receiving the attempt's
// pod Running: proof in itself. A window left open (pod_missing_since: the
// cache saw the pod deleted) is ended by the attempt's last proof of life
// after it: a heartbeat, or its own outcome; with none it proves nothing.
// Lost: marked pod_lost, after running that long.
var podLostFloorObsSQL = `SELECT a.run_id, a.task_id, a.try_number, a.attempt_epoch,
    GREATEST(o.closed_us, o.open_us) AS alive_us,
    a.running_at AS alive_from,
    a.running_at + make_interval(secs => GREATEST(o.closed_us, o.open_us) / 1000000.0) AS alive_to,
    CASE WHEN o.open_us IS NOT NULL AND o.open_us >= coalesce(o.closed_us, 0)
        THEN CASE WHEN coalesce(o.end_us, -1) >= coalesce(o.beat_us, -1)
            THEN CASE WHEN a.state = '` + sdk.StateSuccess + `' THEN '` + ProofSuccess + `' ELSE '` + ProofReport + `' END
            ELSE '` + ProofHeartbeat + `' END
        ELSE '` + ProofPodSeen + `' END AS proof,
    CASE WHEN a.failure_reason = '` + sdk.LabelPodLost + `' AND a.infra_marked_at IS NOT NULL AND a.running_at IS NOT NULL
        THEN GREATEST(0, ` + usSQL("a.infra_marked_at - a.running_at") + `) END AS lost_us,
    true AS own, a.failure_reason AS reason, a.infra_marked_at AS lost_at, false AS lost_run
FROM a CROSS JOIN LATERAL (SELECT
    ` + usSQL("a.pod_missing_max") + ` AS closed_us,
    CASE WHEN a.pod_missing_since IS NOT NULL AND a.last_heartbeat_at > a.pod_missing_since
        THEN ` + usSQL("a.last_heartbeat_at - a.running_at") + ` END AS beat_us,
    CASE WHEN a.pod_missing_since IS NOT NULL AND ` + ownOutcomeSQL + ` AND a.ended_at > a.pod_missing_since
        THEN ` + usSQL("a.ended_at - a.running_at") + ` END AS end_us) p
CROSS JOIN LATERAL (SELECT p.closed_us, p.beat_us, p.end_us, GREATEST(p.beat_us, p.end_us) AS open_us) o`

// replayTail reads one rung's answer from its observations (obs): the
// count, the counts above each threshold (the parameters from $3 on), the
// quantiles at the fractions $2, the largest values and the lost rows.
func replayTail(thresholds int, list int) string {
	counts := make([]string, thresholds)
	for i := range counts {
		counts[i] = fmt.Sprintf("count(*) FILTER (WHERE alive_us > $%d)", i+3)
	}
	countsSQL := "ARRAY[]::bigint[]"
	if thresholds > 0 {
		countsSQL = "ARRAY[" + strings.Join(counts, ", ") + "]::bigint[]"
	}
	order := "run_id, task_id NULLS FIRST, try_number NULLS FIRST, attempt_epoch NULLS FIRST"
	return `
SELECT
    (SELECT count(*) FROM obs WHERE alive_us IS NOT NULL),
    (SELECT ` + countsSQL + ` FROM obs WHERE alive_us IS NOT NULL),
    (SELECT coalesce(percentile_disc($2::float8[]) WITHIN GROUP (ORDER BY alive_us), ARRAY[]::bigint[])
        FROM obs WHERE alive_us IS NOT NULL),
    (SELECT coalesce(json_agg(json_build_object('run_id', run_id, 'task_id', task_id, 'try', try_number,
            'epoch', attempt_epoch, 'us', alive_us, 'proof', proof, 'from', alive_from, 'to', alive_to)
            ORDER BY alive_us DESC, ` + order + `), '[]'::json)
        FROM (SELECT * FROM obs WHERE alive_us IS NOT NULL ORDER BY alive_us DESC, ` + order + `
              LIMIT ` + strconv.Itoa(list) + `) top),
    (SELECT coalesce(json_agg(json_build_object('run_id', run_id,
            'task_id', CASE WHEN NOT lost_run THEN task_id END, 'try', CASE WHEN NOT lost_run THEN try_number END,
            'epoch', CASE WHEN NOT lost_run THEN attempt_epoch END,
            'us', lost_us, 'reason', reason, 'own', own, 'at', lost_at)
            ORDER BY lost_us DESC, ` + order + `), '[]'::json)
        FROM obs WHERE lost_us IS NOT NULL)`
}

// ReplayAgentLost reads the history agent_lost judges by: heartbeat
// silences that ended in a heartbeat or the attempt's own outcome, and the
// attempts marked while silent.
func (s *Store) ReplayAgentLost(ctx context.Context, q ReplayQuery) (Replay, error) {
	return s.replay(ctx, "agent_lost", attemptsObs(agentLostObsSQL), q)
}

// ReplayDispatchLost reads the history dispatch_lost judges by: waits from
// queued to running of attempts that started, and the attempts marked
// dispatch_lost.
func (s *Store) ReplayDispatchLost(ctx context.Context, q ReplayQuery) (Replay, error) {
	return s.replay(ctx, "dispatch_lost", attemptsObs(dispatchLostObsSQL), q)
}

// ReplayCredentialCeiling reads the history the credential ceiling judges
// by: how long successful attempts lived on their credentials, and the
// attempts failed credential_ceiling.
func (s *Store) ReplayCredentialCeiling(ctx context.Context, q ReplayQuery) (Replay, error) {
	return s.replay(ctx, "the credential ceiling", attemptsObs(ceilingObsSQL), q)
}

// ReplayPodLostFloor reads the history pod_lost_floor judges by: how long
// running kube attempts had run when a window in which the pod cache held
// no pod of theirs ended while they lived on, and the attempts marked
// pod_lost.
func (s *Store) ReplayPodLostFloor(ctx context.Context, q ReplayQuery) (Replay, error) {
	return s.replay(ctx, "pod_lost_floor", attemptsObsWith(podLostFloorColumns, podLostFloorObsSQL), q)
}

// ReplayOrphanRun reads the history orphan_run judges by: runs' longest
// quiet periods that activity or the run's success ended, and the runs the
// orphan-run reap failed. A run is in the window when it ended in it or has
// not ended; its whole history is read.
func (s *Store) ReplayOrphanRun(ctx context.Context, q ReplayQuery) (Replay, error) {
	return s.replay(ctx, "orphan_run", orphanRunSQL, q)
}

func attemptsObs(obs string) string { return attemptsObsWith("", obs) }

// attemptsObsWith is attemptsObs over replayAttemptsWith(more).
func attemptsObsWith(more, obs string) string {
	return "WITH a AS (" + replayAttemptsWith(more) + "\n),\nobs AS MATERIALIZED (\n" + obs + "\n)"
}

// replayRow is one listed row of a history read, as its JSON says it.
type replayRow struct {
	RunID  string     `json:"run_id"`
	TaskID *string    `json:"task_id"`
	Try    *int32     `json:"try"`
	Epoch  *int32     `json:"epoch"`
	Us     int64      `json:"us"`
	Proof  string     `json:"proof"`
	From   *time.Time `json:"from"`
	To     *time.Time `json:"to"`
	Reason *string    `json:"reason"`
	Own    bool       `json:"own"`
	At     *time.Time `json:"at"`
}

func (r replayRow) attempt() sdk.Attempt {
	a := sdk.Attempt{RunID: r.RunID, TaskID: deref(r.TaskID)}
	if r.Try != nil {
		a.Try = *r.Try
	}
	if r.Epoch != nil {
		a.Epoch = *r.Epoch
	}
	return a
}

func (s *Store) replay(ctx context.Context, rung, with string, q ReplayQuery) (Replay, error) {
	what := "board: replay " + rung
	for _, f := range q.Quantiles {
		if !(f >= 0 && f <= 1) {
			return Replay{}, fmt.Errorf("%s: quantile %v is not a fraction", what, f)
		}
	}
	since := pgtype.Timestamptz{Time: q.Since, Valid: true}
	if q.Since.IsZero() {
		since = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	}
	fractions := q.Quantiles
	if fractions == nil {
		fractions = []float64{}
	}
	args := []any{since, fractions}
	for _, t := range q.Thresholds {
		args = append(args, t.Microseconds())
	}
	timeout := max(s.timeout, ReplayTimeoutDefault)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var (
		count           int64
		exceeding, qus  []int64
		largest, lostJS []byte
	)
	// One read-only transaction, so that the sorts of a week of history
	// get the memory of ReplayWorkMem for this statement alone.
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		// The statement runs once: compiling it (JIT) costs more than it
		// saves.
		if _, err := tx.Exec(ctx, "SET LOCAL work_mem = '"+ReplayWorkMem+"'; SET LOCAL jit = off"); err != nil {
			return err
		}
		return tx.QueryRow(ctx, with+replayTail(len(q.Thresholds), q.list()), args...).Scan(
			&count, &exceeding, &qus, &largest, &lostJS)
	})
	if err != nil {
		return Replay{}, fmt.Errorf("%s: %w", what, err)
	}
	var top, lost []replayRow
	if err := json.Unmarshal(largest, &top); err != nil {
		return Replay{}, fmt.Errorf("%s: decode the largest values: %w", what, err)
	}
	if err := json.Unmarshal(lostJS, &lost); err != nil {
		return Replay{}, fmt.Errorf("%s: decode the lost: %w", what, err)
	}
	rep := Replay{Count: int(count), Exceeding: make([]int, len(exceeding))}
	for i, n := range exceeding {
		rep.Exceeding[i] = int(n)
	}
	for _, us := range qus {
		rep.Quantiles = append(rep.Quantiles, time.Duration(us)*time.Microsecond)
	}
	for _, r := range top {
		rep.Largest = append(rep.Largest, Observation{Attempt: r.attempt(), Value: time.Duration(r.Us) * time.Microsecond,
			Proof: r.Proof, From: timeOrZero(r.From), To: timeOrZero(r.To)})
	}
	for _, r := range lost {
		rep.Lost = append(rep.Lost, LostObservation{Attempt: r.attempt(), Value: time.Duration(r.Us) * time.Microsecond,
			Reason: deref(r.Reason), Own: r.Own, At: timeOrZero(r.At)})
	}
	return rep, nil
}

// HistoryRetentionDefault is how long the attempt history is kept (the
// host's maintenance.history_retention): four times reaperctl replay's
// default window, and far past the shadow scorer's horizon.
const HistoryRetentionDefault = 30 * 24 * time.Hour

// HistoryPruneBatchDefault is the most attempt_history rows one
// PruneHistory call deletes: a backlog (a lowered retention, a first run
// over an old board) is worked through over several cycles, each a short
// statement.
const HistoryPruneBatchDefault = 10000

// PruneHistory deletes at most limit attempt_history rows released before
// before (limit <= 0: HistoryPruneBatchDefault), oldest first by the
// released_at index, and says how many it deleted.
func (s *Store) PruneHistory(ctx context.Context, term int64, now, before time.Time, limit int) (int64, error) {
	return s.pruneBatch(ctx, "attempt history", `DELETE FROM attempt_history WHERE ctid IN (
        SELECT ctid FROM attempt_history WHERE released_at < $2 ORDER BY released_at LIMIT $3)`, term, now, before, limit,
		HistoryPruneBatchDefault)
}

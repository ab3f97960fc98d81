// Package lifecycle is the writers' side of the board: the guarded
// transitions that a scheduler, the Lite dispatcher and runner, an agent and
// the tests drive runs and task instances through.
//
// A task instance's current attempt is (try_number, attempt_epoch). The
// forward path is
//
//	none ─Enqueue─▶ scheduled ─Queue─▶ queued ─Running─▶ running ─Report─▶ success | failed | up_for_retry | ...
//
// and every rail that starts a new execution (Retry, Clear, Replace,
// Reschedule, WarmRequeue, DispatchBackoff) releases the attempt it names:
// it bumps the try (Retry, Clear) or the epoch (the others), clears what the
// released attempt stamped (queued_at, running_at, last_heartbeat_at,
// ended_at, the failure and infra-mark fields, the warm worker binding) and
// stamps released_at, which counts as run activity. A new attempt therefore
// never looks as if it had heartbeated, and a reaper's mark or a teardown
// pinned to the released attempt can never touch it.
//
// Every write names the attempt it applies to and the states it may move
// from. A write whose attempt moved on changes nothing; an agent's Running,
// Heartbeat or Report that changes nothing is answered shouldTerminate. The
// time of every write is the caller's now.
package lifecycle

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
)

// InfraBudgetDefault is how many infra re-places a task gets unless it says.
const InfraBudgetDefault = 3

// NoInfraBudget, as NewTask.InfraBudget, allows no infra re-place at all.
const NoInfraBudget = -1

// Why a rail or a release did not apply (Release.Reason).
const (
	ReasonMovedOn     = sdk.NoopMovedOn  // another try, epoch or state
	ReasonNotFound    = sdk.NoopNotFound // no such task instance
	ReasonHeld        = "held"           // held for review: release it first
	ReasonNoRetries   = "no_retries"     // Retry with no retries left
	ReasonBudgetSpent = "budget_spent"   // Replace with the infra budget spent
	// ReasonRunNotRunning: the task's run is not running (finished, or not
	// started): no rail but the operator's clear starts anything in it.
	ReasonRunNotRunning = "run_not_running"
)

// Options configure a Writer.
type Options struct {
	// QueryTimeout bounds the database work of one call; <= 0 means
	// board.QueryTimeoutDefault.
	QueryTimeout time.Duration
	// LeaderName is the leader row a fenced writer's term is checked
	// against (see Writer.Fenced); "" means board.LeaderNameDefault.
	LeaderName string
	// Holder is this replica's name in the leader row
	// (board.Options.Holder): set, a fenced write applies only while the
	// row names this holder as well as the term. Empty: the term alone.
	Holder string
	// CredentialCeiling is auth.max_attempt_credential_lifetime: a report
	// (or a reschedule rail) that asks for a sensor's next poke at or past
	// it, counted from the first dispatch of the try, fails the task
	// instead (sdk.Sensor.RescheduleRefusal). <= 0: none.
	CredentialCeiling time.Duration
	// HeardSince is when the writer's attempt API began serving: a
	// heartbeat's gap (max_heartbeat_gap) is never counted from before it,
	// so that a time when no replica could hear the agents (reaperd down,
	// restarting) is not recorded as the agents' silence. Zero: no bound.
	HeardSince time.Time
	// Observer hears of tenants' text made safe and of rows refused alone
	// (board.Options.Observer); nil: no one.
	Observer board.Observer
}

// Writer performs the guarded transitions. It is safe for concurrent use.
type Writer struct {
	pool    *pgxpool.Pool
	store   *board.Store
	timeout time.Duration
	leader  string
	holder  string
	ceiling time.Duration
	since   time.Time
	term    int64 // > 0: the runner writes are fenced by it (see Fenced)

	observer board.Observer
}

// New returns a Writer over pool. The pool stays the caller's to close.
func New(pool *pgxpool.Pool, opts Options) *Writer {
	if opts.QueryTimeout <= 0 {
		opts.QueryTimeout = board.QueryTimeoutDefault
	}
	if opts.LeaderName == "" {
		opts.LeaderName = board.LeaderNameDefault
	}
	return &Writer{pool: pool, store: board.New(pool, board.Options{QueryTimeout: opts.QueryTimeout, LeaderName: opts.LeaderName,
		Holder: opts.Holder, CredentialCeiling: opts.CredentialCeiling, Observer: opts.Observer}),
		timeout: opts.QueryTimeout, leader: opts.LeaderName, holder: opts.Holder, ceiling: opts.CredentialCeiling, since: opts.HeardSince,
		observer: opts.Observer}
}

func (w *Writer) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, w.timeout)
}

// CredentialCeiling is the credential ceiling the writer bounds a sensor's
// pokes by (Options.CredentialCeiling; <= 0: none).
func (w *Writer) CredentialCeiling() time.Duration { return w.ceiling }

// TaskInstance reads one task instance (board.ErrNotFound when absent).
func (w *Writer) TaskInstance(ctx context.Context, runID, taskID string) (board.TaskInstance, error) {
	return w.store.TaskInstance(ctx, runID, taskID)
}

// TaskInstances reads every task instance of a run.
func (w *Writer) TaskInstances(ctx context.Context, runID string) ([]board.TaskInstance, error) {
	return w.store.TaskInstances(ctx, runID)
}

// OwedTeardown reads the teardown owed for attempt a itself, if one is
// (board.Store.OwedTeardownOf).
func (w *Writer) OwedTeardown(ctx context.Context, a sdk.Attempt) (board.OwedTeardown, bool, error) {
	return w.store.OwedTeardownOf(ctx, a)
}

// Run reads one run (board.ErrNotFound when absent).
func (w *Writer) Run(ctx context.Context, runID string) (board.Run, error) {
	return w.store.Run(ctx, runID)
}

// NewTask is a task instance created with its run, at try 1, epoch 0, in
// state none.
type NewTask struct {
	TaskID   string
	Executor string // sdk.ExecutorKube, ExecutorLite or ExecutorWarm
	// Retries the task declares: a task failure with retries left can be
	// retried that many times; a clear restores them.
	Retries int32
	// InfraBudget is how many infra re-places the task gets: 0 means
	// InfraBudgetDefault, NoInfraBudget means none.
	InfraBudget int32
	// Command is what the Lite runner executes (empty for other executors).
	Command string
	// ExecutionTimeout is the task's declared timeout; 0: none.
	ExecutionTimeout time.Duration
	// Sensor declares the task a sensor: the only kind of task whose poke
	// may end up_for_reschedule (any other that reports it is failed,
	// reschedule_not_sensor). A sensor must declare SensorTimeout.
	Sensor bool
	// SensorTimeout is a sensor's own timeout, counted from the first poke
	// of each try and not reset by its reschedules (sensor_timeout past
	// it); rounded up to seconds. Only for a sensor.
	SensorTimeout time.Duration
	// Upstreams name the tasks of the same run this one waits for: it is
	// scheduled once every one of them succeeded, settled upstream_failed
	// once one failed for good, skipped once one was skipped (and none
	// failed). See CheckGraph for what a run's upstreams must be.
	Upstreams []string
	// Pool is the pool whose slots the task takes while queued or running
	// ("": DefaultPool), PoolSlots how many (0: 1).
	Pool      string
	PoolSlots int32
}

// DefaultPool is the pool of a task that names none.
const DefaultPool = "default_pool"

// PoolSlotsMax bounds the slots one task takes.
const PoolSlotsMax = 1 << 20

// NewRun is a run created with its task instances.
type NewRun struct {
	RunID string
	DagID string
	// State is sdk.RunRunning (the default: started at now) or sdk.RunQueued.
	State string
	Tasks []NewTask
	// MaxActiveTasks bounds the run's task instances queued or running at
	// once; 0: no bound.
	MaxActiveTasks int32
	// Operator, when set, names the operator who submitted the run
	// (CheckOperator): an operator_submit decision about the run naming
	// them is written to the audit with it.
	Operator string
}

const createRunSQL = `
WITH run AS (
    INSERT INTO runs (run_id, dag_id, state, started_at, updated_at, max_active_tasks)
    VALUES ($1, $2, $3, CASE WHEN $3 = 'running' THEN $4::timestamptz END, $4, NULLIF($16::int4, 0))
)
INSERT INTO task_instances (run_id, task_id, executor, retries, max_retries, infra_budget,
    command, execution_timeout_seconds, sensor, sensor_timeout_seconds, upstreams, pool, pool_slots, updated_at)
SELECT $1, t.task_id, t.executor, t.retries, t.retries, t.infra_budget,
    NULLIF(t.command, ''), NULLIF(t.timeout, 0), t.sensor, CASE WHEN t.sensor THEN t.sensor_timeout END,
    ARRAY(SELECT jsonb_array_elements_text(t.upstreams::jsonb)), t.pool, t.pool_slots, $4
FROM unnest($5::text[], $6::text[], $7::int4[], $8::int4[], $9::text[], $10::int4[], $11::bool[], $12::int4[],
        $13::text[], $14::text[], $15::int4[])
    AS t(task_id, executor, retries, infra_budget, command, timeout, sensor, sensor_timeout, upstreams, pool, pool_slots)`

// CreateRun inserts a run and its task instances in one statement: all of
// them or nothing.
func (w *Writer) CreateRun(ctx context.Context, r NewRun, now time.Time) error {
	if r.RunID == "" || r.DagID == "" {
		return fmt.Errorf("board: create run: run id and dag id are required")
	}
	if r.State == "" {
		r.State = sdk.RunRunning
	}
	if r.State != sdk.RunRunning && r.State != sdk.RunQueued {
		return fmt.Errorf("board: create run %s: a run starts queued or running, not %q", r.RunID, r.State)
	}
	n := len(r.Tasks)
	ids, execs, cmds := make([]string, n), make([]string, n), make([]string, n)
	retries, budgets, timeouts := make([]int32, n), make([]int32, n), make([]int32, n)
	sensors, sensorTimeouts := make([]bool, n), make([]int32, n)
	// Each task's upstreams travel as one JSON array: unnest flattens an
	// array of arrays.
	upstreams, pools, poolSlots := make([]string, n), make([]string, n), make([]int32, n)
	if r.MaxActiveTasks < 0 {
		return fmt.Errorf("board: create run %s: max_active_tasks %d: want 0 (no bound) or more", r.RunID, r.MaxActiveTasks)
	}
	if err := CheckGraph(r.Tasks); err != nil {
		return fmt.Errorf("board: create run %s: %w", r.RunID, err)
	}
	for i, t := range r.Tasks {
		ups := t.Upstreams
		if ups == nil {
			ups = []string{}
		}
		b, err := json.Marshal(ups)
		if err != nil {
			return fmt.Errorf("board: create run %s: task %s: %w", r.RunID, t.TaskID, err)
		}
		upstreams[i] = string(b)
		if pools[i], poolSlots[i] = t.Pool, t.PoolSlots; pools[i] == "" {
			pools[i] = DefaultPool
		}
		if poolSlots[i] == 0 {
			poolSlots[i] = 1
		}
		if poolSlots[i] < 0 || poolSlots[i] > PoolSlotsMax {
			return fmt.Errorf("board: create run %s: task %s: pool_slots %d: want 1 to %d", r.RunID, t.TaskID, t.PoolSlots, PoolSlotsMax)
		}
		budget := t.InfraBudget
		switch {
		case budget == 0:
			budget = InfraBudgetDefault
		case budget == NoInfraBudget:
			budget = 0
		}
		ids[i], execs[i], cmds[i] = t.TaskID, t.Executor, t.Command
		retries[i], budgets[i] = t.Retries, budget
		timeouts[i] = int32((t.ExecutionTimeout + time.Second - 1) / time.Second)
		if err := checkSensor(t); err != nil {
			return fmt.Errorf("board: create run %s: task %s: %w", r.RunID, t.TaskID, err)
		}
		if err := CheckCommand(t.Command); err != nil {
			return fmt.Errorf("board: create run %s: task %s: %w", r.RunID, t.TaskID, err)
		}
		sensors[i], sensorTimeouts[i] = t.Sensor, int32((t.SensorTimeout+time.Second-1)/time.Second)
	}
	if r.Operator != "" {
		if err := CheckOperator(r.Operator); err != nil {
			return fmt.Errorf("board: create run %s: %w", r.RunID, err)
		}
	}
	ctx, cancel := w.bound(ctx)
	defer cancel()
	err := pgx.BeginTxFunc(ctx, w.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, createRunSQL, r.RunID, r.DagID, r.State, now,
			ids, execs, retries, budgets, cmds, timeouts, sensors, sensorTimeouts, upstreams, pools, poolSlots,
			r.MaxActiveTasks); err != nil || r.Operator == "" {
			return err
		}
		return auditOperator(ctx, tx, now, w.holder, sdk.Decision{Reaper: OperatorReaper, Label: sdk.LabelOperatorSubmit,
			Attempt: sdk.Attempt{RunID: r.RunID}, Applied: true,
			Detail:   fmt.Sprintf("operator %s submitted the run (%d tasks)", r.Operator, n),
			Evidence: map[string]string{"operator": r.Operator, "tasks": strconv.Itoa(n), "dag": r.DagID}})
	})
	if err != nil {
		return fmt.Errorf("board: create run %s: %w", r.RunID, err)
	}
	return nil
}

// maxSensorTimeout is the longest sensor timeout a task may declare (the
// column holds seconds in an int4).
const maxSensorTimeout = time.Duration(1<<31-1) * time.Second

// CommandMax bounds a task's command, in bytes: the runner hands it on
// whole (a Lite agent's argument, a pod's, a warm worker's claim answer),
// and a warm worker's claim answer must hold at least one attempt's command
// even when JSON escapes every byte of it (attemptapi.MaxClaimReply).
const CommandMax = 32 << 10

// CheckCommand refuses a command over CommandMax, naming the limit.
func CheckCommand(cmd string) error {
	if len(cmd) > CommandMax {
		return fmt.Errorf("the command is %d bytes, at most %d", len(cmd), CommandMax)
	}
	return nil
}

// checkSensor refuses a sensor without a timeout, and a timeout on a task
// that is not a sensor.
func checkSensor(t NewTask) error {
	switch {
	case t.Sensor && t.SensorTimeout <= 0:
		return fmt.Errorf("a sensor must declare a positive sensor timeout")
	case t.Sensor && t.SensorTimeout > maxSensorTimeout:
		return fmt.Errorf("sensor timeout %s is too long", t.SensorTimeout)
	case !t.Sensor && t.SensorTimeout != 0:
		return fmt.Errorf("a sensor timeout on a task that is not a sensor")
	}
	return nil
}

// StartQueuedRuns starts queued runs, oldest first (by creation, then run
// id: a queued run's updated_at is its creation, since nothing writes a run
// before it starts), while fewer than maxRunning runs are running (0 or less: no cap),
// at most limit of them (at most a page). It returns the runs it started
// and how many queued runs are still waiting. The cap is read and the runs
// started in one statement.
func (w *Writer) StartQueuedRuns(ctx context.Context, maxRunning, limit int, now time.Time) ([]string, int, error) {
	limit = pageLimit(limit)
	fence, fenceArgs := w.fence(4, now)
	ctx, cancel := w.bound(ctx)
	defer cancel()
	var (
		started []string
		waiting int
	)
	err := w.pool.QueryRow(ctx, `WITH room AS (
    SELECT CASE WHEN $1 <= 0 THEN $2
                ELSE LEAST($2, GREATEST(0, $1 - (SELECT count(*) FROM runs WHERE state = 'running'))) END AS n
),
pick AS (
    SELECT run_id FROM runs WHERE state = 'queued'
    ORDER BY updated_at, run_id
    LIMIT (SELECT n FROM room)
    FOR UPDATE SKIP LOCKED
),
started AS (
    UPDATE runs r SET state = 'running', started_at = $3, updated_at = $3
    FROM pick WHERE r.run_id = pick.run_id AND r.state = 'queued'
      AND `+fence+`
    RETURNING r.run_id
)
SELECT coalesce((SELECT array_agg(run_id ORDER BY run_id) FROM started), '{}'),
       (SELECT count(*) FROM runs WHERE state = 'queued') - (SELECT count(*) FROM started)`,
		append([]any{maxRunning, limit, now}, fenceArgs...)...).Scan(&started, &waiting)
	if err != nil {
		return nil, 0, fmt.Errorf("board: start queued runs: %w", err)
	}
	if len(started) == 0 && waiting > 0 {
		if err := w.deposed(ctx, "start queued runs", now); err != nil {
			return nil, 0, fmt.Errorf("board: start queued runs: %w", err)
		}
	}
	return started, waiting, nil
}

// RunningSince returns, of the given attempts, those that have reported
// running, with the time they were queued and the time they started
// running: the runner's dispatch latency. At most a page of attempts.
func (w *Writer) RunningSince(ctx context.Context, as []sdk.Attempt) (map[sdk.Attempt][2]time.Time, error) {
	out := map[sdk.Attempt][2]time.Time{}
	if len(as) == 0 {
		return out, nil
	}
	runs, tasks := make([]string, len(as)), make([]string, len(as))
	tries, epochs := make([]int32, len(as)), make([]int32, len(as))
	for i, a := range as {
		runs[i], tasks[i], tries[i], epochs[i] = a.RunID, a.TaskID, a.Try, a.Epoch
	}
	ctx, cancel := w.bound(ctx)
	defer cancel()
	rows, err := w.pool.Query(ctx, `SELECT ti.run_id, ti.task_id, ti.try_number, ti.attempt_epoch, ti.queued_at, ti.running_at
FROM task_instances ti
JOIN unnest($1::text[], $2::text[], $3::int4[], $4::int4[]) AS a(run_id, task_id, try_number, attempt_epoch)
  ON ti.run_id = a.run_id AND ti.task_id = a.task_id AND ti.try_number = a.try_number AND ti.attempt_epoch = a.attempt_epoch
WHERE ti.running_at IS NOT NULL AND ti.queued_at IS NOT NULL`, runs, tasks, tries, epochs)
	if err != nil {
		return nil, fmt.Errorf("board: read running attempts: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			a            sdk.Attempt
			queued, runs time.Time
		)
		if err := rows.Scan(&a.RunID, &a.TaskID, &a.Try, &a.Epoch, &queued, &runs); err != nil {
			return nil, fmt.Errorf("board: read running attempts: %w", err)
		}
		out[a] = [2]time.Time{queued, runs}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("board: read running attempts: %w", err)
	}
	return out, nil
}

// StartRun moves a queued run to running and stamps its start.
func (w *Writer) StartRun(ctx context.Context, runID string, now time.Time) (bool, error) {
	ctx, cancel := w.bound(ctx)
	defer cancel()
	tag, err := w.pool.Exec(ctx, `UPDATE runs SET state = 'running', started_at = $2, updated_at = $2
        WHERE run_id = $1 AND state = 'queued'`, runID, now)
	if err != nil {
		return false, fmt.Errorf("board: start run %s: %w", runID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// FinishRun moves a running run to success or failed.
func (w *Writer) FinishRun(ctx context.Context, runID, state, message string, now time.Time) (bool, error) {
	if state != sdk.RunSuccess && state != sdk.RunFailed {
		return false, fmt.Errorf("board: finish run %s: a run finishes success or failed, not %q", runID, state)
	}
	ctx, cancel := w.bound(ctx)
	defer cancel()
	// The run's task instances are closed in the same statement (see
	// migration 002): they leave the orphan-run candidates for good.
	var finished bool
	err := w.pool.QueryRow(ctx, `WITH fin AS (
    UPDATE runs SET state = $2, ended_at = $3, error_message = NULLIF($4, ''), updated_at = $3
    WHERE run_id = $1 AND state = 'running' RETURNING run_id
), closed AS (
    UPDATE task_instances ti SET run_closed = true FROM fin WHERE ti.run_id = fin.run_id
)
SELECT EXISTS (SELECT 1 FROM fin)`, runID, state, now, w.store.Safe(board.FieldMessage, message)).Scan(&finished)
	if err != nil {
		return false, fmt.Errorf("board: finish run %s: %w", runID, err)
	}
	return finished, nil
}

// AppendLog appends lines to attempts' try logs (the writers' side: not
// fenced by a leadership term), each made safe first (board.Store.Safe);
// when PostgreSQL refuses the batch for one line's data, the lines are
// appended one by one and that line alone is left out (told to the
// observer).
func (w *Writer) AppendLog(ctx context.Context, lines []sdk.LogLine) error {
	if len(lines) == 0 {
		return nil
	}
	lines = w.store.SafeLogLines(lines)
	err := w.appendLog(ctx, lines)
	if err == nil || !board.IsRowError(err) {
		return err
	}
	for _, l := range lines {
		err := w.appendLog(ctx, []sdk.LogLine{l})
		switch {
		case err == nil:
		case board.IsRowError(err):
			if w.observer != nil {
				w.observer.RowRefused("append log", l.Attempt, err)
			}
		default:
			return err
		}
	}
	return nil
}

func (w *Writer) appendLog(ctx context.Context, lines []sdk.LogLine) error {
	n := len(lines)
	runIDs, taskIDs, texts := make([]string, n), make([]string, n), make([]string, n)
	tries, epochs := make([]int32, n), make([]int32, n)
	ats := make([]time.Time, n)
	for i, l := range lines {
		if l.RunID == "" || l.TaskID == "" || l.At.IsZero() {
			return fmt.Errorf("board: append log: line %d (%s): run id, task id and time are required", i, l.Attempt)
		}
		runIDs[i], taskIDs[i], tries[i], epochs[i], ats[i], texts[i] = l.RunID, l.TaskID, l.Try, l.Epoch, l.At, l.Line
	}
	ctx, cancel := w.bound(ctx)
	defer cancel()
	_, err := w.pool.Exec(ctx, `INSERT INTO attempt_log (run_id, task_id, try_number, attempt_epoch, at, line)
        SELECT l.run_id, l.task_id, l.try_number, l.attempt_epoch, l.at, l.line
        FROM unnest($1::text[], $2::text[], $3::int4[], $4::int4[], $5::timestamptz[], $6::text[])
            WITH ORDINALITY AS l(run_id, task_id, try_number, attempt_epoch, at, line, ord)
        ORDER BY l.ord`, runIDs, taskIDs, tries, epochs, ats, texts)
	if err != nil {
		return fmt.Errorf("board: append log: %w", err)
	}
	return nil
}

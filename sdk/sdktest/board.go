package sdktest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// TaskInstance is one row of the board's task_instances, as the in-memory
// board keeps it. Zero times stand for NULL.
type TaskInstance struct {
	RunID            string
	TaskID           string
	Try              int32
	Epoch            int32
	State            string
	Executor         string
	QueuedAt         time.Time
	RunningAt        time.Time
	LastHeartbeatAt  time.Time
	ReleasedAt       time.Time
	EndedAt          time.Time
	LastFailureKind  string
	InfraMarkedAt    time.Time
	InfraConfirmedAt time.Time
	// InfraBudget and InfraUsed are the infra re-places allowed and spent.
	// The zero row has no budget: an infra failure of it is not
	// re-placed.
	InfraBudget      int32
	InfraUsed        int32
	ErrorMessage     string
	WarmWorker       string
	ExecutionTimeout time.Duration
	// Held is set by a mark with Hold: failed and held for review.
	Held bool
	// MarkReason is the failure_reason: the Reason of the mark (or the
	// settlement) that failed the attempt.
	MarkReason string
	// PodUID is the UID of the pod recorded for the current attempt (kube).
	PodUID string
	// PodMissingMax and PodMissingSince are the attempt's pod cache
	// history (RecordPodSightings): the largest end of a window with no pod
	// cached minus RunningAt (0: none), and the start of a window still
	// open (zero: none).
	PodMissingMax   time.Duration
	PodMissingSince time.Time
	// CredentialMintedAt is when the attempt's credential was minted (its
	// bootstrap token's mint); CredentialExchangedAt when its bootstrap
	// token was exchanged for the working token (see ExchangeBootstrap).
	CredentialMintedAt    time.Time
	CredentialExchangedAt time.Time
	// Sensor is the task's sensor declaration and the stamps its bounds
	// count from (zero: not a sensor).
	Sensor sdk.Sensor
	// Retries is how many retries the task has left (a settlement that
	// refuses a sensor's reschedule past its timeout spends them).
	Retries int32
}

// Attempt returns the attempt the row currently holds.
func (t TaskInstance) Attempt() sdk.Attempt {
	return sdk.Attempt{RunID: t.RunID, TaskID: t.TaskID, Try: t.Try, Epoch: t.Epoch}
}

// Live reports whether the row keeps its run alive with no bound on a
// provisional infra mark: a state that is still executing or parked for the
// scheduler to bring back, an attempt held for an operator's review, an
// infra failure the planner will re-place, or a provisional infra mark
// (sdk.TaskRow.Live with a zero cutoff, the real board's rule).
func (t TaskInstance) Live() bool { return t.guardRow("").Live(time.Time{}) }

// guardRow is the row as the board's guards read it.
func (t TaskInstance) guardRow(runState string) sdk.TaskRow {
	return sdk.TaskRow{Attempt: t.Attempt(), State: t.State, LastFailureKind: t.LastFailureKind,
		LastHeartbeatAt: t.LastHeartbeatAt, InfraMarkedAt: t.InfraMarkedAt, InfraConfirmedAt: t.InfraConfirmedAt,
		InfraBudget: t.InfraBudget, InfraUsed: t.InfraUsed, Held: t.Held, RunState: runState, PodUID: t.PodUID,
		Executor: t.Executor, RunningAt: t.RunningAt, Sensor: t.Sensor}
}

// Run is one row of the board's runs.
type Run struct {
	RunID     string
	DagID     string
	State     string
	StartedAt time.Time
	EndedAt   time.Time
	// FailedBy is the Message of the reap that failed the run.
	FailedBy string
}

// Op names a board operation, for injecting errors.
type Op string

// Board operations.
const (
	OpListCandidates  Op = "ListCandidates"
	OpMark            Op = "Mark"
	OpListOrphanRuns  Op = "ListOrphanRuns"
	OpReapRun         Op = "ReapRun"
	OpAppendLog       Op = "AppendLog"
	OpListProvisional Op = "ListProvisional"
	OpConfirmInfra    Op = "ConfirmInfra"
	OpOverrideInfra   Op = "OverrideInfra"
	OpSettle          Op = "Settle"
	OpRecordSightings Op = "RecordPodSightings"
)

// Board is an in-memory sdk.Board with the guards of the Postgres board. It
// is safe for concurrent use. Hooks run without the board's lock held, so
// they may call the board's setters.
type Board struct {
	mu       sync.Mutex
	term     int64
	expires  time.Time     // the term's lease; zero: never expires
	ceiling  time.Duration // the credential ceiling a sensor's pokes are bounded by; 0: none
	executor string
	runs     map[string]*Run
	tasks    map[string]map[string]*TaskInstance // run -> task -> row
	rows     []*TaskInstance                     // every row, in insertion order, for scans
	locked   map[string]bool
	logs     map[sdk.Attempt][]string
	errs     map[Op]error
	claims   map[string]WarmClaim // warm worker -> its last claim

	onList    func(q sdk.CandidateQuery)
	onMark    func(m sdk.Mark)
	onReapRun func(r sdk.RunReap)

	marks     []sdk.Mark
	markCalls int
	reconcile int // reconciler write calls
	reaps     []sdk.RunReap
	logCalls  int
	lists     int
}

var _ sdk.Board = (*Board)(nil)

// NewBoard returns an empty board whose leadership term is 1 and whose rows
// default to the lite executor.
func NewBoard() *Board {
	return &Board{
		term:     1,
		executor: sdk.ExecutorLite,
		runs:     map[string]*Run{},
		tasks:    map[string]map[string]*TaskInstance{},
		locked:   map[string]bool{},
		logs:     map[sdk.Attempt][]string{},
		errs:     map[Op]error{},
		claims:   map[string]WarmClaim{},
	}
}

// --- setup and setters ---

// SetTerm sets the current leadership term; writes carrying another term
// are no-ops (deposed).
func (b *Board) SetTerm(term int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.term = term
}

// SetLease sets when the current term's lease expires: a write whose At is
// at or after it is deposed, as on the real board. Zero (the default) never
// expires.
func (b *Board) SetLease(expires time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expires = expires
}

// SetCredentialCeiling sets the credential ceiling (counted from the first
// dispatch of a try) past which a settlement refuses a sensor's reschedule,
// as the real board's board.Options.CredentialCeiling. Zero (the default):
// none.
func (b *Board) SetCredentialCeiling(d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ceiling = d
}

// deposedLocked reports whether a write of term made at at is fenced out:
// term is not current, or its lease has expired by at.
func (b *Board) deposedLocked(term int64, at time.Time) bool {
	return term != b.term || (!b.expires.IsZero() && !at.Before(b.expires))
}

// Term returns the current leadership term.
func (b *Board) Term() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.term
}

// SetDefaultExecutor sets the executor Put gives rows that name none.
func (b *Board) SetDefaultExecutor(executor string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.executor = executor
}

// PutRun inserts or replaces a run. An empty State means running.
func (b *Board) PutRun(r Run) {
	if r.State == "" {
		r.State = sdk.RunRunning
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.runs[r.RunID] = &r
}

// Put inserts or replaces a task instance and returns its attempt. Try 0
// becomes 1, an empty executor the board's default, an empty state none. A
// missing run is created running, started at the row's earliest timestamp.
func (b *Board) Put(t TaskInstance) sdk.Attempt {
	b.mu.Lock()
	defer b.mu.Unlock()
	if t.Try == 0 {
		t.Try = 1
	}
	if t.Executor == "" {
		t.Executor = b.executor
	}
	if t.State == "" {
		t.State = sdk.StateNone
	}
	if _, ok := b.runs[t.RunID]; !ok {
		b.runs[t.RunID] = &Run{RunID: t.RunID, DagID: "dag", State: sdk.RunRunning, StartedAt: earliest(t.QueuedAt, t.RunningAt, t.LastHeartbeatAt, t.ReleasedAt)}
	}
	if b.tasks[t.RunID] == nil {
		b.tasks[t.RunID] = map[string]*TaskInstance{}
	}
	if old, ok := b.tasks[t.RunID][t.TaskID]; ok {
		*old = t
	} else {
		b.tasks[t.RunID][t.TaskID] = &t
		b.rows = append(b.rows, &t)
	}
	return t.Attempt()
}

// PutRunning puts a running attempt that entered running at runningAt and
// last heartbeated at heartbeatAt (zero: never in this attempt).
func (b *Board) PutRunning(runID, taskID string, runningAt, heartbeatAt time.Time) sdk.Attempt {
	return b.Put(TaskInstance{RunID: runID, TaskID: taskID, State: sdk.StateRunning,
		QueuedAt: runningAt.Add(-time.Second), RunningAt: runningAt, LastHeartbeatAt: heartbeatAt})
}

// PutQueued puts a queued attempt stamped queued at queuedAt (zero: NULL).
func (b *Board) PutQueued(runID, taskID string, queuedAt time.Time) sdk.Attempt {
	return b.Put(TaskInstance{RunID: runID, TaskID: taskID, State: sdk.StateQueued, QueuedAt: queuedAt})
}

// Update applies fn to the row of (runID, taskID). It reports whether the
// row exists.
func (b *Board) Update(runID, taskID string, fn func(*TaskInstance)) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.tasks[runID][taskID]
	if ok {
		fn(t)
	}
	return ok
}

// Heartbeat stamps the row's heartbeat, as a live agent's heartbeat would.
func (b *Board) Heartbeat(runID, taskID string, at time.Time) bool {
	return b.Update(runID, taskID, func(t *TaskInstance) { t.LastHeartbeatAt = at })
}

// Replace starts a new execution of the row, the way the scheduler's rails
// do: the epoch is bumped (or the try, when newTry), the per-attempt
// timestamps, the infra confirmation, the recorded pod UID, the pod cache's
// history and the credential's mint and exchange are cleared,
// released_at is stamped and the row goes to state. It returns the new
// attempt.
func (b *Board) Replace(runID, taskID string, newTry bool, state string, at time.Time) sdk.Attempt {
	var a sdk.Attempt
	b.Update(runID, taskID, func(t *TaskInstance) {
		if newTry {
			t.Try++
		} else {
			t.Epoch++
		}
		t.QueuedAt, t.RunningAt, t.LastHeartbeatAt = time.Time{}, time.Time{}, time.Time{}
		t.InfraConfirmedAt, t.PodUID = time.Time{}, ""
		t.PodMissingMax, t.PodMissingSince = 0, time.Time{}
		t.CredentialMintedAt, t.CredentialExchangedAt = time.Time{}, time.Time{}
		t.ReleasedAt = at
		t.State = state
		t.Held = false
		a = t.Attempt()
	})
	return a
}

// Answers of ExchangeBootstrap: the values of the Postgres board's
// lifecycle.Exchange.
const (
	ExchangeApplied = "exchanged"
	ExchangeSpent   = "spent"
	ExchangeMovedOn = "moved_on"
)

// ExchangeBootstrap records the one exchange of a's bootstrap credential,
// minted at mintedAt, at now, with the Postgres board's guard: the row
// holds a queued, its run is running, no exchange is recorded and the
// recorded mint (if any) is mintedAt to the millisecond. Otherwise nothing
// changes and the answer is ExchangeSpent when a's exchange is recorded
// already, else ExchangeMovedOn.
func (b *Board) ExchangeBootstrap(a sdk.Attempt, mintedAt, now time.Time) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.tasks[a.RunID][a.TaskID]
	if !ok || t.Attempt() != a {
		return ExchangeMovedOn
	}
	r := b.runs[a.RunID]
	if r != nil && r.State == sdk.RunRunning && t.State == sdk.StateQueued && t.CredentialExchangedAt.IsZero() &&
		(t.CredentialMintedAt.IsZero() || t.CredentialMintedAt.UnixMilli() == mintedAt.UnixMilli()) {
		t.CredentialExchangedAt = now
		return ExchangeApplied
	}
	if !t.CredentialExchangedAt.IsZero() {
		return ExchangeSpent
	}
	return ExchangeMovedOn
}

// UpdateRun applies fn to the run. It reports whether the run exists.
func (b *Board) UpdateRun(runID string, fn func(*Run)) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.runs[runID]
	if ok {
		fn(r)
	}
	return ok
}

// LockRun makes another transaction hold (or release) the run's rows, so a
// reap of it is a no-op (locked).
func (b *Board) LockRun(runID string, locked bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.locked[runID] = locked
}

// Fail makes every later call of op return err (nil clears it).
func (b *Board) Fail(op Op, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err == nil {
		delete(b.errs, op)
		return
	}
	b.errs[op] = err
}

// OnList sets a hook called at the start of every ListCandidates.
func (b *Board) OnList(fn func(q sdk.CandidateQuery)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.onList = fn
}

// OnMark sets a hook called for each mark before its guard is checked: the
// place to move a row between a reaper's listing and its write.
func (b *Board) OnMark(fn func(m sdk.Mark)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.onMark = fn
}

// OnReapRun sets a hook called before a run reap re-checks its predicate.
func (b *Board) OnReapRun(fn func(r sdk.RunReap)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.onReapRun = fn
}

// --- inspection ---

// Task returns a copy of the row of (runID, taskID).
func (b *Board) Task(runID, taskID string) (TaskInstance, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.tasks[runID][taskID]
	if !ok {
		return TaskInstance{}, false
	}
	return *t, true
}

// Row returns a copy of the row that holds a's task, whatever attempt it
// holds now (the zero row when there is none).
func (b *Board) Row(a sdk.Attempt) TaskInstance {
	t, _ := b.Task(a.RunID, a.TaskID)
	return t
}

// Run returns a copy of the run.
func (b *Board) Run(runID string) (Run, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.runs[runID]
	if !ok {
		return Run{}, false
	}
	return *r, true
}

// Log returns the try log of an attempt.
func (b *Board) Log(a sdk.Attempt) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.logs[a])
}

// Marks returns every mark received, applied or not, in order.
func (b *Board) Marks() []sdk.Mark {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.marks)
}

// RunReaps returns every run reap received, in order.
func (b *Board) RunReaps() []sdk.RunReap {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.reaps)
}

// Writes counts the write calls received (Mark, ReapRun, AppendLog and
// the reconciler's writes).
func (b *Board) Writes() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.markCalls + len(b.reaps) + b.logCalls + b.reconcile
}

// Listings counts the listing calls received.
func (b *Board) Listings() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lists
}

// --- sdk.Board ---

// ListCandidates lists task instances as the Postgres board does: the
// threshold is applied before the limit, rows whose OrderBy timestamp is
// NULL are never listed, the order is (timestamp, run, task) ascending and
// the cursor is a keyset position in it. Next is nil on a short page.
func (b *Board) ListCandidates(ctx context.Context, q sdk.CandidateQuery) (sdk.CandidatePage, error) {
	if err := ctx.Err(); err != nil {
		return sdk.CandidatePage{}, fmt.Errorf("list candidates: %w", err)
	}
	b.mu.Lock()
	hook := b.onList
	b.mu.Unlock()
	if hook != nil {
		hook(q)
	}
	limit := ladder.ListLimit(q.Limit)
	if len(q.States) == 0 {
		return sdk.CandidatePage{}, errors.New("list candidates: no states named")
	}
	for _, st := range q.States {
		if !sdk.IsTaskState(st) {
			return sdk.CandidatePage{}, fmt.Errorf("list candidates: unknown state %q", st)
		}
	}
	if q.OlderThan.IsZero() {
		return sdk.CandidatePage{}, errors.New("list candidates: no threshold")
	}
	if len(q.Only) > ladder.PageSize {
		return sdk.CandidatePage{}, fmt.Errorf("list candidates: %d attempts named, at most %d", len(q.Only), ladder.PageSize)
	}
	switch q.OrderBy {
	case sdk.FieldQueuedAt, sdk.FieldRunningAt, sdk.FieldHeartbeatAt, sdk.FieldMarkedAt, sdk.FieldEndedAt:
	default:
		return sdk.CandidatePage{}, fmt.Errorf("list candidates: unknown order field %q", q.OrderBy)
	}
	switch q.Heartbeat {
	case sdk.HeartbeatAny, sdk.HeartbeatSeen, sdk.HeartbeatNever:
	default:
		return sdk.CandidatePage{}, fmt.Errorf("list candidates: unknown heartbeat filter %q", q.Heartbeat)
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	b.lists++
	if err := b.errs[OpListCandidates]; err != nil {
		return sdk.CandidatePage{}, fmt.Errorf("list candidates: %w", err)
	}
	oldest := newOldest(limit)
	for _, t := range b.rows {
		at := field(t, q.OrderBy)
		if at.IsZero() || !slices.Contains(q.States, t.State) {
			continue
		}
		if len(q.Executors) > 0 && !slices.Contains(q.Executors, t.Executor) {
			continue
		}
		if !at.Before(q.OlderThan) {
			continue
		}
		if q.Heartbeat == sdk.HeartbeatSeen && t.LastHeartbeatAt.IsZero() ||
			q.Heartbeat == sdk.HeartbeatNever && !t.LastHeartbeatAt.IsZero() {
			continue
		}
		if q.After != nil && compareKey(at, t.RunID, t.TaskID, q.After.At, q.After.RunID, q.After.TaskID) <= 0 {
			continue
		}
		if len(q.Only) > 0 && !slices.ContainsFunc(q.Only, func(a sdk.Attempt) bool {
			return a.RunID == t.RunID && a.TaskID == t.TaskID
		}) {
			continue
		}
		oldest.offer(row{at, t})
	}
	return oldest.page(), nil
}

// Mark applies guarded marks. A mark without an attempt, source states,
// kind or time is refused with an error (the board takes no unguarded
// write); a mark whose guard fails is a no-op with its reason.
func (b *Board) Mark(ctx context.Context, marks []sdk.Mark) ([]sdk.MarkResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("mark: %w", err)
	}
	for _, m := range marks {
		if err := validMark(m); err != nil {
			return nil, fmt.Errorf("mark %s: %w", m.Attempt, err)
		}
	}
	if err := onceEach("mark", marks, func(m sdk.Mark) sdk.Attempt { return m.Attempt }); err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.markCalls++
	err := b.errs[OpMark]
	hook := b.onMark
	b.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("mark: %w", err)
	}
	results := make([]sdk.MarkResult, 0, len(marks))
	for _, m := range marks {
		if hook != nil {
			hook(m)
		}
		results = append(results, b.markOne(m))
	}
	return results, nil
}

func (b *Board) markOne(m sdk.Mark) sdk.MarkResult {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.marks = append(b.marks, m)
	res := sdk.MarkResult{Attempt: m.Attempt}
	t, ok := b.tasks[m.RunID][m.TaskID]
	switch {
	case b.deposedLocked(m.Term, m.At):
		res.NoopReason = sdk.NoopDeposed
	case !ok:
		res.NoopReason = sdk.NoopNotFound
	default:
		res.NoopReason = m.Refusal(t.guardRow(b.runStateLocked(m.RunID)))
	}
	if res.NoopReason != "" {
		return res
	}
	t.State = sdk.StateFailed
	t.EndedAt = m.At
	// The row keeps the text made safe, as the Postgres board does.
	t.ErrorMessage = sdk.SafeText(m.Message, sdk.MaxMessageBytes)
	t.MarkReason = sdk.SafeText(m.Reason, sdk.MaxReasonBytes)
	t.Held = m.Hold
	switch m.Kind {
	case sdk.MarkInfra:
		t.LastFailureKind = sdk.FailureInfra
		t.InfraMarkedAt = m.At
		if m.Confirm {
			t.InfraConfirmedAt = m.At
		}
	case sdk.MarkTask:
		t.LastFailureKind = sdk.FailureTask
	}
	res.Applied = true
	return res
}

func validMark(m sdk.Mark) error {
	switch {
	case m.RunID == "" || m.TaskID == "":
		return errors.New("no attempt named")
	case len(m.FromStates) == 0:
		return errors.New("no source states named")
	case m.Kind != sdk.MarkInfra && m.Kind != sdk.MarkTask:
		return fmt.Errorf("unknown kind %q", m.Kind)
	case m.Term <= 0:
		return errors.New("no leadership term")
	case m.Reason == "":
		return errors.New("no reason")
	case m.At.IsZero():
		return errors.New("no time")
	}
	return nil
}

// ListOrphanRuns lists running runs with no live task instance whose last
// activity (the run's start and every row's queued, running, heartbeat,
// ended, released and infra-marked times) is older than the threshold,
// oldest activity first, by keyset.
func (b *Board) ListOrphanRuns(ctx context.Context, q sdk.RunQuery) (sdk.RunPage, error) {
	if err := ctx.Err(); err != nil {
		return sdk.RunPage{}, fmt.Errorf("list orphan runs: %w", err)
	}
	limit := ladder.ListLimit(q.Limit)
	if q.OlderThan.IsZero() {
		return sdk.RunPage{}, errors.New("list orphan runs: no threshold")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lists++
	if err := b.errs[OpListOrphanRuns]; err != nil {
		return sdk.RunPage{}, fmt.Errorf("list orphan runs: %w", err)
	}
	var runs []sdk.RunCandidate
	for _, r := range b.runs {
		last, live := b.runActivityLocked(r, q.ProvisionalAfter)
		if r.State != sdk.RunRunning || live || !last.Before(q.OlderThan) {
			continue
		}
		if q.After != nil && compareKey(last, r.RunID, "", q.After.At, q.After.RunID, "") <= 0 {
			continue
		}
		runs = append(runs, sdk.RunCandidate{RunID: r.RunID, DagID: r.DagID, StartedAt: r.StartedAt, LastActivity: last})
	}
	slices.SortFunc(runs, func(x, y sdk.RunCandidate) int {
		return compareKey(x.LastActivity, x.RunID, "", y.LastActivity, y.RunID, "")
	})
	page := sdk.RunPage{Runs: runs[:min(limit, len(runs))]}
	if len(runs) >= limit {
		last := runs[limit-1]
		page.Next = &sdk.RunCursor{At: last.LastActivity, RunID: last.RunID}
	}
	return page, nil
}

// ReapRun re-checks the orphan predicate atomically and fails the run only
// if it still holds: the run is running, no row of it is live, no activity
// is as recent as the threshold, and no other transaction holds its rows.
func (b *Board) ReapRun(ctx context.Context, r sdk.RunReap) (sdk.RunReapResult, error) {
	if err := ctx.Err(); err != nil {
		return sdk.RunReapResult{}, fmt.Errorf("reap run %s: %w", r.RunID, err)
	}
	if r.RunID == "" || r.OlderThan.IsZero() || r.At.IsZero() {
		return sdk.RunReapResult{}, fmt.Errorf("reap run %q: run, threshold and time are required", r.RunID)
	}
	b.mu.Lock()
	err := b.errs[OpReapRun]
	hook := b.onReapRun
	b.reaps = append(b.reaps, r)
	b.mu.Unlock()
	if err != nil {
		return sdk.RunReapResult{}, fmt.Errorf("reap run %s: %w", r.RunID, err)
	}
	if hook != nil {
		hook(r)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	run, ok := b.runs[r.RunID]
	switch {
	case b.deposedLocked(r.Term, r.At):
		return sdk.RunReapResult{NoopReason: sdk.NoopDeposed}, nil
	case !ok:
		return sdk.RunReapResult{NoopReason: sdk.NoopNotFound}, nil
	case b.locked[r.RunID]:
		return sdk.RunReapResult{NoopReason: sdk.NoopLocked}, nil
	case run.State != sdk.RunRunning:
		return sdk.RunReapResult{NoopReason: sdk.NoopMovedOn}, nil
	}
	if last, live := b.runActivityLocked(run, r.ProvisionalAfter); live || !last.Before(r.OlderThan) {
		return sdk.RunReapResult{NoopReason: sdk.NoopActive}, nil
	}
	run.State = sdk.RunFailed
	run.EndedAt = r.At
	run.FailedBy = sdk.SafeText(r.Message, sdk.MaxMessageBytes)
	res := sdk.RunReapResult{Applied: true}
	for _, t := range b.tasks[r.RunID] {
		if attached(t) {
			res.Attached = append(res.Attached, t.Attempt())
		}
	}
	slices.SortFunc(res.Attached, func(x, y sdk.Attempt) int { return cmp.Compare(x.TaskID, y.TaskID) })
	return res, nil
}

// attached: the row has had an execution that did not end in success or a
// skip, so an agent may still be attached to it.
func attached(t *TaskInstance) bool {
	switch t.State {
	case sdk.StateSuccess, sdk.StateSkipped, sdk.StateUpstreamFailed:
		return false
	}
	return !t.RunningAt.IsZero() || !t.QueuedAt.IsZero() || t.State == sdk.StateFailed
}

// AppendLog appends lines to try logs. A write from a term that is no
// longer current is a no-op, like every other write.
func (b *Board) AppendLog(ctx context.Context, term int64, lines []sdk.LogLine) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("append log: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.logCalls++
	if err := b.errs[OpAppendLog]; err != nil {
		return fmt.Errorf("append log: %w", err)
	}
	if term != b.term {
		return nil
	}
	for _, l := range lines {
		if l.RunID == "" || l.TaskID == "" {
			return errors.New("append log: line names no attempt")
		}
		b.logs[l.Attempt] = append(b.logs[l.Attempt], sdk.SafeText(l.Line, sdk.MaxLogLineBytes))
	}
	return nil
}

// runActivityLocked returns the run's last activity (sdk.ActivityAt of its
// rows, or its start) and whether a row of it is live, a provisional infra
// mark counting only when made after provisionalAfter.
func (b *Board) runActivityLocked(r *Run, provisionalAfter time.Time) (time.Time, bool) {
	last, live := r.StartedAt, false
	for _, t := range b.tasks[r.RunID] {
		live = live || t.guardRow(r.State).Live(provisionalAfter)
		if at := sdk.ActivityAt(t.QueuedAt, t.RunningAt, t.LastHeartbeatAt, t.ReleasedAt, t.EndedAt, t.InfraMarkedAt); at.After(last) {
			last = at
		}
	}
	return last, live
}

type row struct {
	at time.Time
	t  *TaskInstance
}

func (x row) compare(y row) int {
	return compareKey(x.at, x.t.RunID, x.t.TaskID, y.at, y.t.RunID, y.t.TaskID)
}

// oldestRows keeps the n oldest rows offered: a max-heap on the listing key,
// so a page costs one scan of the board and no full sort.
type oldestRows struct {
	n    int
	heap []row
}

func newOldest(n int) *oldestRows { return &oldestRows{n: n, heap: make([]row, 0, n)} }

func (o *oldestRows) offer(r row) {
	if len(o.heap) < o.n {
		o.heap = append(o.heap, r)
		for i := len(o.heap) - 1; i > 0; {
			parent := (i - 1) / 2
			if o.heap[parent].compare(o.heap[i]) >= 0 {
				break
			}
			o.heap[parent], o.heap[i] = o.heap[i], o.heap[parent]
			i = parent
		}
		return
	}
	if r.compare(o.heap[0]) >= 0 {
		return
	}
	o.heap[0] = r
	for i := 0; ; {
		largest, l, rt := i, 2*i+1, 2*i+2
		if l < len(o.heap) && o.heap[l].compare(o.heap[largest]) > 0 {
			largest = l
		}
		if rt < len(o.heap) && o.heap[rt].compare(o.heap[largest]) > 0 {
			largest = rt
		}
		if largest == i {
			return
		}
		o.heap[i], o.heap[largest] = o.heap[largest], o.heap[i]
		i = largest
	}
}

func (o *oldestRows) sorted() []row {
	slices.SortFunc(o.heap, row.compare)
	return o.heap
}

// page is the rows offered as a page of candidates, oldest first, with a
// cursor at the last when the page is full.
func (o *oldestRows) page() sdk.CandidatePage {
	rows := o.sorted()
	var page sdk.CandidatePage
	for _, r := range rows {
		page.Candidates = append(page.Candidates, candidate(r.t))
	}
	if len(rows) >= o.n {
		last := rows[o.n-1]
		page.Next = &sdk.Cursor{At: last.at, RunID: last.t.RunID, TaskID: last.t.TaskID}
	}
	return page
}

func field(t *TaskInstance, f sdk.TimeField) time.Time {
	switch f {
	case sdk.FieldQueuedAt:
		return t.QueuedAt
	case sdk.FieldRunningAt:
		return t.RunningAt
	case sdk.FieldHeartbeatAt:
		return t.LastHeartbeatAt
	case sdk.FieldMarkedAt:
		return t.InfraMarkedAt
	case sdk.FieldEndedAt:
		return t.EndedAt
	}
	return time.Time{}
}

func compareKey(at time.Time, run, task string, at2 time.Time, run2, task2 string) int {
	if c := at.Compare(at2); c != 0 {
		return c
	}
	if c := cmp.Compare(run, run2); c != 0 {
		return c
	}
	return cmp.Compare(task, task2)
}

func candidate(t *TaskInstance) sdk.Candidate {
	return sdk.Candidate{
		Attempt:          t.Attempt(),
		State:            t.State,
		Executor:         t.Executor,
		QueuedAt:         t.QueuedAt,
		RunningAt:        t.RunningAt,
		LastHeartbeatAt:  t.LastHeartbeatAt,
		ReleasedAt:       t.ReleasedAt,
		EndedAt:          t.EndedAt,
		InfraMarkedAt:    t.InfraMarkedAt,
		InfraConfirmedAt: t.InfraConfirmedAt,
		LastFailureKind:  t.LastFailureKind,
		FailureReason:    t.MarkReason,
		WarmWorker:       t.WarmWorker,
		ExecutionTimeout: t.ExecutionTimeout,
		PodUID:           t.PodUID,
	}
}

func earliest(ts ...time.Time) time.Time {
	var e time.Time
	for _, t := range ts {
		if !t.IsZero() && (e.IsZero() || t.Before(e)) {
			e = t
		}
	}
	return e
}

package sdk

import (
	"fmt"
	"strings"
	"time"

	"github.com/dexaflow/reaper/sdk/ladder"
)

// Attempt names one execution of a task instance. A mark, a teardown or a
// stop always names the whole tuple, so a newer execution of the same task
// (another try, or another epoch of the same try) is never the one touched.
type Attempt struct {
	RunID  string
	TaskID string
	Try    int32
	Epoch  int32
}

func (a Attempt) String() string {
	return fmt.Sprintf("%s/%s try=%d epoch=%d", a.RunID, a.TaskID, a.Try, a.Epoch)
}

// Task instance states (the board's task_instances.state).
const (
	StateNone            = "none"
	StateScheduled       = "scheduled"
	StateQueued          = "queued"
	StateRunning         = "running"
	StateSuccess         = "success"
	StateFailed          = "failed"
	StateSkipped         = "skipped"
	StateUpstreamFailed  = "upstream_failed"
	StateUpForRetry      = "up_for_retry"
	StateUpForReschedule = "up_for_reschedule"
	StateDeferred        = "deferred"
)

// Run states (the board's runs.state).
const (
	RunQueued  = "queued"
	RunRunning = "running"
	RunSuccess = "success"
	RunFailed  = "failed"
)

// Executors (the board's task_instances.executor).
const (
	ExecutorKube = "kube"
	ExecutorLite = "lite"
	ExecutorWarm = "warm"
)

// Failure kinds (the board's task_instances.last_failure_kind).
const (
	FailureTask  = "task"
	FailureInfra = "infra"
)

// Decision is one judgment of a reaper (or of the gate) about one attempt,
// one run, or the whole pass. The host meters, logs and audits every one.
type Decision struct {
	Reaper  string  // the plugin's label, filled by the host when empty
	Label   string  // one of the Label constants
	Attempt Attempt // the attempt judged; only RunID for run-level decisions
	Applied bool    // true when a write or a stop took effect
	DryRun  bool    // computed in dry-run: nothing was written
	Detail  string  // one line for people
	// Evidence is what the judgment saw: heartbeat age, liveness answer,
	// term, threshold, ... keyed by short snake_case names.
	Evidence map[string]string
}

// Pass is everything a reaper needs for one deterministic pass.
type Pass struct {
	Now      time.Time     // the host's clock: the only time a plugin reads
	Ladder   ladder.Ladder // thresholds in force
	Term     int64         // leadership term: every board write carries it
	DryRun   bool          // decide and report, write and stop nothing
	Deadline time.Time     // the phase budget's end
	State    []byte        // what the plugin returned from its previous pass
	Edition  string        // "lite" or "kube"
}

// PassResult is what a pass returns besides its decisions (which go to
// the pass's Sink): the state its next pass receives.
type PassResult struct {
	State []byte
}

// TimeField is a timestamp column candidates are filtered and ordered by.
type TimeField string

// Candidate time fields.
const (
	FieldQueuedAt    TimeField = "queued_at"
	FieldRunningAt   TimeField = "running_at"
	FieldHeartbeatAt TimeField = "last_heartbeat_at"
	FieldMarkedAt    TimeField = "infra_marked_at"
	// FieldEndedAt is when the attempt last ended or parked: a report of
	// up_for_retry, up_for_reschedule or a failure stamps it.
	FieldEndedAt TimeField = "ended_at"
)

// HeartbeatFilter selects on whether the current attempt has heartbeated.
type HeartbeatFilter string

// Heartbeat filters.
const (
	HeartbeatAny   HeartbeatFilter = ""
	HeartbeatSeen  HeartbeatFilter = "seen"
	HeartbeatNever HeartbeatFilter = "never"
)

// Cursor is a keyset position in a candidate listing.
type Cursor struct {
	At     time.Time
	RunID  string
	TaskID string
}

// CandidateQuery is a typed listing of task instances: those in States and
// Executors whose OrderBy timestamp is set and older than OlderThan, oldest
// first, after the cursor. The threshold is applied before the limit.
type CandidateQuery struct {
	States    []string
	Executors []string
	OrderBy   TimeField
	OlderThan time.Time
	Heartbeat HeartbeatFilter
	After     *Cursor
	Limit     int // at most ladder.DrainPage; 0 means ladder.PageSize
	// Only, when set, narrows the listing to the task instances of these
	// attempts' (run, task) pairs, whatever their current try and epoch
	// (at most ladder.PageSize of them). Protocol v1 addition: a host that
	// predates it lists as if it were unset, which only widens the page.
	Only []Attempt
}

// Candidate is one listed task instance (its current attempt).
type Candidate struct {
	Attempt
	State            string
	Executor         string
	QueuedAt         time.Time // zero when NULL
	RunningAt        time.Time
	LastHeartbeatAt  time.Time
	ReleasedAt       time.Time
	EndedAt          time.Time // the end of the attempt, or when it parked
	InfraMarkedAt    time.Time
	InfraConfirmedAt time.Time
	LastFailureKind  string
	FailureReason    string // the label of the last failure (agent_lost, ...); "" when none
	WarmWorker       string
	ExecutionTimeout time.Duration // 0: none declared
	// CredentialMintedAt is when the attempt's credential was minted (at
	// dispatch, by a runner on the attempt API); zero when none was.
	CredentialMintedAt time.Time
	// WarmClaimedAt is when the attempt's warm worker (WarmWorker) last
	// claimed, as the attempt API recorded it, when that claim said which
	// attempts the worker runs; zero when the board holds no such claim
	// (none recorded, or an older worker that did not say). Filled by
	// ListProvisional for warm attempts only (protocol v1 addition).
	WarmClaimedAt time.Time
	// WarmClaimHolds: that last claim listed this very attempt (same try
	// and epoch) among those the worker runs. Meaningful only when
	// WarmClaimedAt is set.
	WarmClaimHolds bool
	// PodUID is the UID of the pod the kube runner recorded for the
	// attempt ("" when none is: not created yet, a warm attempt, or a pod
	// from before UIDs were recorded). A substrate takes a pod for the
	// attempt's only when its UID is this one; "" keeps the label rule.
	PodUID string
}

// CandidatePage is one page of candidates. Next is nil when the page was
// short: the next listing starts over from the oldest.
type CandidatePage struct {
	Candidates []Candidate
	Next       *Cursor
}

// MarkKind says which rail a mark puts the attempt on.
type MarkKind string

// Mark kinds.
const (
	// MarkInfra fails the attempt on the infra rail: re-placed on the infra
	// budget, off the task's retries.
	MarkInfra MarkKind = "infra"
	// MarkTask fails the attempt as a task failure: its retry policy applies.
	MarkTask MarkKind = "task"
)

// Mark is a guarded transition of one attempt to failed. It applies only
// while the row still holds exactly this attempt (try and epoch), in one of
// FromStates, with the heartbeat guard satisfied, and while Term is the
// current leadership term. Otherwise it is a no-op, reported as such.
type Mark struct {
	Attempt
	FromStates []string
	// HeartbeatBefore, when set, also requires that the attempt has not
	// heartbeated since: last_heartbeat_at is NULL or older than it.
	HeartbeatBefore time.Time
	// RequireNoHeartbeat requires last_heartbeat_at to still be NULL.
	RequireNoHeartbeat bool
	Kind               MarkKind
	Reason             string // the label: agent_lost, dispatch_lost, credential_ceiling, ...
	Message            string // error_message: "<reason>: <detail>"
	// Confirm confirms an infra mark as it is made. A reaper plugin never
	// sets it: the host refuses such a mark (NoopConfirmRefused).
	// Confirmation is the sweep's word on Kubernetes; on Lite the host sets
	// it itself when the substrate reads the attempt dead at the call.
	Confirm bool
	// Hold holds the attempt for an operator's review: never re-placed
	// until released.
	Hold bool
	Term int64
	// At is the pass's time (Pass.Now), or zero. The host fences the mark
	// at its own clock at the call and refuses an At that is not the
	// pass's (NoopTimeRefused, AtTolerance).
	At time.Time
}

// Noop reasons of a mark or a run reap.
const (
	NoopMovedOn     = "moved_on"    // another try, epoch or state
	NoopHeartbeated = "heartbeated" // the heartbeat guard failed
	NoopDeposed     = "deposed"     // the term is no longer current
	NoopLocked      = "locked"      // another transaction holds a row
	NoopActive      = "active"      // the run has a live task instance or fresh activity
	NoopNotFound    = "not_found"   // no such row
	// NoopRunFinished: the run is no longer running (an override, a settle).
	NoopRunFinished = "run_finished"
	// NoopValveOpen: the infra mark is older than the override allows (the
	// confirmation valve has opened on it).
	NoopValveOpen = "valve_open"
	// NoopPodNotRecorded: the write was read from a pod the attempt does
	// not record: the attempt records another pod's UID, or, for a pod
	// that only its lossy labels tie to the attempt, none.
	NoopPodNotRecorded = "pod_not_recorded"
	// NoopSourceRefused: the write named a source state its kind may not
	// move an attempt from (MarkSourceStates, SettleSourceStates): a
	// terminal state above all. The board refuses it whole, whatever the
	// row holds, and the host audits the refusal.
	NoopSourceRefused = "source_refused"
	// NoopPassClosed: the write reached the host after the pass it belongs
	// to was closed (its share ran out, or the loop stopped): nothing of it
	// was written, and the host audits the refusal.
	NoopPassClosed = "pass_closed"
	// NoopRowRefused: PostgreSQL refused the write's own data (a value out
	// of range, say) when it was written alone, after the batch it came
	// in failed: nothing of it was written, and the rest of the batch was
	// applied as its guards said. Text never causes it: the board makes a
	// tenant's text safe first (SafeText).
	NoopRowRefused = "row_refused"
	// NoopTimeRefused: the write's At is not the pass's time (it lies
	// further than AtTolerance before the pass began, or after the host's
	// clock at the call): a plugin does not choose the time a write is
	// fenced at. Nothing of it was written, and the host audits the
	// refusal.
	NoopTimeRefused = "time_refused"
	// NoopConfirmRefused: a reaper's mark asked to be confirmed as it is
	// made. Only the substrate's sweep confirms an infra mark: nothing was
	// written, and the host audits the refusal.
	NoopConfirmRefused = "confirm_refused"
)

// AtTolerance is how far a write's At may lie before the start of the pass
// (or sweep) it belongs to, or after the host's clock at the call, and
// still be taken: a plugin sets At to its Pass.Now (SweepRequest.Now), or
// leaves it zero. Either way the host fences the write at its own clock at
// the call, never at the plugin's At.
const AtTolerance = 2 * time.Second

// MarkResult says whether one mark was applied.
type MarkResult struct {
	Attempt
	Applied    bool
	NoopReason string
	// RescheduleRefused, on an applied settlement that asked for
	// up_for_reschedule, is why the board refused the reschedule (a
	// Sensor.RescheduleRefusal label): the attempt was failed as a task
	// failure with that reason instead of parked. Protocol v1 addition: a
	// host that predates it leaves it empty.
	RescheduleRefused string
}

// RunCursor is a keyset position in a run listing.
type RunCursor struct {
	At    time.Time
	RunID string
}

// RunQuery lists running runs with no live task instance whose last
// activity is older than OlderThan, oldest activity first.
type RunQuery struct {
	OlderThan time.Time
	// ProvisionalAfter is the infra confirmation valve's cutoff: a
	// provisional infra mark made at or before it no longer keeps its run
	// alive (TaskRow.Live). Zero: every provisional mark does.
	ProvisionalAfter time.Time
	After            *RunCursor
	Limit            int // at most ladder.DrainPage; 0 means ladder.PageSize
}

// RunCandidate is a run that looked orphaned when listed.
type RunCandidate struct {
	RunID        string
	DagID        string
	StartedAt    time.Time
	LastActivity time.Time
}

// RunPage is one page of run candidates; Next is nil on a short page.
type RunPage struct {
	Runs []RunCandidate
	Next *RunCursor
}

// RunReap fails an orphaned run after re-checking, atomically, that it is
// still running, has no live task instance and no activity since OlderThan.
type RunReap struct {
	RunID     string
	OlderThan time.Time
	// ProvisionalAfter is the valve's cutoff, as in RunQuery.
	ProvisionalAfter time.Time
	Term             int64
	At               time.Time
	Message          string
}

// RunReapResult reports a run reap. Attached lists task instances whose
// attempts were still attached to the run when it failed (their agents are
// answered should_terminate from then on).
type RunReapResult struct {
	Applied    bool
	NoopReason string
	Attached   []Attempt
}

// ProvisionalQuery lists provisional infra marks: attempts failed on the
// infra rail whose mark the reconciler has not confirmed yet (kube), of the
// given executors (all when empty), oldest mark first, after the cursor
// (keyset over infra_marked_at, run, task).
type ProvisionalQuery struct {
	Executors []string
	After     *Cursor
	Limit     int // at most ladder.DrainPage; 0 means ladder.PageSize
	// Only, when set, narrows the listing to the task instances of these
	// attempts' (run, task) pairs, whatever their current try and epoch
	// (at most ladder.PageSize of them). Protocol v1 addition: a host that
	// predates it lists as if it were unset, which only widens the page.
	Only []Attempt
}

// Confirm confirms one provisional infra mark once the reconciler has seen
// that nothing of the attempt runs on: the planner may then act on it. It
// applies only while the row holds exactly this attempt with its mark
// still provisional, and while Term is current.
type Confirm struct {
	Attempt
	Term int64
	At   time.Time
}

// Override settles an attempt as a success over its provisional infra mark,
// because the attempt left a durable SUCCESS record. It applies only while
// the row holds exactly this attempt, its mark is still provisional and was
// made after MarkedAfter (the infra confirmation valve has not opened), the
// run is still running, and Term is current. In the same write it clears
// the infra kind and appends "outcome recovered from the durable record over
// <mark>" to the attempt's log.
type Override struct {
	Attempt
	MarkedAfter time.Time
	// EndedAt is when the attempt really ended, as its record or its
	// container says (zero: At); the attempt's ended_at, from which its
	// duration is measured (reaperctl tune), is this, not the sweep's time.
	EndedAt time.Time
	// PodUID is the UID of the pod that holds the SUCCESS record. When the
	// attempt records a pod UID and it is another, the override is
	// NoopPodNotRecorded (someone else made that pod).
	PodUID string
	// LossyPod: that pod names its task only by the lossy task-id label (it
	// carries no exact task id), so its labels do not tie it to this task.
	// The override then also requires the attempt's recorded pod UID to be
	// PodUID (else NoopPodNotRecorded). Protocol v1 addition: a host that
	// predates it overrides as if it were unset.
	LossyPod bool
	Term     int64
	At       time.Time
}

// MaxPodSightings is the most sightings one RecordPodSightings call takes.
const MaxPodSightings = ladder.DrainPage

// PodSighting is what the kube substrate's pod cache saw of one attempt's
// pod since the last sweep, for the history of pod_lost_floor: windows in
// which the cache held no pod of an attempt that ran on. It is a history
// stamp, never a verdict: it changes no state and reaps nothing.
//
// SeenAt (zero: none) is the last time the cache received the pod already
// Running without having held it (not in the cache's first list after the
// substrate started: then the substrate, not the cache, was missing): the
// cache had no pod of the attempt up to then. MissingAt (zero: none) is
// the first time after SeenAt that the cache saw the pod deleted: a window
// opened that only the attempt's own later signs of life can end.
//
// The board keeps, for the attempt, the largest SeenAt - running_at
// (pod_missing_max) and the start of a window left open (pod_missing_since).
// A sighting applies only to exactly its attempt, running on kube, whose
// recorded pod UID is PodUID (see Refusal), under the current Term; each
// task instance at most once a batch.
type PodSighting struct {
	Attempt
	PodUID    string
	SeenAt    time.Time
	MissingAt time.Time
	Term      int64
	At        time.Time
}

// Outcome is how a finished execution ended, as its durable outcome record
// (or the cluster, for a disrupted pod) says.
type Outcome string

// Outcomes.
const (
	OutcomeSuccess    Outcome = "success"    // settled success
	OutcomeFailed     Outcome = "failed"     // a task failure: its retry policy applies
	OutcomeReschedule Outcome = "reschedule" // parked up_for_reschedule
	OutcomeInfra      Outcome = "infra"      // an infra failure, confirmed as it is made
)

// Failure reasons the reconciler settles on the infra rail; each is also
// the start of the error_message.
const (
	ReasonPodDisrupted            = "pod_disrupted"
	ReasonControlPlaneUnavailable = "control_plane_unavailable"
)

// Settlement settles a finished attempt from its outcome. It applies only
// while the row holds exactly this attempt in one of FromStates, and while
// Term is current; otherwise it is a no-op reported as such.
type Settlement struct {
	Attempt
	Outcome    Outcome
	FromStates []string
	// Reason is the failure's label for OutcomeFailed and OutcomeInfra
	// (pod_disrupted, control_plane_unavailable, ...); Message the
	// error_message, starting with it.
	Reason  string
	Message string
	// EndedAt is when the attempt really ended, as its record or its
	// container says (zero: At).
	EndedAt time.Time
	// PodUID is the UID of the pod the outcome was read from ("" when none).
	// When the attempt records a pod UID and it is another, the settlement
	// is NoopPodNotRecorded (someone else made that pod); an attempt that
	// records none (a pod from before UIDs were recorded) keeps the label
	// rule.
	PodUID string
	// LossyPod: that pod names its task only by the lossy task-id label (it
	// carries no exact task id), so Attempt.TaskID is the label's value, not
	// a task id. The board then settles the task instance of Attempt.RunID
	// whose recorded pod UID is PodUID (Try, Epoch and FromStates still
	// guard it), never one found by the task id; when no task instance of
	// the run records PodUID the settlement is NoopNotFound. The result
	// names the attempt it resolved to. Protocol v1 addition: a host that
	// predates it settles by the label's value, as before.
	LossyPod bool
	Term     int64
	At       time.Time
}

// LogLine is one line appended to an attempt's try log.
type LogLine struct {
	Attempt
	At   time.Time
	Line string
}

// Liveness is a three-valued answer: unknown always defers.
type Liveness string

// Liveness values.
const (
	Alive   Liveness = "alive"
	Dead    Liveness = "dead"
	Unknown Liveness = "unknown"
)

// LivenessRequest asks about a batch of attempts.
type LivenessRequest struct {
	Attempts []Attempt
	// Live asks for an authoritative read, not a cache (kube).
	Live bool
	Now  time.Time
	// PodUIDs are the pod UIDs recorded on the attempts (Candidate.PodUID),
	// where the caller has them (kube): only the pod of that UID counts
	// for the attempt. An attempt absent or "" keeps the label rule.
	// Protocol v1 addition: a host that predates it sends none.
	PodUIDs map[Attempt]string
}

// FeedCursor is a position in a substrate's change feed. Generation names
// one unbroken stretch of the substrate's view (it changes whenever the view
// relists, loses its watch or restarts); Seq counts the changes within it.
// The zero cursor asks for the current position only.
type FeedCursor struct {
	Generation string
	Seq        uint64
}

// FeedChanges answers a change feed read: the attempts whose pods the
// substrate's view saw deleted after the cursor asked from, and the cursor
// to ask from next time.
type FeedChanges struct {
	Cursor FeedCursor
	// Complete: Gone holds every deletion the view saw since the cursor
	// asked from. False when it cannot say (another generation, changes
	// dropped, the view not synced): the caller must look at everything.
	Complete bool
	Gone     []Attempt
	Detail   string // why the answer is not complete
}

// AttemptLiveness is the substrate's answer for one attempt.
type AttemptLiveness struct {
	Attempt
	State Liveness // the attempt as a whole: alive if anything of it lives
	Agent Liveness // the agent process (lite) or the attempt's pod (kube)
	Group Liveness // the recorded task process group (lite)
	// Orphan: the agent is confirmed dead while its recorded, verified task
	// group lives on, so the group may be stopped (StopOrphan).
	Orphan bool
	// Pending: only a Pending pod of the attempt exists, none Running (kube).
	Pending bool
	Detail  string
	// Node names the node every pod of the attempt that may still run is
	// bound to when that node is not Ready (kube): its Ready condition is
	// Unknown (the node stopped reporting) or False. Empty while the node
	// is Ready, when it was not read, or when a pod of the attempt has
	// finished or is on a Ready node.
	Node string
	// NodeUnreachableSince is when Node's Ready condition left True (its
	// lastTransitionTime); zero when Node is empty.
	NodeUnreachableSince time.Time
	// NodeError: a node of the attempt's pods could not be read, so
	// whether it is reachable is unknown (kube).
	NodeError string
}

// TeardownRequest asks the substrate to stop exactly one attempt's
// execution (Attempt set) or every execution of a run (RunID set).
type TeardownRequest struct {
	Attempt *Attempt
	RunID   string
	Reason  string
	Term    int64
	// PodUID, with Attempt, is the pod UID recorded on the attempt
	// (Candidate.PodUID): only the pod of that UID is torn down. "" keeps
	// the label rule. Protocol v1 addition: a host that predates it sends
	// none.
	PodUID string
}

// Teardown actions.
const (
	TeardownStoppedInPlace = "stopped_in_place"
	TeardownDeleted        = "deleted"
	TeardownSkipTerminal   = "skipped_terminal"
	TeardownDeleteFallback = "delete_fallback"
	TeardownNothing        = "nothing"
)

// TeardownOutcome is what happened to one object.
type TeardownOutcome struct {
	Object string
	Action string
	Error  string
}

// TeardownGone begins the Error of an outcome whose object was already gone
// when it was to be stopped (deleted, or replaced by another object of the
// same name): nothing of it is left to stop.
const TeardownGone = "gone: "

// Incomplete reports whether the outcome leaves its object possibly still
// running: it carries an error, and the error is not TeardownGone's.
func (o TeardownOutcome) Incomplete() bool {
	return o.Error != "" && !strings.HasPrefix(o.Error, TeardownGone)
}

// Stop reasons.
const (
	StopOrphan            = "orphan"
	StopCredentialCeiling = "credential_ceiling"
)

// StopRequest asks the substrate to stop an attempt's recorded task group.
type StopRequest struct {
	Attempt
	Reason string
}

// StopResult says whether the group is gone. A stop that needs longer
// than the caller can wait (a group that ignores SIGTERM is given its
// grace, then SIGKILL) goes on after the call: InFlight says so, and the
// caller asks again on a later pass, which answers Stopped once it is over.
type StopResult struct {
	Stopped  bool
	InFlight bool
	Detail   string
}

// SweepRequest starts one reconcile sweep.
type SweepRequest struct {
	Now    time.Time
	Term   int64
	DryRun bool
	Ladder ladder.Ladder
}

// SweepResult reports a sweep: its decisions, and the durable SUCCESS
// overrides it made, counted by the mark they overrode.
type SweepResult struct {
	Decisions []Decision
	Overrides map[string]int64
}

// WarmWorker is one warm pool pod.
type WarmWorker struct {
	Name  string
	Phase string
}

// EndOf is when an attempt settled from an outcome ended: ended when it
// says so, else at.
func EndOf(ended, at time.Time) time.Time {
	if ended.IsZero() {
		return at
	}
	return ended
}

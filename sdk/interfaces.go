package sdk

import (
	"context"

	"github.com/dexaflow/reaper/sdk/ladder"
)

// Plugin kinds.
const (
	KindReaper    = "reaper"
	KindSubstrate = "substrate"
)

// Info describes a plugin.
type Info struct {
	Name        string   // the label it is configured under: agentlost, lite, ...
	Kind        string   // KindReaper or KindSubstrate
	Version     string   // the plugin's own version
	Editions    []string // editions it serves: "lite", "kube"
	Description string
	// MarkReasons are the failure reasons a reaper's writes leave on the
	// board (each sdk.Mark's Reason; orphan_run for a run it reaps). The
	// host files under the reaper's name a write it finds on the board
	// without its decision and audits itself. Empty for a substrate.
	MarkReasons []string
	// DecisionLabels are the labels a reaper's decisions may carry (its
	// MarkReasons and CommonLabels need not be repeated): the host meters
	// and audits a decision only under a label its plugin declared here
	// when it was launched, and refuses any other (see AllowedLabels).
	// Protocol v1 addition: a plugin built before it declares none, and
	// may record only CommonLabels and its MarkReasons.
	DecisionLabels []string
	// KillLabels are those of its MarkReasons and DecisionLabels whose
	// decision fails an attempt (in a dry run, what it would have done):
	// the host scores such a dry-run decision against what became of the
	// attempt (reaper_shadow_verdicts_total, reaperctl shadow) and opens
	// the reaper's would_have_killed_live_work series for each ahead of
	// its first verdict. Protocol v1 addition, like DecisionLabels: a
	// plugin that declares none keeps the sdk's built-in kill labels among
	// its declared ones (DeclaredKillLabels).
	KillLabels []string
	// ProvisionalLabels are those of its KillLabels whose mark is an
	// infra mark, which stays provisional on kube until the reconciler
	// confirms it and which a durable SUCCESS may still override: the
	// host scores an applied one too (under policy = "hold", or on kube).
	ProvisionalLabels []string
}

// ConfigureRequest carries a plugin's decoded configuration block.
type ConfigureRequest struct {
	Edition string
	Values  Values
	Ladder  ladder.Ladder
}

// Plugin is what every plugin serves: who it is, the configuration it
// accepts, and the configuration the host decoded for it.
type Plugin interface {
	Info(ctx context.Context) (Info, error)
	// ConfigSchema declares the attributes of the plugin's HCL block. The
	// host decodes the block against it, so a bad file fails at validate.
	ConfigSchema(ctx context.Context) (Schema, error)
	// Configure receives the decoded block. It is called once before any
	// other call, and again whenever the host restarts the plugin.
	Configure(ctx context.Context, req ConfigureRequest) error
}

// Board is the scheduler's metadatabase as far as reaping needs it. The host
// serves it; plugins reach it through the broker. Every write is guarded and
// fenced by the leadership term.
type Board interface {
	// ListCandidates returns one page of task instances matching q.
	ListCandidates(ctx context.Context, q CandidateQuery) (CandidatePage, error)
	// Mark applies a batch of guarded marks in one round trip. A mark whose
	// guard fails is a no-op reported in its result, never an error.
	Mark(ctx context.Context, marks []Mark) ([]MarkResult, error)
	// ListOrphanRuns returns one page of runs that look orphaned.
	ListOrphanRuns(ctx context.Context, q RunQuery) (RunPage, error)
	// ReapRun fails a run after re-checking the orphan predicate atomically.
	ReapRun(ctx context.Context, r RunReap) (RunReapResult, error)
	// AppendLog appends lines to attempts' try logs.
	AppendLog(ctx context.Context, term int64, lines []LogLine) error

	// The reconciler's writes (a substrate's Sweep). Each is a batch that
	// answers one result per request, in order; a request whose guard fails
	// (another attempt, another state, a term that no longer leads or whose
	// lease has run out at its At) is a no-op with a NoopReason, never an
	// error. An error means nothing was written.

	// ListProvisional returns one page of provisional infra marks: failed
	// on the infra rail, not yet confirmed, oldest mark first, by keyset.
	ListProvisional(ctx context.Context, q ProvisionalQuery) (CandidatePage, error)
	// ConfirmInfra confirms provisional infra marks: the planner may then
	// re-place (or finally fail) their tasks.
	ConfirmInfra(ctx context.Context, cs []Confirm) ([]MarkResult, error)
	// OverrideInfra settles attempts as successes over their provisional
	// infra marks from a durable SUCCESS record, and appends "outcome
	// recovered from the durable record over <mark>" to each one's log in
	// the same write.
	OverrideInfra(ctx context.Context, os []Override) ([]MarkResult, error)
	// Settle settles finished attempts from their outcome records.
	Settle(ctx context.Context, ss []Settlement) ([]MarkResult, error)
	// RecordPodSightings records what the pod cache saw of running kube
	// attempts' pods (at most MaxPodSightings): the history reaperctl
	// replay judges pod_lost_floor by. It changes no state, so a dry run
	// records it too.
	RecordPodSightings(ctx context.Context, ss []PodSighting) ([]MarkResult, error)
}

// Executions is the part of a substrate a reaper uses: the world where
// attempts execute, asked about and acted on one pinned attempt at a time.
type Executions interface {
	// Liveness answers for each attempt alive, dead or unknown.
	Liveness(ctx context.Context, req LivenessRequest) ([]AttemptLiveness, error)
	// Teardown stops exactly the named attempt (or every execution of the
	// named run). Best effort: outcomes say what happened to each object.
	Teardown(ctx context.Context, req TeardownRequest) ([]TeardownOutcome, error)
	// StopOrphan stops an attempt's recorded, verified task group and
	// reports stopped only when nothing of it remains.
	StopOrphan(ctx context.Context, req StopRequest) (StopResult, error)
	// WarmWorkers lists the warm pool's pods with a live read.
	WarmWorkers(ctx context.Context) ([]WarmWorker, error)
}

// ChangeFeed is an optional part of Executions (the kube substrate serves
// it): what the substrate's view of the fleet saw change since a cursor,
// so that a reaper may look only at what changed in the steady state. A
// reaper finds it by a type assertion; an error, or an answer that is not
// Complete, means the reaper must look at everything. Over go-plugin it is
// the Substrate service's Changes call, which a plugin built before it
// answers Unimplemented (an error, so everything is looked at).
type ChangeFeed interface {
	Changes(ctx context.Context, since FeedCursor) (FeedChanges, error)
}

// Substrate is a substrate plugin: the executions world plus the reconcile
// phase the host runs before reaping.
type Substrate interface {
	Plugin
	Executions
	// Sweep is the reconcile phase: settle finished executions' outcomes.
	Sweep(ctx context.Context, req SweepRequest, board Board) (SweepResult, error)
	// Synced reports whether the substrate's view of the fleet is complete.
	Synced(ctx context.Context) (bool, error)
}

// Sink receives the decisions of a pass as the reaper makes them. The host
// meters, logs and audits each one. Record may keep ds: neither the
// decisions nor their evidence maps may change once recorded. An error
// means the decisions could not be delivered (the host went away); the
// pass should end with it.
type Sink interface {
	Record(ctx context.Context, ds []Decision) error
}

// Reaper is a reaper plugin: policy over the board and the substrate.
type Reaper interface {
	Plugin
	// Reap runs one pass. It must return before pass.Deadline (the context
	// carries it too). Every judgment it makes, one per attempt or run it
	// judged, goes to sink, as it goes or at the end; decisions recorded
	// before an error are kept. It returns the state to hand to its next
	// pass; a pass that fails may return one too (nil: the host keeps the
	// previous state).
	Reap(ctx context.Context, pass Pass, board Board, exec Executions, sink Sink) (PassResult, error)
}

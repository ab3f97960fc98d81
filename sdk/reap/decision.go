package reap

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// Evidence keys. A decision's evidence says what the judgment saw.
const (
	EvTerm             = "term"
	EvEdition          = "edition"
	EvState            = "state"
	EvExecutor         = "executor"
	EvThreshold        = "threshold"
	EvHeartbeatAge     = "heartbeat_age" // "never" when the attempt has not heartbeated
	EvRunningAge       = "running_age"
	EvQueuedAge        = "queued_age"
	EvPodUID           = "pod_uid" // the pod UID recorded on the attempt (kube), when one is
	EvActivityAge      = "activity_age"
	EvLiveness         = "liveness" // the attempt as a whole, or "error"
	EvAgent            = "agent"
	EvGroup            = "group"
	EvOrphan           = "orphan"
	EvPending          = "pending"
	EvLivenessDetail   = "liveness_detail"
	EvLivenessLive     = "liveness_live" // the read was authoritative, not a cache
	EvSignal           = "signal"        // "positive" or "silence"
	EvMark             = "mark"          // the reason the mark carries
	EvPolicy           = "policy"
	EvNoopReason       = "noop_reason"
	EvStop             = "stop"
	EvTeardown         = "teardown"
	EvError            = "error"
	EvAttached         = "attached"
	EvCeiling          = "ceiling"
	EvBrakeJudged      = "brake_judged"
	EvBrakeSilenceOnly = "brake_silence_only"
	EvBrakeAllowed     = "brake_allowed"
	EvBrakeShare       = "brake_share"
	// The node of the attempt's pods when it is not Ready (kube), since
	// when (RFC 3339), or why it could not be read.
	EvNode                 = "node"
	EvNodeUnreachableSince = "node_unreachable_since"
	EvNodeError            = "node_error"
)

// Signal values.
const (
	SignalPositive = "positive"
	SignalSilence  = "silence"
)

// Evidence is a decision's evidence under construction.
type Evidence map[string]string

// With returns e with key set (e is modified).
func (e Evidence) With(key, value string) Evidence {
	e[key] = value
	return e
}

// Clone copies e.
func (e Evidence) Clone() Evidence {
	out := make(Evidence, len(e)+4)
	for k, v := range e {
		out[k] = v
	}
	return out
}

// Age formats the time since t, or "never" when t is zero.
func Age(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return now.Sub(t).Round(time.Millisecond).String()
}

// evidenceSize is room for the evidence of a decision about a listed
// attempt, everything a reaper adds included.
const evidenceSize = 20

// CandidateEvidence is what every decision about a listed attempt carries.
func CandidateEvidence(pass sdk.Pass, c sdk.Candidate, threshold time.Duration) Evidence {
	// Sized for what a reaper adds after it (liveness, signal, mark...), so
	// that the map is not grown and rehashed on the way.
	e := make(Evidence, evidenceSize)
	e[EvTerm] = strconv.FormatInt(pass.Term, 10)
	e[EvEdition] = pass.Edition
	e[EvState] = c.State
	e[EvExecutor] = c.Executor
	e[EvThreshold] = threshold.String()
	e[EvHeartbeatAge] = Age(pass.Now, c.LastHeartbeatAt)
	if !c.RunningAt.IsZero() {
		e[EvRunningAge] = Age(pass.Now, c.RunningAt)
	}
	if !c.QueuedAt.IsZero() {
		e[EvQueuedAge] = Age(pass.Now, c.QueuedAt)
	}
	if c.PodUID != "" {
		e[EvPodUID] = c.PodUID
	}
	return e
}

// Liveness adds a substrate's answer to e.
func (e Evidence) Liveness(a Answer) Evidence {
	e[EvLivenessLive] = strconv.FormatBool(a.Live)
	if a.Err != nil {
		e[EvLiveness] = "error"
		e[EvLivenessDetail] = a.Err.Error()
		return e
	}
	e[EvLiveness] = string(a.State)
	if a.Agent != "" {
		e[EvAgent] = string(a.Agent)
	}
	if a.Group != "" {
		e[EvGroup] = string(a.Group)
	}
	if a.Orphan {
		e[EvOrphan] = "true"
	}
	if a.Pending {
		e[EvPending] = "true"
	}
	if a.Detail != "" {
		e[EvLivenessDetail] = a.Detail
	}
	if a.Node != "" {
		e[EvNode] = a.Node
		e[EvNodeUnreachableSince] = a.NodeUnreachableSince.UTC().Format(time.RFC3339)
	}
	if a.NodeError != "" {
		e[EvNodeError] = a.NodeError
	}
	return e
}

// Recorder builds the decisions of one pass and hands them to the pass's
// sink a batch at a time.
type Recorder struct {
	reaper string
	pass   sdk.Pass
	sink   sdk.Sink
	ds     []sdk.Decision
	sent   int // ds[:sent] went to the sink
	counts map[string]int
}

// flushAt is how many decisions wait before Flush hands them to the sink:
// a page's worth and more, so a drain records about once a page.
const flushAt = 100

// NewRecorder starts the decisions of a pass of the named reaper, recorded
// into sink.
func NewRecorder(reaper string, pass sdk.Pass, sink sdk.Sink) *Recorder {
	return &Recorder{reaper: reaper, pass: pass, sink: sink, counts: map[string]int{}}
}

// Add records one decision. In a dry run nothing is applied, whatever the
// caller says.
func (r *Recorder) Add(label string, a sdk.Attempt, applied bool, detail string, ev Evidence) {
	r.ds = append(r.ds, sdk.Decision{
		Reaper:   r.reaper,
		Label:    label,
		Attempt:  a,
		Applied:  applied && !r.pass.DryRun,
		DryRun:   r.pass.DryRun,
		Detail:   detail,
		Evidence: ev,
	})
	r.counts[label]++
}

// Flush hands the waiting decisions to the sink once there are flushAt of
// them, so a long drain's decisions reach the host while it goes on.
func (r *Recorder) Flush(ctx context.Context) error {
	if len(r.ds)-r.sent < flushAt {
		return nil
	}
	return r.Close(ctx)
}

// Close hands every waiting decision to the sink. The pass runner calls it
// at the end of a pass, whichever way the pass ended.
func (r *Recorder) Close(ctx context.Context) error {
	if r.sent == len(r.ds) {
		return nil
	}
	batch := r.ds[r.sent:len(r.ds):len(r.ds)]
	r.ds = r.ds[len(r.ds):] // what the sink holds is never touched again
	r.sent = 0
	if err := r.sink.Record(ctx, batch); err != nil {
		return fmt.Errorf("record %d decisions: %w", len(batch), err)
	}
	return nil
}

// Count counts the decisions of the pass with the label.
func (r *Recorder) Count(label string) int { return r.counts[label] }

func (r *Recorder) total() int {
	n := 0
	for _, c := range r.counts {
		n += c
	}
	return n
}

// ApplyMarks sends marks to the board in batches of at most MarkBatch and
// returns one result per mark, in order.
func ApplyMarks(ctx context.Context, board sdk.Board, marks []sdk.Mark) ([]sdk.MarkResult, error) {
	out := make([]sdk.MarkResult, 0, len(marks))
	for start := 0; start < len(marks); start += MarkBatch {
		batch := marks[start:min(start+MarkBatch, len(marks))]
		res, err := board.Mark(ctx, batch)
		if err != nil {
			return out, fmt.Errorf("mark %d attempts: %w", len(batch), err)
		}
		if len(res) != len(batch) {
			return out, fmt.Errorf("mark %d attempts: board answered %d results", len(batch), len(res))
		}
		out = append(out, res...)
	}
	return out, nil
}

// TeardownTrouble sums up a teardown: whether it failed (a call error or an
// object's error), whether the delete fallback was used, and a one-line
// summary of what happened to each object.
func TeardownTrouble(outcomes []sdk.TeardownOutcome, err error) (failed, fallback bool, summary string) {
	parts := make([]string, 0, len(outcomes)+1)
	if err != nil {
		failed = true
		parts = append(parts, "error: "+err.Error())
	}
	for _, o := range outcomes {
		p := o.Object + ":" + o.Action
		if o.Error != "" {
			failed = true
			p += " (" + o.Error + ")"
		}
		if o.Action == sdk.TeardownDeleteFallback {
			fallback = true
		}
		parts = append(parts, p)
	}
	return failed, fallback, strings.Join(parts, "; ")
}

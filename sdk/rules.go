package sdk

import (
	"errors"
	"slices"
	"time"
)

// The board's rules, written once. The Postgres board builds its SQL from
// the state lists below and explains a no-op with the guards below; the
// in-memory board (sdktest) decides with them; one conformance suite holds
// both to the same answers.

// TaskStates returns every task instance state, in the schema's order.
func TaskStates() []string {
	return []string{StateNone, StateScheduled, StateQueued, StateRunning, StateSuccess, StateFailed,
		StateSkipped, StateUpstreamFailed, StateUpForRetry, StateUpForReschedule, StateDeferred}
}

// LiveStates returns the states in which a task instance keeps its run
// alive whatever else its row says: still on its way to execute or
// executing (scheduled, queued, running), or parked until the scheduler
// brings it back (up_for_retry, up_for_reschedule, deferred). Those parked
// states stamp no fresh activity, so without them a long retry delay or
// poke interval would get a healthy run reaped as orphaned.
func LiveStates() []string {
	return []string{StateScheduled, StateQueued, StateRunning, StateUpForRetry, StateUpForReschedule, StateDeferred}
}

// SettledStates returns the complement of LiveStates: never started
// (none), or ended. A row in one of them is still live when it is held for
// review, an infra failure the planner will re-place, or a provisional
// infra mark inside its valve (TaskRow.Live).
func SettledStates() []string {
	return slices.DeleteFunc(TaskStates(), func(s string) bool { return slices.Contains(LiveStates(), s) })
}

// IsTaskState reports whether s is a task instance state.
func IsTaskState(s string) bool { return slices.Contains(TaskStates(), s) }

// TaskRow is a task instance as the board's guards read it. Zero times
// stand for NULL.
type TaskRow struct {
	Attempt
	State            string
	LastFailureKind  string
	LastHeartbeatAt  time.Time
	InfraMarkedAt    time.Time
	InfraConfirmedAt time.Time
	// InfraBudget and InfraUsed are the task's infra re-places allowed and
	// spent: the planner re-places an infra failure while used < budget.
	InfraBudget int32
	InfraUsed   int32
	// Held: failed and held for an operator's review (held_at set).
	Held bool
	// RunState is the state of the row's run.
	RunState string
	// PodUID is the UID of the pod recorded for the current attempt (kube;
	// "" when none is).
	PodUID string
	// Executor and RunningAt are the row's executor and the current
	// attempt's running_at (zero: not running yet): what a PodSighting is
	// judged by.
	Executor  string
	RunningAt time.Time
	// Sensor, SensorTimeout, FirstPokeAt and TryDispatchedAt are what
	// RescheduleRefusal judges (see Sensor).
	Sensor Sensor
}

// Provisional reports whether the row is a provisional infra mark: failed
// on the infra rail and not confirmed yet. The planner still treats such a
// task as active (Kubernetes: the reconciler has not seen its pods gone).
func (r TaskRow) Provisional() bool {
	return r.State == StateFailed && r.LastFailureKind == FailureInfra && r.InfraConfirmedAt.IsZero()
}

// Replaceable reports whether the row is an infra failure the planner will
// re-place: failed on the infra rail, not held, with infra budget left. It
// waits for its next attempt the way a parked up_for_retry does, whether
// its mark is confirmed or not.
func (r TaskRow) Replaceable() bool {
	return r.State == StateFailed && r.LastFailureKind == FailureInfra && !r.Held && r.InfraUsed < r.InfraBudget
}

// Live reports whether the row keeps its run alive: a live state, an
// attempt held for an operator's review, an infra failure the planner will
// re-place, or a provisional infra mark made after provisionalAfter (the
// infra confirmation valve's cutoff: past it the planner acts on the mark
// unconfirmed, so the mark no longer holds the run). A zero provisionalAfter
// puts no bound on a provisional mark.
func (r TaskRow) Live(provisionalAfter time.Time) bool {
	return slices.Contains(LiveStates(), r.State) || r.Held || r.Replaceable() ||
		(r.Provisional() && (provisionalAfter.IsZero() || r.InfraMarkedAt.After(provisionalAfter)))
}

// ActivityAt returns the latest activity stamped on the row's attempt
// (zero when none): its queue, running and heartbeat stamps, its release,
// and its end unless an infra mark ended it. The reaper's own marks are not
// the run's activity: a run whose attempt a mark failed is measured from
// what the attempt last did, so the mark does not restart the orphan clock.
func ActivityAt(queuedAt, runningAt, heartbeatAt, releasedAt, endedAt, infraMarkedAt time.Time) time.Time {
	last := time.Time{}
	stamps := []time.Time{queuedAt, runningAt, heartbeatAt, releasedAt}
	if infraMarkedAt.IsZero() {
		stamps = append(stamps, endedAt)
	}
	for _, at := range stamps {
		if at.After(last) {
			last = at
		}
	}
	return last
}

// MarkSourceStates returns the states a mark of kind may move an attempt
// from: the board's list, whatever the plugin asks for. Never a terminal
// state (success, failed, skipped, upstream_failed: an ended attempt is
// the scheduler's and the operator's, not a reaper's), never none or
// scheduled (no execution yet to have been lost). An infra mark may come
// from queued (a dispatch that never landed), running, or a parked state;
// a task mark blames the task's own code, so only from running or a
// parked state the task reported itself, never from queued, where no code
// of the task ran. Nil for an unknown kind.
func MarkSourceStates(kind MarkKind) []string {
	switch kind {
	case MarkInfra:
		return []string{StateQueued, StateRunning, StateUpForRetry, StateUpForReschedule, StateDeferred}
	case MarkTask:
		return []string{StateRunning, StateUpForRetry, StateUpForReschedule, StateDeferred}
	}
	return nil
}

// SettleSourceStates returns the states a settlement may move an attempt
// from: the attempt was dispatched and had not ended (an attempt whose
// running report was lost is still queued). Never a terminal state.
func SettleSourceStates() []string {
	return []string{StateQueued, StateRunning}
}

// IsTerminalState reports whether s is a state an attempt has ended in.
func IsTerminalState(s string) bool {
	switch s {
	case StateSuccess, StateFailed, StateSkipped, StateUpstreamFailed:
		return true
	}
	return false
}

// sourceRefused reports whether from names a state outside allowed. The
// board refuses such a request whole rather than narrowing it: a plugin
// that asks to move an attempt from a state it may not is misbehaving, and
// its request is audited as such, not quietly trimmed.
func sourceRefused(from, allowed []string) bool {
	for _, st := range from {
		if !slices.Contains(allowed, st) {
			return true
		}
	}
	return false
}

// SourceRefused reports whether the mark names a source state its kind may
// not come from (MarkSourceStates): the board refuses it whole, with
// NoopSourceRefused, whatever the row holds.
func (m Mark) SourceRefused() bool { return sourceRefused(m.FromStates, MarkSourceStates(m.Kind)) }

// SourceRefused reports whether the settlement names a source state no
// settlement may come from (SettleSourceStates): refused whole, with
// NoopSourceRefused.
func (s Settlement) SourceRefused() bool { return sourceRefused(s.FromStates, SettleSourceStates()) }

// holds reports whether the row still holds exactly attempt a.
func (r TaskRow) holds(a Attempt) bool {
	return r.RunID == a.RunID && r.TaskID == a.TaskID && r.Try == a.Try && r.Epoch == a.Epoch
}

// Refusal says why the mark would not apply to the row ("" when it would):
// NoopSourceRefused when it names a source state its kind may not come
// from, NoopMovedOn when the row holds another try or epoch or a state
// outside FromStates, NoopRunFinished when the row's run is no longer
// running, NoopHeartbeated when the attempt heartbeated past its guard.
// The term and the row's existence are the board's to check.
func (m Mark) Refusal(r TaskRow) string {
	switch {
	case m.SourceRefused():
		return NoopSourceRefused
	case !r.holds(m.Attempt) || !slices.Contains(m.FromStates, r.State):
		return NoopMovedOn
	case r.RunState != RunRunning:
		return NoopRunFinished
	case m.RequireNoHeartbeat && !r.LastHeartbeatAt.IsZero():
		return NoopHeartbeated
	case !m.HeartbeatBefore.IsZero() && !r.LastHeartbeatAt.IsZero() && !r.LastHeartbeatAt.Before(m.HeartbeatBefore):
		return NoopHeartbeated
	}
	return ""
}

// Refusal says why the confirmation would not apply to the row: it applies
// only to a provisional infra mark of exactly its attempt.
func (c Confirm) Refusal(r TaskRow) string {
	if !r.holds(c.Attempt) || !r.Provisional() {
		return NoopMovedOn
	}
	return ""
}

// Refusal says why the override would not apply to the row: it applies
// only to a provisional infra mark of exactly its attempt, made after
// MarkedAfter (NoopValveOpen otherwise), on a run still running
// (NoopRunFinished otherwise) and, when the record's pod is LossyPod, while
// the attempt records that pod's UID (NoopPodNotRecorded otherwise); a pod
// with the exact task id is refused the same way when the attempt records
// another pod's UID.
func (o Override) Refusal(r TaskRow) string {
	switch {
	case !r.holds(o.Attempt) || !r.Provisional():
		return NoopMovedOn
	case !r.InfraMarkedAt.After(o.MarkedAfter):
		return NoopValveOpen
	case r.RunState != RunRunning:
		return NoopRunFinished
	case o.LossyPod && (o.PodUID == "" || r.PodUID != o.PodUID):
		return NoopPodNotRecorded
	case ForeignPod(r.PodUID, o.PodUID):
		return NoopPodNotRecorded
	}
	return ""
}

// Refusal says why the settlement would not apply to the row: never when
// it names a source state outside SettleSourceStates (NoopSourceRefused);
// otherwise it applies only to exactly its attempt in one of FromStates (for a LossyPod
// settlement, resolved to the task instance that records its pod, and only
// while it still does; for any other, only while the attempt records that
// pod or none: NoopPodNotRecorded otherwise), on a run still running (an
// agent's own report is refused on a finished run the same way).
func (s Settlement) Refusal(r TaskRow) string {
	switch {
	case s.SourceRefused():
		return NoopSourceRefused
	case !r.holds(s.Attempt) || !slices.Contains(s.FromStates, r.State):
		return NoopMovedOn
	case s.LossyPod && (s.PodUID == "" || r.PodUID != s.PodUID):
		return NoopMovedOn
	case !s.LossyPod && ForeignPod(r.PodUID, s.PodUID):
		return NoopPodNotRecorded
	case r.RunState != RunRunning:
		return NoopRunFinished
	}
	return ""
}

// ForeignPod reports whether a pod of UID podUID, which carries an
// attempt's labels, is not that attempt's: the attempt records another pod
// (recorded). An attempt that records none (a pod from before UIDs were
// recorded, or one created but not yet recorded) and a caller that names
// no pod keep the label rule: not foreign.
func ForeignPod(recorded, podUID string) bool {
	return recorded != "" && podUID != "" && recorded != podUID
}

// Refusal says why the sighting would not apply to the row: it applies
// only to exactly its attempt, running on kube, with a pod UID recorded
// (NoopMovedOn otherwise: an attempt that records none cannot tell its pod
// from another), whose recorded pod is the sighting's (NoopPodNotRecorded
// otherwise: a pod someone else made with the attempt's labels says
// nothing of the attempt's own), and only with a part the attempt's
// running_at precedes (NoopMovedOn otherwise: the pod was missing before
// the attempt ran, which is the dispatch's wait, not the cache's miss).
func (s PodSighting) Refusal(r TaskRow) string {
	switch {
	case !r.holds(s.Attempt) || r.State != StateRunning || r.Executor != ExecutorKube || r.PodUID == "":
		return NoopMovedOn
	case r.PodUID != s.PodUID:
		return NoopPodNotRecorded
	case !s.SeenCounts(r.RunningAt) && !s.MissingCounts(r.RunningAt):
		return NoopMovedOn
	}
	return ""
}

// ValidSighting refuses a sighting that names no pod, says nothing (no
// SeenAt, no MissingAt), or has its pod deleted before it was seen (at the
// same instant counts as after: the events came in that order).
func ValidSighting(s PodSighting) error {
	switch {
	case s.PodUID == "":
		return errors.New("a pod sighting names no pod UID")
	case s.SeenAt.IsZero() && s.MissingAt.IsZero():
		return errors.New("a pod sighting with neither a sighting nor a deletion")
	case !s.SeenAt.IsZero() && !s.MissingAt.IsZero() && s.MissingAt.Before(s.SeenAt):
		return errors.New("a pod sighting whose deletion is before its sighting")
	}
	return nil
}

// SeenCounts reports whether the sighting's SeenAt ends a window of an
// attempt running since runningAt: it came after the attempt ran.
func (s PodSighting) SeenCounts(runningAt time.Time) bool {
	return !s.SeenAt.IsZero() && !runningAt.IsZero() && runningAt.Before(s.SeenAt)
}

// MissingCounts reports whether the sighting's MissingAt opens a window of
// an attempt running since runningAt: the attempt ran by then.
func (s PodSighting) MissingCounts(runningAt time.Time) bool {
	return !s.MissingAt.IsZero() && !runningAt.IsZero() && !runningAt.After(s.MissingAt)
}

// PodMissing is what applying the sighting leaves of the attempt's pod
// cache history, given the attempt's running_at and what it held
// (longest: the largest end of a window minus running_at, 0 when none;
// since: the start of an open window, zero when none). The board's
// statement does the same in SQL.
func (s PodSighting) PodMissing(runningAt time.Time, longest time.Duration, since time.Time) (time.Duration, time.Time) {
	if s.SeenCounts(runningAt) {
		longest = max(longest, s.SeenAt.Sub(runningAt))
		since = time.Time{}
		if s.MissingCounts(runningAt) {
			since = s.MissingAt
		}
		return longest, since
	}
	if s.MissingCounts(runningAt) && since.IsZero() {
		since = s.MissingAt
	}
	return longest, since
}

// OverrideLogPrefix starts the try log line of a durable-SUCCESS override.
const OverrideLogPrefix = "outcome recovered from the durable record over "

// OverrideLogLine is the try log line of a durable-SUCCESS override of a
// mark made for reason (agent_lost, pod_lost, ...).
func OverrideLogLine(reason string) string {
	if reason == "" {
		reason = "an infra mark"
	}
	return OverrideLogPrefix + reason
}

// State is the task instance state a settlement with this outcome leaves
// ("" for an unknown outcome). A failure of either kind is failed; the
// planner tells them apart by FailureKind.
func (o Outcome) State() string {
	switch o {
	case OutcomeSuccess:
		return StateSuccess
	case OutcomeFailed, OutcomeInfra:
		return StateFailed
	case OutcomeReschedule:
		return StateUpForReschedule
	}
	return ""
}

// FailureKind is the last_failure_kind a settlement with this outcome
// leaves: task for a failure (its retry policy applies, as for an agent's
// own failed report), infra for an infra failure, none otherwise.
func (o Outcome) FailureKind() string {
	switch o {
	case OutcomeFailed:
		return FailureTask
	case OutcomeInfra:
		return FailureInfra
	}
	return ""
}

package agentlost

import (
	"fmt"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/reap"
)

// action is what a judgment asks the pass to do.
type action int

const (
	// actNone: no rule applies to the attempt yet; no decision is made.
	actNone action = iota
	// actDefer: leave the attempt alone this pass and say why.
	actDefer
	// actMark: mark the attempt.
	actMark
	// actStopThenMark (Lite): stop the orphaned task group, and mark only
	// once nothing of it is left.
	actStopThenMark
	// actMarkThenStop (Lite, past the ceiling): mark first, through the
	// guarded write, then stop the task group and log the kill.
	actMarkThenStop
)

// guard is the heartbeat guard a mark carries.
type guard int

const (
	guardNone     guard = iota // pinned to the attempt and its state only
	guardSilent                // no heartbeat since the silence threshold
	guardNeverHad              // still no heartbeat at all
)

// judgment is the verdict about one attempt.
type judgment struct {
	act    action
	label  string // the decision's label
	kind   sdk.MarkKind
	reason string // the mark's reason (error_message prefix)
	guard  guard
	// positive: a substrate read the attempt dead (or the ceiling, a fixed
	// bound, decided it); marks without it rest on silence alone.
	positive bool
	detail   string
}

// silence is how long the attempt has been without a heartbeat; zero when
// it never heartbeated in this attempt.
func silence(c sdk.Candidate, now time.Time) time.Duration {
	if c.LastHeartbeatAt.IsZero() {
		return 0
	}
	return now.Sub(c.LastHeartbeatAt)
}

// silent: heartbeated in this attempt, then nothing for longer than the
// agent-lost threshold.
func silent(c sdk.Candidate, now time.Time, l ladder.Ladder) bool {
	return !c.LastHeartbeatAt.IsZero() && silence(c, now) > l.AgentLost
}

// neverHeartbeated: running for longer than the agent-lost threshold
// without a single heartbeat in this attempt.
func neverHeartbeated(c sdk.Candidate, now time.Time, l ladder.Ladder) bool {
	return c.LastHeartbeatAt.IsZero() && !c.RunningAt.IsZero() && now.Sub(c.RunningAt) > l.AgentLost
}

// pastCeiling: the attempt has been running for longer than the credential
// ceiling (never when the ceiling is disabled).
func pastCeiling(c sdk.Candidate, now time.Time, l ladder.Ladder) bool {
	return l.CeilingEnabled() && !c.RunningAt.IsZero() && now.Sub(c.RunningAt) > l.CredentialCeiling
}

// silentPastCeiling: the attempt's last heartbeat came when it had been
// running for at least the ceiling less two heartbeat intervals, so its
// silence is the credential running out, not a lost agent. It is judged by
// the heartbeat's time, not the reap's: an attempt that went quiet earlier
// is a lost agent however late the reaper gets to it.
func silentPastCeiling(c sdk.Candidate, l ladder.Ladder) bool {
	if !l.CeilingEnabled() || c.LastHeartbeatAt.IsZero() || c.RunningAt.IsZero() {
		return false
	}
	return c.LastHeartbeatAt.Sub(c.RunningAt) >= l.CredentialCeiling-2*l.Heartbeat
}

// silenceMark is the mark for a silent attempt: a task failure when the
// silence is the credential ceiling's, an infra mark otherwise.
func silenceMark(c sdk.Candidate, now time.Time, l ladder.Ladder) judgment {
	if silentPastCeiling(c, l) {
		return judgment{act: actMark, label: sdk.LabelCredentialCeiling, kind: sdk.MarkTask,
			reason: sdk.LabelCredentialCeiling, guard: guardSilent,
			detail: fmt.Sprintf("silent for %s after heartbeating %s into running, past the credential ceiling %s less two heartbeats",
				silence(c, now).Round(time.Millisecond), c.LastHeartbeatAt.Sub(c.RunningAt), l.CredentialCeiling)}
	}
	return judgment{act: actMark, label: sdk.LabelAgentLost, kind: sdk.MarkInfra, reason: sdk.LabelAgentLost,
		guard: guardSilent, detail: fmt.Sprintf("silent for %s (threshold %s)", silence(c, now).Round(time.Millisecond), l.AgentLost)}
}

// judgeKube is the kube policy: a silent attempt is marked on its silence
// (the pod is then torn down); the substrate's answer only tells a positive
// death signal (no pod left, read live: the substrate never answers dead
// from its cache) from silence alone, for the brake. A warm attempt has no
// pod of its own, so its reading says nothing about it: its mark rests on
// silence alone.
func judgeKube(c sdk.Candidate, now time.Time, l ladder.Ladder, live reap.Answer) judgment {
	if !silent(c, now, l) {
		return judgment{act: actNone}
	}
	j := silenceMark(c, now, l)
	j.positive = c.Executor != sdk.ExecutorWarm && !live.Unknown() && live.State == sdk.Dead
	return j
}

// judgeLite is the Lite policy, where nothing is marked unless its agent
// and task group are provably gone (or, past the credential ceiling, the
// attempt is deliberately ended).
func judgeLite(c sdk.Candidate, now time.Time, l ladder.Ladder, live reap.Answer) judgment {
	never := neverHeartbeated(c, now, l)
	quiet := silent(c, now, l)
	past := pastCeiling(c, now, l)
	if !never && !quiet && !past {
		return judgment{act: actNone}
	}

	if live.Unknown() {
		detail := live.Why()
		if never && !past {
			return judgment{act: actDefer, label: sdk.LabelAgentLostNeverHeartbeatedProcessQueryErr, detail: detail}
		}
		return judgment{act: actDefer, label: sdk.LabelAgentLostProcessQueryErr, detail: detail}
	}

	if live.State == sdk.Alive {
		switch {
		case past:
			return judgment{act: actMarkThenStop, label: sdk.LabelCredentialCeiling, kind: sdk.MarkTask,
				reason: sdk.LabelCredentialCeiling, guard: guardNone, positive: true,
				detail: fmt.Sprintf("running for %s, past the credential ceiling %s, and still alive: ending it",
					now.Sub(c.RunningAt), l.CredentialCeiling)}
		case never:
			// An orphaned group of an attempt that never heartbeated is
			// waited for, never stopped.
			return judgment{act: actDefer, label: sdk.LabelAgentLostNeverHeartbeatedProcessAlive,
				detail: "never heartbeated, but its agent or task group is alive: " + live.Detail}
		case live.Orphan:
			j := silenceMark(c, now, l)
			j.act, j.label, j.positive = actStopThenMark, sdk.LabelAgentLostOrphanStopped, true
			j.detail += "; agent dead, task group orphaned: stopping the group before marking"
			return j
		default:
			return judgment{act: actDefer, label: sdk.LabelAgentLostProcessAlive,
				detail: fmt.Sprintf("silent for %s, but alive: %s", silence(c, now).Round(time.Millisecond), live.Detail)}
		}
	}

	// Dead: agent and group both gone.
	switch {
	case never:
		return judgment{act: actMark, label: sdk.LabelAgentLostNeverHeartbeated, kind: sdk.MarkInfra,
			reason: sdk.LabelAgentLost, guard: guardNeverHad, positive: true,
			detail: fmt.Sprintf("running for %s without a heartbeat; agent and task group gone", now.Sub(c.RunningAt))}
	case quiet:
		j := silenceMark(c, now, l)
		j.positive = true
		j.detail += "; agent and task group gone"
		return j
	}
	// Past the ceiling but dead and only recently quiet: the silence rule
	// settles it once it is silent past the threshold.
	return judgment{act: actNone}
}

// message is the error_message a mark writes.
func message(j judgment, l ladder.Ladder) string {
	if j.reason == sdk.LabelCredentialCeiling {
		return CeilingMessage
	}
	return j.reason + ": " + j.detail
}

// evidence is what every decision about c carries.
func evidence(pass sdk.Pass, c sdk.Candidate, live reap.Answer, j judgment) reap.Evidence {
	ev := reap.CandidateEvidence(pass, c, pass.Ladder.AgentLost).Liveness(live)
	if pass.Ladder.CeilingEnabled() {
		ev[reap.EvCeiling] = pass.Ladder.CredentialCeiling.String()
	}
	if j.act == actMark || j.act == actStopThenMark || j.act == actMarkThenStop {
		ev[reap.EvMark] = j.reason
		ev[reap.EvSignal] = reap.SignalSilence
		if j.positive {
			ev[reap.EvSignal] = reap.SignalPositive
		}
	}
	return ev
}

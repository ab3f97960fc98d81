package soak

import (
	"fmt"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/boardhistory"
)

// History is everything a soak observed, from three independent accounts:
// the agents' own journals and the process table (Executions, Agents), the
// database's triggers (Transitions, RunChanges, Terms), and the control
// plane's audit (Decisions). The faults are the injector's own record.
// The invariants judge a History; none of them takes the board's current
// rows as evidence.
type History struct {
	Executions  []Execution
	Agents      []AgentLife
	Transitions []Transition
	RunChanges  []RunChange
	Terms       []Term
	Decisions   []Decision
	Faults      []Fault
	// PodStops are the stops of task pods the API server reported (kube
	// edition only): deletions and lowered deadlines, whoever made them.
	PodStops []PodStop
	// Heartbeats are, by attempt, the times its heartbeats landed in the
	// database (a trigger's clock), in order.
	Heartbeats map[sdk.Attempt][]time.Time
	// AgentLost is, on kube, the silence after which a reaper may mark the
	// attempt of an agent whose process lives: the reapers there judge by
	// heartbeats landing, not by processes (a wedged agent, a control plane
	// that heard nothing). Zero on Lite: a live process is never marked.
	AgentLost time.Duration
	// Now is when the history was taken: processes still alive were seen
	// alive up to about then.
	Now time.Time
}

// silentAt reports whether, on kube, attempt a's heartbeats had stopped
// landing for AgentLost at t, and when the last landed.
func (h History) silentAt(a sdk.Attempt, t time.Time) (bool, time.Time) {
	if h.AgentLost <= 0 {
		return false, time.Time{}
	}
	var last time.Time
	for _, b := range h.Heartbeats[a] {
		if b.After(t) {
			break
		}
		last = b
	}
	return t.Sub(last) >= h.AgentLost, last
}

// lastBeat describes attempt a's last heartbeat before t, for evidence.
func (h History) lastBeat(a sdk.Attempt, t time.Time) string {
	if h.AgentLost <= 0 {
		return ""
	}
	if _, last := h.silentAt(a, t); !last.IsZero() {
		return fmt.Sprintf("; its last heartbeat landed at %s", stamp(last))
	}
	return "; it never heartbeated"
}

// Execution is one run of a task's command: from the agent's task_start
// journal line to the end of its process group.
type Execution struct {
	Attempt     sdk.Attempt
	AgentPID    int
	PGID        int
	LeaderStart uint64
	Start       time.Time // task_start: the group recorded, the command about to run
	// End is the agent's task_end line (zero when the agent never wrote
	// one: it was killed).
	End       time.Time
	EndState  string
	EndReason string
	// LastSeenAlive is the last time the process table showed a member of
	// the group; Gone says a later look found none (and then the group
	// stays gone: its id may be reused by another group).
	LastSeenAlive time.Time
	Gone          bool
	GoneSeen      time.Time
}

// Over is the latest moment the execution is known to have been running:
// its end line or the last sight of its group, whichever is later.
func (e Execution) Over() time.Time {
	end := e.Start
	if e.End.After(end) {
		end = e.End
	}
	if e.LastSeenAlive.After(end) {
		end = e.LastSeenAlive
	}
	return end
}

// AgentLife is one agent process: from its agent_start journal line to its
// exit (its agent_exit line, or the first look that found it gone).
type AgentLife struct {
	Attempt       sdk.Attempt
	PID           int
	StartTicks    uint64
	Began         time.Time
	Exited        time.Time // agent_exit line; zero when it never wrote one
	LastSeenAlive time.Time
	Gone          bool
	GoneSeen      time.Time
}

// Transition is one change of a task instance's row as the database saw
// it (a trigger), with the leadership term current in that transaction.
type Transition = boardhistory.Transition

// RunChange is one change of a run's state as the database saw it.
type RunChange = boardhistory.RunChange

// Term is one leadership term as the database saw it begin.
type Term = boardhistory.Term

// Decision is one audit row (reap_decisions).
type Decision struct {
	ID      int64
	At      time.Time
	Term    int64
	Reaper  string
	Label   string
	Applied bool
	Attempt sdk.Attempt // zero task for run and gate decisions
}

// Fault is one fault the injector caused.
type Fault struct {
	Kind   string
	At     time.Time
	Ended  time.Time // when the injector undid it (SIGCONT, restart); At for instant faults
	Target *sdk.Attempt
	Detail string
	// KilledGroup: the injector killed the target's task group itself, so
	// its task may end by a signal no reaper sent.
	KilledGroup bool
	// Others are further attempts the fault harmed (a lost node's pods).
	Others []sdk.Attempt
	// ClusterStop: the fault stopped the harmed attempts' pods the way the
	// cluster does (a deletion, an eviction, a lost node): an infra
	// failure, never the task's own.
	ClusterStop bool
	// LostFrom and LostTo bound the writes an asynchronous failover lost
	// (FaultFailoverAsync): the primary acknowledged them after its standby
	// was made asynchronous (LostFrom) and before it was killed (LostTo);
	// the promoted board never had them. Zero for any other fault.
	LostFrom, LostTo time.Time
}

// Harmed lists every attempt the fault harmed: its target and the others.
func (f Fault) Harmed() []sdk.Attempt {
	out := append([]sdk.Attempt(nil), f.Others...)
	if f.Target != nil {
		out = append([]sdk.Attempt{*f.Target}, out...)
	}
	return out
}

// PodStop is one stop of a task pod as the API server reported it: its
// deletion began, or its deadline was lowered (a teardown in place). At is
// when the soak's watch saw it, a little after the write.
type PodStop struct {
	At      time.Time
	Attempt sdk.Attempt
	Pod     string
	How     string // "deleted" or "deadline lowered to Ns"
	Phase   string // the pod's phase then
}

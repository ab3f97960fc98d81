package soak

import (
	"time"

	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/sdk"
)

// What the soak's own invariants excuse: an agent told should_terminate
// because the board lost its attempt's running. The agent reports its
// attempt running, and starts its task once the board acknowledged that;
// an execution that started after an asynchronous failover's window opened
// and before the standby was promoted was acknowledged by the lost primary
// (no other board took writes then), and if the promoted board had not
// recorded the attempt running by the time the agent was told to stop
// after the primary's kill, that stop answered a board that had lost the
// running, not a reaper's or a runner's judgement. Nothing else is excused:
// a mark while the agent lived, a task killed by a signal nobody sent, two
// executions at once.

// lostRunning reports whether execution e was told to stop because a lost
// window took its attempt's running from the board.
func (h History) lostRunning(e Execution) bool {
	if e.EndReason != agent.ReasonTerminated {
		return false
	}
	return h.lostBy(e, e.End)
}

// lostPodStop reports whether pod stop ps, which met execution e of its
// attempt still running, tore down an execution a lost window took from the
// board: e started in the window, before the promotion, the stop came after
// the primary's kill, and the promoted board had not recorded the attempt
// running by the stop.
func (h History) lostPodStop(ps PodStop, e Execution) bool {
	return ps.Attempt == e.Attempt && h.lostBy(e, ps.At)
}

// lostBy reports whether execution e started in a lost window (after it
// opened, before the promotion) and was ended at end, after the primary's
// kill, while the promoted board had not recorded its attempt running.
func (h History) lostBy(e Execution, end time.Time) bool {
	for _, f := range h.Faults {
		if f.LostTo.IsZero() {
			continue
		}
		promoted := f.Ended
		if promoted.Before(f.LostTo) {
			promoted = h.Now // still under way at the last look
		}
		if !e.Start.After(f.LostFrom) || !e.Start.Before(promoted) || !end.After(f.LostTo) {
			continue
		}
		recorded := false
		for _, t := range h.Transitions {
			if t.To == e.Attempt && t.NewState == sdk.StateRunning && !t.At.After(end) {
				recorded = true
				break
			}
		}
		if !recorded {
			return true
		}
	}
	return false
}

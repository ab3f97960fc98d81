package soak

import (
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
	for _, f := range h.Faults {
		if f.LostTo.IsZero() {
			continue
		}
		promoted := f.Ended
		if promoted.Before(f.LostTo) {
			promoted = h.Now // still under way at the last look
		}
		if !e.Start.After(f.LostFrom) || !e.Start.Before(promoted) || !e.End.After(f.LostTo) {
			continue
		}
		recorded := false
		for _, t := range h.Transitions {
			if t.To == e.Attempt && t.NewState == sdk.StateRunning && !t.At.After(e.End) {
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

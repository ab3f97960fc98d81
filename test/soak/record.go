package soak

import (
	"fmt"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/boardhistory"
	"github.com/dexaflow/reaper/testkit/history"
)

// Final is a task's row on the board as read after the run.
type Final = boardhistory.Final

// maxWriterName is the most of a holder a connection's application_name
// keeps (PostgreSQL's NAMEDATALEN-1 bytes).
const maxWriterName = boardhistory.MaxWriterName

// Record turns a soak's accounts into a fault history (package
// testkit/history), the events in no particular order (Check sorts them).
// The database's own accounts (the terms, the changes of task instances
// and runs, the heartbeats) become writes as boardhistory.Record says; the
// soak supplies its executions and faults:
//
//   - each execution the journals recorded starts at its task_start line
//     and ends at its task_end line, or, when the group was seen alive
//     later, at that last sight; an execution with no end line (its agent
//     was killed, by the injector or with its group) ends "killed" when
//     the process table first found its group gone (the injector's kill
//     of the group is taken an instant before the signal, so the look is
//     the end established); one still alive at the last look has no end;
//   - each fault is a fault event, naming its kind, detail and when it
//     was undone; an asynchronous failover adds one at the primary's kill
//     carrying the window of writes lost (lost_from);
//   - each final row is a final event.
func Record(h History, finals []Final) []history.Event {
	b := boardhistory.Board{Terms: h.Terms, Transitions: h.Transitions, RunChanges: h.RunChanges, Heartbeats: h.Heartbeats}
	killed := groupKills(h.Faults)
	execs := make([]boardhistory.Execution, 0, len(h.Executions))
	for _, x := range h.Executions {
		execs = append(execs, execution(x, killed[x.Attempt]))
	}
	faults := make([]boardhistory.Fault, 0, len(h.Faults))
	for _, f := range h.Faults {
		note := f.Kind
		if f.Detail != "" {
			note += ": " + f.Detail
		}
		if f.Ended.After(f.At) {
			note += fmt.Sprintf(" (undone at %s)", f.Ended.UTC().Format(time.RFC3339Nano))
		}
		faults = append(faults, boardhistory.Fault{At: f.At, Note: note})
		if !f.LostTo.IsZero() {
			faults = append(faults, boardhistory.Fault{At: f.LostTo, LostFrom: f.LostFrom,
				Note: f.Kind + ": the primary killed; the writes it acknowledged since its standby was made asynchronous are lost"})
		}
	}
	return boardhistory.Record(b, execs, faults, finals)
}

// execution is an execution's start and, when known, its end.
func execution(x Execution, kills []time.Time) boardhistory.Execution {
	out := boardhistory.Execution{Attempt: x.Attempt, Start: x.Start,
		ID: fmt.Sprintf("agent %d group %d started %d", x.AgentPID, x.PGID, x.LeaderStart)}
	switch {
	case !x.End.IsZero():
		out.End, out.Outcome = x.End, x.EndState
		if x.EndReason != "" {
			out.Outcome = boardhistory.Join(x.EndState, x.EndReason)
		}
		if x.LastSeenAlive.After(x.End) {
			out.End = x.LastSeenAlive
			out.Note = "the group was seen alive after its end line"
		}
	case x.Gone:
		out.End, out.Outcome = x.GoneSeen, history.OutcomeKilled
		out.Note = "no end line; the process table found its group gone"
		for _, k := range kills {
			// The fault's time is taken between the agent's kill and its
			// group's: the group's end is the look that found it gone.
			if !k.Before(x.LastSeenAlive) && !k.After(x.GoneSeen) {
				out.Note = "no end line; the injector killed its group at " + k.UTC().Format(time.RFC3339Nano) +
					", the process table found it gone"
				break
			}
		}
	}
	return out // no end: alive at the last look
}

// groupKills lists, by attempt, when the injector killed its task group.
func groupKills(faults []Fault) map[sdk.Attempt][]time.Time {
	out := map[sdk.Attempt][]time.Time{}
	for _, f := range faults {
		if f.KilledGroup {
			for _, a := range f.Harmed() {
				out[a] = append(out[a], f.At)
			}
		}
	}
	return out
}

func histAttempt(a sdk.Attempt) *history.Attempt {
	return &history.Attempt{RunID: a.RunID, TaskID: a.TaskID, Try: a.Try, Epoch: a.Epoch}
}

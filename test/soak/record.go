package soak

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/history"
)

// Final is a task's row on the board as read after the run.
type Final struct {
	Attempt sdk.Attempt
	State   string
	At      time.Time // when it was read
}

// maxWriterName is the most of a holder a connection's application_name
// keeps (PostgreSQL's NAMEDATALEN-1 bytes).
const maxWriterName = 63

// Record turns a soak's accounts into a fault history (package
// testkit/history), the events in no particular order (Check sorts them):
//
//   - each term the leader row began (soak_leader_history) is a write
//     "acquire" under that term by its holder;
//   - each change of a task instance (soak_ti_history) is a write on the
//     attempt the row held before, setting the new state, and, when the
//     change began a new try or epoch, moving on to it (retry, replace):
//     fenced when its transaction share-locked the leader row, under the
//     writer's own term, else unfenced (an agent's report);
//   - each change of a run (soak_run_history) is a write about no attempt,
//     fenced or not the same way;
//   - each heartbeat that landed is an unfenced write "heartbeat" on its
//     attempt;
//   - each execution the journals recorded starts at its task_start line
//     and ends at its task_end line, or, when the group was seen alive
//     later, at that last sight; an execution with no end line (its agent
//     was killed, by the injector or with its group) ends "killed" when
//     the process table first found its group gone (the injector's kill
//     of the group is taken an instant before the signal, so the look is
//     the end established); one still alive at the last look has no end;
//   - each fault is a fault event;
//   - each final row is a final event.
//
// A fenced write's term is its writer's own: the latest term the leader
// row's history shows the writing replica (its connection's
// application_name, reaperd's holder) acquiring at or before the write.
// For a write that applied, the fence says it equals the leader row's
// term then; that is what Check then proves from the writer's side. A
// writer that never acquired a term is given the leader row's term under
// its own name (and Check finds the term held twice); a fenced write with
// no writer name is given the leader row's term and holder.
func Record(h History, finals []Final) []history.Event {
	r := newRecorder(h.Terms)
	var out []history.Event
	for _, t := range h.Terms {
		out = append(out, history.Event{Time: t.At, Kind: history.KindWrite, Op: "acquire", Term: t.Term,
			Holder: t.Holder, Outcome: history.OutcomeApplied, Note: "the leader row's new term"})
	}
	for _, t := range h.Transitions {
		out = append(out, r.transition(t))
	}
	for _, rc := range h.RunChanges {
		e := history.Event{Time: rc.At, Kind: history.KindWrite, Op: "run_" + rc.NewState,
			Outcome: history.OutcomeApplied, Note: fmt.Sprintf("run %s %s -> %s", rc.RunID, rc.OldState, rc.NewState)}
		r.fence(&e, rc.Fenced, rc.Writer, rc.Term, rc.LeadHolder)
		out = append(out, e)
	}
	for _, a := range sortedAttempts(h.Heartbeats) {
		for _, at := range h.Heartbeats[a] {
			out = append(out, history.Event{Time: at, Kind: history.KindWrite, Op: "heartbeat", Attempt: histAttempt(a),
				Outcome: history.OutcomeApplied})
		}
	}
	killed := groupKills(h.Faults)
	for _, x := range h.Executions {
		out = append(out, execution(x, killed[x.Attempt])...)
	}
	for _, f := range h.Faults {
		note := f.Kind
		if f.Detail != "" {
			note += ": " + f.Detail
		}
		if f.Ended.After(f.At) {
			note += fmt.Sprintf(" (undone at %s)", f.Ended.UTC().Format(time.RFC3339Nano))
		}
		out = append(out, history.Event{Time: f.At, Kind: history.KindFault, Note: note})
	}
	for _, f := range finals {
		out = append(out, history.Event{Time: f.At, Kind: history.KindFinal, Attempt: histAttempt(f.Attempt), State: f.State})
	}
	return out
}

// recorder knows the terms, to give a writer its own.
type recorder struct {
	terms []Term // by the time each began
}

func newRecorder(terms []Term) *recorder {
	ts := slices.Clone(terms)
	sort.SliceStable(ts, func(i, j int) bool { return ts[i].At.Before(ts[j].At) })
	return &recorder{terms: ts}
}

// sameHolder says whether a connection named writer is holder's: the name
// is the holder, or its first maxWriterName bytes.
func sameHolder(writer, holder string) bool {
	return writer != "" && (writer == holder || (len(writer) >= maxWriterName && strings.HasPrefix(holder, writer)))
}

// ownTerm is the latest term writer acquired at or before at.
func (r *recorder) ownTerm(writer string, at time.Time) (Term, bool) {
	for i := len(r.terms) - 1; i >= 0; i-- {
		if t := r.terms[i]; !t.At.After(at) && sameHolder(writer, t.Holder) {
			return t, true
		}
	}
	return Term{}, false
}

// fence fills a write's term and holder: the writer's own term for a
// fenced write, none for an unfenced one.
func (r *recorder) fence(e *history.Event, fenced bool, writer string, rowTerm int64, rowHolder string) {
	by := writer
	if by == "" {
		by = "an unnamed connection"
	}
	switch {
	case !fenced:
		e.Note = join(e.Note, "unfenced, by "+by)
	case writer == "":
		e.Term, e.Holder = rowTerm, rowHolder
		e.Note = join(e.Note, fmt.Sprintf("fenced, by an unnamed connection: the leader row's term %d and holder", rowTerm))
	default:
		if t, ok := r.ownTerm(writer, e.Time); ok {
			e.Term, e.Holder = t.Term, t.Holder
			if t.Term != rowTerm {
				e.Note = join(e.Note, fmt.Sprintf("the leader row held term %d (%s)", rowTerm, rowHolder))
			}
			return
		}
		e.Term, e.Holder = rowTerm, writer
		e.Note = join(e.Note, fmt.Sprintf("fenced, by %s, which acquired no term: the leader row's term %d (%s)", writer, rowTerm, rowHolder))
	}
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// transition is the write a task instance's change records.
func (r *recorder) transition(t Transition) history.Event {
	e := history.Event{Time: t.At, Kind: history.KindWrite, Attempt: histAttempt(t.From), Outcome: history.OutcomeApplied,
		State: t.NewState, Op: transitionOp(t)}
	if t.To != t.From {
		e.Next = histAttempt(t.To)
	}
	if t.FailureReason != "" {
		e.Note = "reason " + t.FailureReason
	}
	r.fence(&e, t.Fenced, t.Writer, t.Term, t.LeadHolder)
	return e
}

// transitionOp names the write a change was: the ops Check gives a
// meaning to where the change is one (override); else the rail or mark.
func transitionOp(t Transition) string {
	switch {
	case t.To.Try > t.From.Try:
		return "retry"
	case t.To.Epoch > t.From.Epoch:
		if t.OldState == sdk.StateFailed {
			return "replace"
		}
		return "requeue"
	case isReaperMark(t):
		return "mark"
	case t.OldState == sdk.StateFailed && t.OldFailureKind == sdk.FailureInfra && t.NewState == sdk.StateSuccess:
		return history.OpOverride
	case !t.Fenced:
		return "report"
	}
	return "set_" + t.NewState
}

// execution is an execution's start and, when known, its end.
func execution(x Execution, kills []time.Time) []history.Event {
	a := histAttempt(x.Attempt)
	id := fmt.Sprintf("agent %d group %d started %d", x.AgentPID, x.PGID, x.LeaderStart)
	out := []history.Event{{Time: x.Start, Kind: history.KindExecStart, Attempt: a, Exec: id}}
	end := history.Event{Kind: history.KindExecEnd, Attempt: a, Exec: id}
	switch {
	case !x.End.IsZero():
		end.Time, end.Outcome = x.End, x.EndState
		if x.EndReason != "" {
			end.Outcome = join(x.EndState, x.EndReason)
		}
		if x.LastSeenAlive.After(x.End) {
			end.Time = x.LastSeenAlive
			end.Note = "the group was seen alive after its end line"
		}
	case x.Gone:
		end.Time, end.Outcome = x.GoneSeen, history.OutcomeKilled
		end.Note = "no end line; the process table found its group gone"
		for _, k := range kills {
			// The fault's time is taken between the agent's kill and its
			// group's: the group's end is the look that found it gone.
			if !k.Before(x.LastSeenAlive) && !k.After(x.GoneSeen) {
				end.Note = "no end line; the injector killed its group at " + k.UTC().Format(time.RFC3339Nano) +
					", the process table found it gone"
				break
			}
		}
	default:
		return out // alive at the last look
	}
	if end.Outcome == "" {
		end.Outcome = "ended"
	}
	return append(out, end)
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

func sortedAttempts[V any](m map[sdk.Attempt]V) []sdk.Attempt {
	out := make([]sdk.Attempt, 0, len(m))
	for a := range m {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool {
		x, y := out[i], out[j]
		if x.RunID != y.RunID {
			return x.RunID < y.RunID
		}
		if x.TaskID != y.TaskID {
			return x.TaskID < y.TaskID
		}
		if x.Try != y.Try {
			return x.Try < y.Try
		}
		return x.Epoch < y.Epoch
	})
	return out
}

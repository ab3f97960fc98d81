package boardhistory

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/history"
)

// MaxWriterName is the most of a holder a connection's application_name
// keeps (PostgreSQL's NAMEDATALEN-1 bytes).
const MaxWriterName = 63

// Execution is one execution of a task as the harness watched it.
type Execution struct {
	Attempt sdk.Attempt
	// ID is unique to the execution: a pid with its start time, a pod's
	// UID.
	ID    string
	Start time.Time
	// End is when it ended, zero when it had not by the end of the run.
	// For one that ended without a word of its own, it is when the
	// harness established it gone, and Outcome is history.OutcomeKilled.
	End     time.Time
	Outcome string // "" is recorded as "ended"
	Note    string // on its end
}

// Fault is one fault the harness threw.
type Fault struct {
	At   time.Time
	Note string // what, and to whom
	// LostFrom, when set, says the board lost the writes it had applied
	// from LostFrom to At (an asynchronous standby promoted after its
	// primary was killed at At).
	LostFrom time.Time
}

// Record turns the board's rows, the harness's executions and faults and
// the final rows into a fault history (package testkit/history), the
// events in no particular order (Check sorts them):
//
//   - each term the leader row began is a write "acquire" under that term
//     by its holder;
//   - each change of a task instance is a write on the attempt the row
//     held before, setting the new state, and, when the change began a new
//     try or epoch, moving on to it (retry, replace, requeue): fenced when
//     its transaction share-locked the leader row, under the writer's own
//     term, else unfenced (an agent's report);
//   - each change of a run is a write about no attempt, fenced or not the
//     same way;
//   - each heartbeat that landed is an unfenced write "heartbeat" on its
//     attempt;
//   - each write the fence refused is a write refused as deposed, at the
//     database's time of its record, one per task attempt it named (about
//     no attempt when it named none), with what the fence met
//     (RefusalEvents);
//   - each execution is a start and, when it ended, an end;
//   - each fault is a fault event (with the window of writes the board
//     lost, if it lost some); each final row a final event.
//
// A fenced write's term is its writer's own: the latest term the leader
// row's history shows the writing replica (its connection's
// application_name, reaperd's holder) acquiring at or before the write.
// For a write that applied, the fence says it equals the leader row's term
// then; that is what Check then proves from the writer's side. A writer
// that never acquired a term is given the leader row's term under its own
// name (and Check finds the term held twice); a fenced write with no
// writer name is given the leader row's term and holder.
func Record(b Board, executions []Execution, faults []Fault, finals []Final) []history.Event {
	r := newRecorder(b.Terms)
	var out []history.Event
	for _, t := range b.Terms {
		out = append(out, history.Event{Time: t.At, Kind: history.KindWrite, Op: history.OpAcquire, Term: t.Term,
			Holder: t.Holder, Outcome: history.OutcomeApplied, Note: "the leader row's new term"})
	}
	for _, t := range b.Transitions {
		out = append(out, r.transition(t))
	}
	for _, rc := range b.RunChanges {
		e := history.Event{Time: rc.At, Kind: history.KindWrite, Op: "run_" + rc.NewState,
			Outcome: history.OutcomeApplied, Note: fmt.Sprintf("run %s %s -> %s", rc.RunID, rc.OldState, rc.NewState)}
		r.fence(&e, rc.Fenced, rc.Writer, rc.Term, rc.LeadHolder)
		out = append(out, e)
	}
	for _, rf := range b.Refusals {
		out = append(out, RefusalEvents(rf)...)
	}
	for _, a := range sortedAttempts(b.Heartbeats) {
		for _, at := range b.Heartbeats[a] {
			out = append(out, history.Event{Time: at, Kind: history.KindWrite, Op: "heartbeat", Attempt: attempt(a),
				Outcome: history.OutcomeApplied})
		}
	}
	for _, x := range executions {
		a := attempt(x.Attempt)
		out = append(out, history.Event{Time: x.Start, Kind: history.KindExecStart, Attempt: a, Exec: x.ID})
		if x.End.IsZero() {
			continue
		}
		outcome := x.Outcome
		if outcome == "" {
			outcome = "ended"
		}
		out = append(out, history.Event{Time: x.End, Kind: history.KindExecEnd, Attempt: a, Exec: x.ID,
			Outcome: outcome, Note: x.Note})
	}
	for _, f := range faults {
		out = append(out, history.Event{Time: f.At, Kind: history.KindFault, Note: f.Note, LostFrom: f.LostFrom})
	}
	for _, f := range finals {
		out = append(out, history.Event{Time: f.At, Kind: history.KindFinal, Attempt: attempt(f.Attempt), State: f.State})
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

// SameHolder says whether a connection named writer is holder's: the name
// is the holder, or its first MaxWriterName bytes.
func SameHolder(writer, holder string) bool {
	return writer != "" && (writer == holder || (len(writer) >= MaxWriterName && strings.HasPrefix(holder, writer)))
}

// ownTerm is the latest term writer acquired at or before at.
func (r *recorder) ownTerm(writer string, at time.Time) (Term, bool) {
	for i := len(r.terms) - 1; i >= 0; i-- {
		if t := r.terms[i]; !t.At.After(at) && SameHolder(writer, t.Holder) {
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

// Join joins two notes with "; ", either possibly empty.
func Join(a, b string) string { return join(a, b) }

func join(a, b string) string {
	if a == "" {
		return b
	}
	if b == "" {
		return a
	}
	return a + "; " + b
}

// transition is the write a task instance's change records.
func (r *recorder) transition(t Transition) history.Event {
	e := history.Event{Time: t.At, Kind: history.KindWrite, Attempt: attempt(t.From), Outcome: history.OutcomeApplied,
		State: t.NewState, Op: TransitionOp(t)}
	if t.To != t.From {
		e.Next = attempt(t.To)
	}
	if t.FailureReason != "" {
		e.Note = "reason " + t.FailureReason
	}
	r.fence(&e, t.Fenced, t.Writer, t.Term, t.LeadHolder)
	return e
}

// reaperMarks are the failure reasons a reaper writes when it fails an
// attempt it judged lost, and the credential ceiling's.
var reaperMarks = map[string]bool{
	sdk.LabelAgentLost: true, sdk.LabelDispatchLost: true, sdk.LabelPodLost: true,
	sdk.LabelStartExpired: true, sdk.LabelWarmWorkerLost: true, sdk.LabelCredentialCeiling: true,
}

// TransitionOp names the write a change was: the ops Check gives a meaning
// to where the change is one (override); else the rail or mark.
func TransitionOp(t Transition) string {
	switch {
	case t.To.Try > t.From.Try:
		return "retry"
	case t.To.Epoch > t.From.Epoch:
		if t.OldState == sdk.StateFailed {
			return "replace"
		}
		return "requeue"
	case t.NewState == sdk.StateFailed && reaperMarks[t.FailureReason]:
		return "mark"
	case t.OldState == sdk.StateFailed && t.OldFailureKind == sdk.FailureInfra && t.NewState == sdk.StateSuccess:
		return history.OpOverride
	case !t.Fenced:
		return "report"
	}
	return "set_" + t.NewState
}

func attempt(a sdk.Attempt) *history.Attempt {
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

// NoHolder is the holder a refusal's events give a writer that had none (a
// store or writer built without a holder: a tool, a test).
const NoHolder = "(no holder)"

// RefusalEvents are the history events of one refusal of the fence: a
// write of its name under the term and holder the writer claimed,
// refused as deposed at the time the board recorded it, with the leader
// row it met and the write's own time as its fence; one per task attempt
// it named, or one about no attempt when it named none (a prune, a
// run's reap: the run is in the note).
func RefusalEvents(rf board.FenceRefusal) []history.Event {
	holder := rf.Holder
	if holder == "" {
		holder = NoHolder
	}
	note := "refused by the fence (" + rf.Why() + "): the board had no leader row"
	if rf.LeadFound {
		lead := rf.LeadHolder
		if lead == "" {
			lead = "resigned"
		}
		note = fmt.Sprintf("refused by the fence (%s): the leader row held term %d (%s)", rf.Why(), rf.LeadTerm, lead)
	}
	if rf.Requests > len(rf.Attempts) {
		note = join(note, fmt.Sprintf("%d requests, the first %d named", rf.Requests, len(rf.Attempts)))
	}
	e := func(a *history.Attempt, note string) history.Event {
		return history.Event{Time: rf.At, Kind: history.KindWrite, Op: rf.Write, Term: rf.Term, Holder: holder,
			Attempt: a, Outcome: history.OutcomeDeposed, Note: note,
			Fence: &history.Fence{Term: rf.LeadTerm, Holder: rf.LeadHolder, Expires: rf.LeadExpiresAt, WriteAt: rf.WriteAt}}
	}
	var (
		out  []history.Event
		runs []string
	)
	for _, a := range rf.Attempts {
		if a.TaskID == "" {
			runs = append(runs, a.RunID)
			continue
		}
		out = append(out, e(attempt(a), note))
	}
	if len(out) == 0 {
		if len(runs) > 0 {
			note = join(note, "run "+strings.Join(runs, ", "))
		}
		out = append(out, e(nil, note))
	}
	return out
}

package boardhistory_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/boardhistory"
	"github.com/dexaflow/reaper/testkit/history"
)

// Hand-made board rows, turned into a history (Record) and judged
// (history.Check). Times are seconds after t0.

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func at(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }

func attempt(task string, try, epoch int32) sdk.Attempt {
	return sdk.Attempt{RunID: "r", TaskID: task, Try: try, Epoch: epoch}
}

const (
	holderA = "host/101/aaaaaaaa"
	holderB = "host/202/bbbbbbbb"
)

// move is a change of a task instance's row, fenced by writer (or an
// agent's report when writer is "").
func move(sec float64, from, to sdk.Attempt, oldState, newState, writer string, rowTerm int64, rowHolder string) boardhistory.Transition {
	return boardhistory.Transition{At: at(sec), From: from, To: to, OldState: oldState, NewState: newState, Term: rowTerm,
		Writer: writer, Fenced: writer != "", LeadHolder: rowHolder}
}

// report is an agent's report through a replica (unfenced).
func report(sec float64, a sdk.Attempt, oldState, newState, via string) boardhistory.Transition {
	return boardhistory.Transition{At: at(sec), From: a, To: a, OldState: oldState, NewState: newState, Term: 1,
		Writer: via, LeadHolder: holderA}
}

// clean: A leads term 1, B takes term 2. Task a runs, is killed, B marks
// it agent_lost and re-places it; the second epoch succeeds. The run is
// finished under term 2.
func clean() (boardhistory.Board, []boardhistory.Execution, []boardhistory.Fault, []boardhistory.Final) {
	a10, a11 := attempt("a", 1, 0), attempt("a", 1, 1)
	mark := move(20, a10, a10, sdk.StateRunning, sdk.StateFailed, holderB, 2, holderB)
	mark.FailureReason, mark.FailureKind = sdk.LabelAgentLost, sdk.FailureInfra
	replace := move(22, a10, a11, sdk.StateFailed, sdk.StateNone, holderB, 2, holderB)
	replace.OldFailureKind = sdk.FailureInfra
	b := boardhistory.Board{
		Terms: []boardhistory.Term{{Term: 1, Holder: holderA, At: at(0)}, {Term: 2, Holder: holderB, At: at(15)}},
		Transitions: []boardhistory.Transition{
			move(1, a10, a10, sdk.StateNone, sdk.StateQueued, holderA, 1, holderA),
			report(2, a10, sdk.StateQueued, sdk.StateRunning, holderA),
			mark,
			replace,
			move(23, a11, a11, sdk.StateNone, sdk.StateQueued, holderB, 2, holderB),
			report(24, a11, sdk.StateQueued, sdk.StateRunning, holderB),
			report(30, a11, sdk.StateRunning, sdk.StateSuccess, holderB),
		},
		RunChanges: []boardhistory.RunChange{{At: at(32), RunID: "r", OldState: sdk.RunRunning, NewState: sdk.RunSuccess,
			Term: 2, Writer: holderB, Fenced: true, LeadHolder: holderB}},
		Heartbeats: map[sdk.Attempt][]time.Time{a10: {at(3), at(4)}, a11: {at(25)}},
	}
	execs := []boardhistory.Execution{
		{Attempt: a10, ID: "a/0/11", Start: at(2), End: at(5.1), Outcome: history.OutcomeKilled, Note: "group gone"},
		{Attempt: a11, ID: "a/1/31", Start: at(24), End: at(29.9)},
	}
	faults := []boardhistory.Fault{{At: at(5), Note: "agent and group killed"}}
	finals := []boardhistory.Final{{Attempt: a11, State: sdk.StateSuccess, At: at(40)}}
	return b, execs, faults, finals
}

func TestRecordClean(t *testing.T) {
	events := boardhistory.Record(clean())
	v := history.Check(events)
	if !v.OK() {
		t.Fatalf("clean rows make a history with violations:\n%s", v)
	}
	// 2 acquisitions, 7 transitions, 1 run change, 3 heartbeats, 2
	// starts, 2 ends, 1 fault, 1 final.
	const line = "history: 19 events, 13 writes applied, 0 refused (0 by the fence), 2 executions, 2 terms, 1 faults; violations: 0"
	if v.Summary() != line {
		t.Errorf("summary:\n got %s\nwant %s", v.Summary(), line)
	}
	find := func(what string, ok func(history.Event) bool) history.Event {
		t.Helper()
		i := slices.IndexFunc(events, ok)
		if i < 0 {
			t.Fatalf("no %s among the events", what)
		}
		return events[i]
	}
	isOp := func(op string) func(history.Event) bool {
		return func(e history.Event) bool { return e.Kind == history.KindWrite && e.Op == op }
	}
	if e := find("mark", isOp("mark")); e.Term != 2 || e.Holder != holderB || e.State != sdk.StateFailed || e.Next != nil {
		t.Errorf("the mark: %+v", e)
	}
	if e := find("re-place", isOp("replace")); e.Next == nil || e.Next.Epoch != 1 || e.Term != 2 {
		t.Errorf("the re-place: %+v", e)
	}
	if e := find("report", isOp("report")); e.Term != 0 || e.Holder != "" || !strings.Contains(e.Note, "unfenced") {
		t.Errorf("an agent's report is unfenced: %+v", e)
	}
	if e := find("run change", isOp("run_success")); e.Term != 2 || e.Attempt != nil || !strings.Contains(e.Note, "run r") {
		t.Errorf("the run's finish: %+v", e)
	}
	if e := find("killed end", func(e history.Event) bool { return e.Kind == history.KindExecEnd && e.Exec == "a/0/11" }); e.Outcome != history.OutcomeKilled || e.Note != "group gone" {
		t.Errorf("the killed execution's end: %+v", e)
	}
	if e := find("plain end", func(e history.Event) bool { return e.Kind == history.KindExecEnd && e.Exec == "a/1/31" }); e.Outcome != "ended" {
		t.Errorf("an end with no outcome is recorded as ended: %+v", e)
	}
}

// A fault that lost the board's writes carries its window into the history.
func TestRecordLostWindow(t *testing.T) {
	events := boardhistory.Record(boardhistory.Board{}, nil,
		[]boardhistory.Fault{{At: at(9), LostFrom: at(3), Note: "primary killed"}, {At: at(10), Note: "standby promoted"}}, nil)
	if len(events) != 2 || !events[0].LostFrom.Equal(at(3)) || !events[0].Time.Equal(at(9)) || !events[1].LostFrom.IsZero() {
		t.Errorf("the faults: %+v", events)
	}
}

// A holder cut to what PostgreSQL keeps in a connection's name is still its
// writer's.
func TestRecordLongHolder(t *testing.T) {
	long := strings.Repeat("h", 70) + "/1/abcdabcd"
	a := attempt("a", 1, 0)
	b := boardhistory.Board{
		Terms:       []boardhistory.Term{{Term: 4, Holder: long, At: at(0)}},
		Transitions: []boardhistory.Transition{move(1, a, a, sdk.StateNone, sdk.StateQueued, long[:boardhistory.MaxWriterName], 4, long)},
	}
	events := boardhistory.Record(b, nil, nil, nil)
	i := slices.IndexFunc(events, func(e history.Event) bool { return e.Op == "set_queued" })
	if events[i].Term != 4 || events[i].Holder != long {
		t.Errorf("a cut name is its holder's: %+v", events[i])
	}
}

// Rows and executions that broke the promises make histories the checker
// refuses.
func TestRecordViolations(t *testing.T) {
	a10, a11 := attempt("a", 1, 0), attempt("a", 1, 1)
	for _, tc := range []struct {
		name string
		edit func(*boardhistory.Board, *[]boardhistory.Execution, *[]boardhistory.Final)
		want []history.Rule
	}{
		{
			name: "the killed execution established gone after its successor began",
			edit: func(_ *boardhistory.Board, x *[]boardhistory.Execution, _ *[]boardhistory.Final) {
				(*x)[0].End = at(24.5)
			},
			want: []history.Rule{history.RuleOverlap},
		},
		{
			name: "an execution never established ended",
			edit: func(_ *boardhistory.Board, x *[]boardhistory.Execution, _ *[]boardhistory.Final) {
				(*x)[1].End = time.Time{}
			},
			want: []history.Rule{history.RuleUnended},
		},
		{
			name: "a deposed writer after the next term's first write",
			edit: func(b *boardhistory.Board, _ *[]boardhistory.Execution, _ *[]boardhistory.Final) {
				b.Transitions = append(b.Transitions, move(26, a11, a11, sdk.StateRunning, sdk.StateRunning, holderA, 2, holderB))
			},
			want: []history.Rule{history.RuleStaleTerm},
		},
		{
			name: "a fenced writer that never acquired a term",
			edit: func(b *boardhistory.Board, _ *[]boardhistory.Execution, _ *[]boardhistory.Final) {
				b.Transitions = append(b.Transitions, move(26, a11, a11, sdk.StateRunning, sdk.StateRunning, "host/303/cccccccc", 2, holderB))
			},
			want: []history.Rule{history.RuleTermTwice},
		},
		{
			name: "a success overwritten and the final row behind",
			edit: func(b *boardhistory.Board, _ *[]boardhistory.Execution, f *[]boardhistory.Final) {
				b.Transitions = append(b.Transitions, move(35, a11, a11, sdk.StateSuccess, sdk.StateFailed, holderB, 2, holderB))
				(*f)[0] = boardhistory.Final{Attempt: a10, State: sdk.StateFailed, At: at(40)}
			},
			want: []history.Rule{history.RuleOverwritten, history.RuleLost},
		},
		{
			name: "no final row",
			edit: func(_ *boardhistory.Board, _ *[]boardhistory.Execution, f *[]boardhistory.Final) { *f = nil },
			want: []history.Rule{history.RuleNoFinal},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, x, faults, f := clean()
			tc.edit(&b, &x, &f)
			v := history.Check(boardhistory.Record(b, x, faults, f))
			var got []history.Rule
			for _, vi := range v.Violations {
				got = append(got, vi.Rule)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("rules %v, want %v:\n%s", got, tc.want, v)
			}
		})
	}
}

// The fence's refusals are history events: one per task attempt a
// refusal named (one about no attempt when it named none), refused as
// deposed, with what the fence met. A stale writer's refusals keep the
// history clean; the rightful holder refused breaks it, named.
func TestRecordRefusals(t *testing.T) {
	a10, a11 := attempt("a", 1, 0), attempt("a", 1, 1)
	// Replica A, deposed by B's term 2 at 15, marks a batch under term 1 at
	// 21 (two attempts, three requests) and tries to reap the run at 26.
	stale := board.FenceRefusal{ID: 1, At: at(21), Write: "mark", Term: 1, Holder: holderA, WriteAt: at(20.9),
		Attempts: []sdk.Attempt{a10, attempt("b", 1, 0)}, Requests: 3,
		LeadFound: true, LeadTerm: 2, LeadHolder: holderB, LeadExpiresAt: at(60)}
	reap := board.FenceRefusal{ID: 2, At: at(26), Write: "reap run", Term: 1, Holder: holderA, WriteAt: at(26),
		Attempts: []sdk.Attempt{{RunID: "r"}}, Requests: 1, LeadFound: true, LeadTerm: 2, LeadHolder: holderB, LeadExpiresAt: at(60)}

	b, x, faults, f := clean()
	b.Refusals = []board.FenceRefusal{stale, reap}
	f = append(f, boardhistory.Final{Attempt: attempt("b", 1, 0), State: sdk.StateSuccess, At: at(40)})
	events := boardhistory.Record(b, x, faults, f)
	v := history.Check(events)
	if !v.OK() || v.RefusedByFence != 3 {
		t.Fatalf("a stale writer's refusals: %s", v)
	}
	var refused []history.Event
	for _, e := range events {
		if e.Outcome == history.OutcomeDeposed {
			refused = append(refused, e)
		}
	}
	if len(refused) != 3 {
		t.Fatalf("refusal events: %+v", refused)
	}
	first := refused[0]
	if first.Op != "mark" || first.Term != 1 || first.Holder != holderA || first.Attempt == nil || first.Attempt.TaskID != "a" || first.Attempt.Try != 1 ||
		!first.Time.Equal(at(21)) || first.Fence == nil || first.Fence.Term != 2 || first.Fence.Holder != holderB ||
		!first.Fence.WriteAt.Equal(at(20.9)) || !strings.Contains(first.Note, "refused by the fence (term)") ||
		!strings.Contains(first.Note, "3 requests, the first 2 named") {
		t.Errorf("the batch's first event: %+v %+v", first, first.Fence)
	}
	if r := refused[2]; r.Op != "reap run" || r.Attempt != nil || !strings.Contains(r.Note, "run r") {
		t.Errorf("the run's reap: %+v", r)
	}

	// B refused under its own term, its lease running: the fence refused
	// the rightful holder.
	b.Refusals = append(b.Refusals, board.FenceRefusal{ID: 3, At: at(25), Write: "settle", Term: 2, Holder: holderB,
		WriteAt: at(24.9), Attempts: []sdk.Attempt{a11}, Requests: 1,
		LeadFound: true, LeadTerm: 2, LeadHolder: holderB, LeadExpiresAt: at(60)})
	v = history.Check(boardhistory.Record(b, x, faults, f))
	if got := rules(v); !slices.Equal(got, []history.Rule{history.RuleRightfulRefused}) {
		t.Fatalf("rules %v:\n%s", got, v)
	}
	// Past its own lease it is the lease's refusal, and stale.
	b.Refusals[2].LeadExpiresAt = at(24)
	if v := history.Check(boardhistory.Record(b, x, faults, f)); !v.OK() {
		t.Errorf("a refusal past the writer's own lease: %s", v)
	}
}

func rules(v history.Verdict) []history.Rule {
	var out []history.Rule
	for _, x := range v.Violations {
		out = append(out, x.Rule)
	}
	return out
}

// Judge writes the file and judges it read back.
func TestJudge(t *testing.T) {
	path := filepath.Join(t.TempDir(), "history.jsonl")
	v, err := boardhistory.Judge(path, boardhistory.Record(clean()))
	if err != nil {
		t.Fatal(err)
	}
	if !v.OK() || v.Events != 19 {
		t.Fatalf("verdict: %s", v)
	}
	read, err := history.Read(path)
	if err != nil || len(read) != 19 {
		t.Fatalf("read back %d events, %v", len(read), err)
	}
}

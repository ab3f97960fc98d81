package soak

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/history"
)

// Hand-made accounts of a soak, turned into a history (Record) and judged
// (history.Check). Times are seconds after t0.

const (
	holderA = "host/101/aaaaaaaa"
	holderB = "host/202/bbbbbbbb"
)

// move is a change of a task instance's row, fenced by writer (or an
// agent's report when writer is "").
func move(sec float64, from, to sdk.Attempt, oldState, newState, writer string, rowTerm int64, rowHolder string) Transition {
	return Transition{At: at(sec), From: from, To: to, OldState: oldState, NewState: newState, Term: rowTerm,
		Writer: writer, Fenced: writer != "", LeadHolder: rowHolder}
}

// report is an agent's report through a replica (unfenced).
func report(sec float64, a sdk.Attempt, oldState, newState, via string) Transition {
	return Transition{At: at(sec), From: a, To: a, OldState: oldState, NewState: newState, Term: 1, Writer: via,
		LeadHolder: holderA}
}

// cleanAccounts: A leads term 1 and B takes term 2 after A is paused. Task
// a is queued under term 1, runs, its agent is killed, B marks it agent_lost
// under term 2 and re-places it; the second epoch succeeds. Task b fails
// as a task failure, is retried under term 2 and succeeds. The run is
// finished under term 2.
func cleanAccounts() (History, []Final) {
	a10, a11 := attempt("a", 1, 0), attempt("a", 1, 1)
	b10, b20 := attempt("b", 1, 0), attempt("b", 2, 0)
	mark := move(20, a10, a10, sdk.StateRunning, sdk.StateFailed, holderB, 2, holderB)
	mark.FailureReason, mark.FailureKind = sdk.LabelAgentLost, sdk.FailureInfra
	replace := move(22, a10, a11, sdk.StateFailed, sdk.StateNone, holderB, 2, holderB)
	replace.OldFailureKind = sdk.FailureInfra
	failB := report(9, b10, sdk.StateRunning, sdk.StateFailed, holderB)
	failB.FailureKind = sdk.FailureTask
	h := History{
		Terms: []Term{{Term: 1, Holder: holderA, At: at(0)}, {Term: 2, Holder: holderB, At: at(15)}},
		Transitions: []Transition{
			move(1, a10, a10, sdk.StateNone, sdk.StateQueued, holderA, 1, holderA),
			move(1.5, b10, b10, sdk.StateNone, sdk.StateQueued, holderA, 1, holderA),
			report(2, a10, sdk.StateQueued, sdk.StateRunning, holderB),
			report(2.5, b10, sdk.StateQueued, sdk.StateRunning, holderA),
			failB,
			mark,
			move(21, b10, b20, sdk.StateFailed, sdk.StateNone, holderB, 2, holderB),
			replace,
			move(23, a11, a11, sdk.StateNone, sdk.StateQueued, holderB, 2, holderB),
			move(23.5, b20, b20, sdk.StateNone, sdk.StateQueued, holderB, 2, holderB),
			report(24, a11, sdk.StateQueued, sdk.StateRunning, holderA),
			report(24.5, b20, sdk.StateQueued, sdk.StateRunning, holderA),
			report(30, a11, sdk.StateRunning, sdk.StateSuccess, holderA),
			report(31, b20, sdk.StateRunning, sdk.StateSuccess, holderB),
		},
		RunChanges: []RunChange{{At: at(32), RunID: "r", OldState: sdk.RunRunning, NewState: sdk.RunFailed, Term: 2,
			Writer: holderB, Fenced: true, LeadHolder: holderB}},
		Heartbeats: map[sdk.Attempt][]time.Time{a10: {at(3), at(4)}, a11: {at(25)}},
		Executions: []Execution{
			// Killed with its agent: no end line; its group seen alive at 5, gone at 5.1.
			{Attempt: a10, AgentPID: 11, PGID: 12, LeaderStart: 7, Start: at(2), LastSeenAlive: at(5), Gone: true, GoneSeen: at(5.1)},
			{Attempt: b10, AgentPID: 21, PGID: 22, LeaderStart: 8, Start: at(2.5), End: at(8.9), EndState: sdk.StateFailed,
				EndReason: "exit_code", LastSeenAlive: at(8.8), Gone: true, GoneSeen: at(9)},
			// Its group seen alive after its end line: it ended then.
			{Attempt: a11, AgentPID: 31, PGID: 32, LeaderStart: 9, Start: at(24), End: at(29.9), EndState: sdk.StateSuccess,
				LastSeenAlive: at(29.95), Gone: true, GoneSeen: at(30)},
			{Attempt: b20, AgentPID: 41, PGID: 42, LeaderStart: 10, Start: at(24.5), End: at(30.9), EndState: sdk.StateSuccess,
				LastSeenAlive: at(30.8), Gone: true, GoneSeen: at(31)},
		},
		Faults: []Fault{
			{Kind: FaultAgentGroupKill, At: at(5.05), Ended: at(5.05), Target: &a10, KilledGroup: true, Detail: "agent 11"},
			{Kind: FaultLeaderPause, At: at(10), Ended: at(16), Detail: "reaperd #1"},
		},
	}
	finals := []Final{{Attempt: a11, State: sdk.StateSuccess, At: at(40)}, {Attempt: b20, State: sdk.StateSuccess, At: at(40)}}
	return h, finals
}

func TestRecordCleanAccounts(t *testing.T) {
	h, finals := cleanAccounts()
	events := Record(h, finals)
	v := history.Check(events)
	if !v.OK() {
		t.Fatalf("clean accounts make a history with violations:\n%s", v)
	}
	// 2 acquisitions, 14 transitions, 1 run change, 3 heartbeats, 4
	// starts, 4 ends, 2 faults, 2 finals.
	const line = "history: 32 events, 20 writes applied, 0 refused (0 by the fence), 4 executions, 2 terms, 2 faults; violations: 0"
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
	if e := find("acquisition of term 2", func(e history.Event) bool { return isOp("acquire")(e) && e.Term == 2 }); e.Holder != holderB || !e.Time.Equal(at(15)) {
		t.Errorf("term 2's acquisition: %+v", e)
	}
	if e := find("mark", isOp("mark")); e.Term != 2 || e.Holder != holderB || e.State != sdk.StateFailed || e.Next != nil {
		t.Errorf("the mark: %+v", e)
	}
	if e := find("re-place", isOp("replace")); e.Next == nil || *e.Next != *histAttempt(attempt("a", 1, 1)) || e.Term != 2 {
		t.Errorf("the re-place: %+v", e)
	}
	if e := find("retry", isOp("retry")); e.Next == nil || e.Next.Try != 2 || e.Attempt.Try != 1 {
		t.Errorf("the retry: %+v", e)
	}
	if e := find("report", isOp("report")); e.Term != 0 || e.Holder != "" || !strings.Contains(e.Note, "unfenced") {
		t.Errorf("an agent's report is unfenced: %+v", e)
	}
	if e := find("queue under term 1", func(e history.Event) bool { return isOp("set_queued")(e) && e.Time.Equal(at(1)) }); e.Term != 1 || e.Holder != holderA {
		t.Errorf("the first queue: %+v", e)
	}
	if e := find("run change", isOp("run_failed")); e.Term != 2 || e.Attempt != nil || !strings.Contains(e.Note, "run r") {
		t.Errorf("the run's finish: %+v", e)
	}
	ends := map[string]history.Event{}
	for _, e := range events {
		if e.Kind == history.KindExecEnd {
			ends[e.Exec] = e
		}
	}
	if e := ends["agent 11 group 12 started 7"]; e.Outcome != history.OutcomeKilled || !e.Time.Equal(at(5.1)) ||
		!strings.Contains(e.Note, "injector killed its group") {
		t.Errorf("the killed execution's end: %+v", e)
	}
	if e := ends["agent 31 group 32 started 9"]; !e.Time.Equal(at(29.95)) || e.Outcome != sdk.StateSuccess {
		t.Errorf("an execution seen alive after its end line ends at that sight: %+v", e)
	}
	if e := ends["agent 21 group 22 started 8"]; !e.Time.Equal(at(8.9)) || e.Outcome != "failed; exit_code" {
		t.Errorf("an execution's reported end: %+v", e)
	}
}

// The holder a connection names is cut to 63 bytes: still its writer's.
func TestRecordLongHolder(t *testing.T) {
	long := strings.Repeat("h", 70) + "/1/abcdabcd"
	a := attempt("a", 1, 0)
	h := History{
		Terms:       []Term{{Term: 4, Holder: long, At: at(0)}},
		Transitions: []Transition{move(1, a, a, sdk.StateNone, sdk.StateQueued, long[:maxWriterName], 4, long)},
	}
	events := Record(h, nil)
	i := slices.IndexFunc(events, func(e history.Event) bool { return e.Op == "set_queued" })
	if events[i].Term != 4 || events[i].Holder != long {
		t.Errorf("a cut name is its holder's: %+v", events[i])
	}
}

func rulesOf(v history.Verdict) []history.Rule {
	var out []history.Rule
	for _, x := range v.Violations {
		out = append(out, x.Rule)
	}
	return out
}

// Accounts that broke the promises make histories the checker refuses.
func TestRecordViolations(t *testing.T) {
	a10, a11 := attempt("a", 1, 0), attempt("a", 1, 1)
	for _, tc := range []struct {
		name  string
		edit  func(h *History, finals *[]Final)
		want  []history.Rule
		words []string
	}{
		{
			name: "two executions of one task overlapping",
			edit: func(h *History, _ *[]Final) {
				// The first epoch's group, killed at 5, was still seen
				// alive at 24.2, after the second epoch began.
				h.Executions[0].LastSeenAlive, h.Executions[0].GoneSeen = at(24.2), at(24.3)
			},
			want:  []history.Rule{history.RuleOverlap},
			words: []string{"r/a ran twice", `"agent 11 group 12 started 7"`, `"agent 31 group 32 started 9"`},
		},
		{
			name: "an execution the process table still saw at the end",
			edit: func(h *History, _ *[]Final) {
				h.Executions[3].End, h.Executions[3].Gone = time.Time{}, false
			},
			want:  []history.Rule{history.RuleUnended},
			words: []string{`"agent 41 group 42 started 10"`},
		},
		{
			name: "a write of an old term after the newer term's first write",
			edit: func(h *History, _ *[]Final) {
				// A, deposed, writes after B's first write at 20: its own
				// term is 1 though the row holds 2.
				late := move(26, attempt("b", 2, 0), attempt("b", 2, 0), sdk.StateRunning, sdk.StateRunning, holderA, 2, holderB)
				h.Transitions = append(h.Transitions, late)
			},
			want:  []history.Rule{history.RuleStaleTerm},
			words: []string{"term 1", `"` + holderA + `"`, "term 2's first applied write"},
		},
		{
			name: "a fenced write by a replica that never acquired a term",
			edit: func(h *History, _ *[]Final) {
				h.Transitions = append(h.Transitions,
					move(26, attempt("b", 2, 0), attempt("b", 2, 0), sdk.StateRunning, sdk.StateRunning, "host/303/cccccccc", 2, holderB))
			},
			want:  []history.Rule{history.RuleTermTwice},
			words: []string{"term 2", "host/303/cccccccc", holderB},
		},
		{
			name: "a success overwritten and the final row behind",
			edit: func(h *History, finals *[]Final) {
				h.Transitions = append(h.Transitions,
					move(35, a11, a11, sdk.StateSuccess, sdk.StateFailed, holderB, 2, holderB))
				(*finals)[0] = Final{Attempt: a10, State: sdk.StateFailed, At: at(40)}
			},
			want: []history.Rule{history.RuleOverwritten, history.RuleLost},
		},
		{
			name: "a task with no final row",
			edit: func(_ *History, finals *[]Final) { *finals = (*finals)[1:] },
			want: []history.Rule{history.RuleNoFinal},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, finals := cleanAccounts()
			tc.edit(&h, &finals)
			v := history.Check(Record(h, finals))
			if got := rulesOf(v); !slices.Equal(got, tc.want) {
				t.Fatalf("rules %v, want %v:\n%s", got, tc.want, v)
			}
			for _, w := range tc.words {
				if !strings.Contains(v.Violations[0].Text, w) {
					t.Errorf("the violation does not say %q:\n%s", w, v.Violations[0])
				}
			}
		})
	}
}

// The soak finds the leading replica by the pid in its holder: reaperd's
// holder is host/pid/random.
func TestHolderPID(t *testing.T) {
	for holder, want := range map[string]int{
		"node-1/4242/0a1b2c3d": 4242,
		"node-1/4242/12345678": 4242,
		"node-1/4242":          4242,
		"node-1":               0,
		"":                     0,
	} {
		if got := holderPID(holder); got != want {
			t.Errorf("holderPID(%q) = %d, want %d", holder, got, want)
		}
	}
}

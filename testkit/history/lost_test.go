package history_test

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/dexaflow/reaper/testkit/history"
)

// lost is a fault event saying the board lost its writes from from to the
// event's time.
func lost(from, ms int) history.Event {
	e := fault(ms, "primary killed, its asynchronous standby promoted")
	e.LostFrom = at(from)
	return e
}

// lostRun is a history where the board lost its writes from 100 to 200
// (the primary killed at 200) and applied again from 300 (the promotion):
// task a lived through it on the board; run-2's task l was submitted,
// dispatched and started in the window, and the promoted board never had
// it; its agent was told to stop once the promoted board answered.
func lostRun() []history.Event {
	l := &history.Attempt{RunID: "run-2", TaskID: "l", Try: 1, Epoch: 0}
	return []history.Event{
		w(10, "acquire", 1, "replica-1", nil, applied, ""),
		w(20, "set_queued", 1, "replica-1", att("a", 1, 0), applied, "queued"),
		start(30, att("a", 1, 0), "a1"),
		w(40, "report", 0, "", att("a", 1, 0), applied, "running"),
		start(150, l, "l1"),
		lost(100, 200),
		w(300, "acquire", 2, "replica-2", nil, applied, ""),
		end(310, "l1", "failed terminated"),
		w(400, "report", 0, "", att("a", 1, 0), applied, "success"),
		end(401, "a1", "success"),
		final(500, att("a", 1, 0), "success"),
	}
}

// A task the promoted board never had, all of whose executions started in
// the lost window, has no final row: excused, and counted.
func TestLostWindowExcusesALostRun(t *testing.T) {
	v := history.Check(lostRun())
	if !v.OK() || v.ExcusedByLostWindow != 1 {
		t.Fatalf("excused %d, want 1:\n%s", v.ExcusedByLostWindow, v)
	}
	if !strings.Contains(v.Summary(), "1 excused_by_lost_window") {
		t.Errorf("summary %q does not name the excuse", v.Summary())
	}
	// The window, read back from a file, excuses the same.
	var buf bytes.Buffer
	wr := history.NewWriter(&buf)
	for _, e := range lostRun() {
		if err := wr.Record(e); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(buf.String(), `"lost_from":"`) {
		t.Fatalf("no lost_from in the file:\n%s", buf.String())
	}
	read, err := history.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if v := history.Check(read); !v.OK() || v.ExcusedByLostWindow != 1 {
		t.Errorf("read back: excused %d:\n%s", v.ExcusedByLostWindow, v)
	}
}

// The excuse is narrow: whatever the window does not explain is caught.
func TestLostWindowExcusesNothingElse(t *testing.T) {
	l := &history.Attempt{RunID: "run-2", TaskID: "l", Try: 1, Epoch: 0}
	replace := func(events []history.Event, exec string, e history.Event) []history.Event {
		out := slices.Clone(events)
		for i, x := range out {
			if x.Kind == history.KindExecStart && x.Exec == exec {
				out[i] = e
			}
		}
		return out
	}
	noWindow := slices.DeleteFunc(lostRun(), func(e history.Event) bool { return !e.LostFrom.IsZero() })
	for _, tc := range []struct {
		name   string
		events []history.Event
		want   []history.Rule
	}{
		{"no window: a task with no final row", noWindow, []history.Rule{history.RuleNoFinal}},
		{"started before the window opened", replace(lostRun(), "l1", start(90, l, "l1")), []history.Rule{history.RuleNoFinal}},
		{"started as the window opened", replace(lostRun(), "l1", start(100, l, "l1")), []history.Rule{history.RuleNoFinal}},
		{"started once the promoted board applied writes", replace(lostRun(), "l1", start(305, l, "l1")),
			[]history.Rule{history.RuleNoFinal}},
		{"a second execution started after the window", append(lostRun(), start(320, l, "l2"), end(330, "l2", "success")),
			[]history.Rule{history.RuleNoFinal}},
		{"the promoted board wrote the task", append(lostRun(), w(320, "report", 0, "", l, applied, "running")),
			[]history.Rule{history.RuleNoFinal}},
		{"an execution of the lost task never ended", slices.DeleteFunc(lostRun(), func(e history.Event) bool {
			return e.Kind == history.KindExecEnd && e.Exec == "l1"
		}), []history.Rule{history.RuleUnended}},
		{"two executions of the lost task at once", append(lostRun(), start(160, l, "l2"), end(170, "l2", "success")),
			[]history.Rule{history.RuleOverlap}},
		{"a term handed out again applies writes from two holders", append(lostRun(),
			w(150, "acquire", 2, "replica-3", nil, applied, ""), // on the lost primary: absent from a real history
			w(350, "mark", 2, "replica-3", att("a", 1, 0), applied, "failed")),
			[]history.Rule{history.RuleTermTwice, history.RuleOverwritten}},
		{"a settled outcome lost after the promotion", append(lostRun(), w(450, "report", 0, "", att("a", 1, 0), applied, "failed")),
			[]history.Rule{history.RuleOverwritten, history.RuleLost}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := history.Check(tc.events)
			got := rules(v)
			slices.Sort(got)
			want := slices.Clone(tc.want)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("rules %v, want %v:\n%s", got, want, v)
			}
		})
	}
}

// A window that cannot be read is malformed: it excuses nothing.
func TestLostWindowMalformed(t *testing.T) {
	backwards := lostRun()
	for i, e := range backwards {
		if !e.LostFrom.IsZero() {
			backwards[i].LostFrom = at(250)
		}
	}
	onAWrite := w(60, "report", 0, "", att("a", 1, 0), applied, "running")
	onAWrite.LostFrom = at(50)
	for name, events := range map[string][]history.Event{
		"lost from after the fault": backwards,
		"lost from on a write":      append(lostRun(), onAWrite),
	} {
		v := history.Check(events)
		got := rules(v)
		if !slices.Contains(got, history.RuleMalformed) {
			t.Errorf("%s: rules %v, want malformed:\n%s", name, got, v)
		}
		if name == "lost from after the fault" && (!slices.Contains(got, history.RuleNoFinal) || v.ExcusedByLostWindow != 0) {
			t.Errorf("%s: a malformed window excused %d:\n%s", name, v.ExcusedByLostWindow, v)
		}
	}
}

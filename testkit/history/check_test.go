package history_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/history"
)

// Hand-made histories. Times are milliseconds after t0.
var t0 = time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func att(task string, try, epoch int32) *history.Attempt {
	return &history.Attempt{RunID: "run-1", TaskID: task, Try: try, Epoch: epoch}
}

// w is a write under a term (0: an unfenced write).
func w(ms int, op string, term int64, holder string, a *history.Attempt, outcome, state string) history.Event {
	return history.Event{Time: at(ms), Kind: history.KindWrite, Op: op, Term: term, Holder: holder, Attempt: a, Outcome: outcome, State: state}
}

// sentAt gives a write the time it was sent.
func sentAt(ms int, e history.Event) history.Event {
	e.Since = at(ms)
	return e
}

// moved is a write that moves a to next.
func moved(ms int, op string, term int64, holder string, a, next *history.Attempt) history.Event {
	e := w(ms, op, term, holder, a, history.OutcomeApplied, "none")
	e.Next = next
	return e
}

func start(ms int, a *history.Attempt, exec string) history.Event {
	return history.Event{Time: at(ms), Kind: history.KindExecStart, Attempt: a, Exec: exec}
}

func end(ms int, exec, outcome string) history.Event {
	return history.Event{Time: at(ms), Kind: history.KindExecEnd, Exec: exec, Outcome: outcome}
}

func final(ms int, a *history.Attempt, state string) history.Event {
	return history.Event{Time: at(ms), Kind: history.KindFinal, Attempt: a, State: state}
}

func fault(ms int, note string) history.Event {
	return history.Event{Time: at(ms), Kind: history.KindFault, Note: note}
}

const applied, deposed = history.OutcomeApplied, history.OutcomeDeposed

// clean is a run that kept every promise: task a's first attempt is
// marked as an infra failure under term 1, confirmed, the leader fails
// over, term 2 re-places it (its old pod killed first) and the second
// epoch succeeds; the deposed leader's late settle is refused by the
// fence. Task b fails, is retried, and succeeds on its second try.
func clean() []history.Event {
	return []history.Event{
		start(0, att("a", 1, 0), "pod-a1"),
		start(1, att("b", 1, 0), "pod-b1"),
		w(10, "report", 0, "", att("a", 1, 0), applied, "running"),
		w(11, "report", 0, "", att("b", 1, 0), applied, "running"),
		fault(20, "partition: replica-1 from the API server"),
		w(30, "mark", 1, "replica-1", att("a", 1, 0), applied, "failed"),
		w(35, "report", 0, "", att("b", 1, 0), applied, "failed"),
		end(36, "pod-b1", "exit 1"),
		end(40, "pod-a1", history.OutcomeKilled),
		w(50, "confirm", 1, "replica-1", att("a", 1, 0), applied, "failed"),
		fault(55, "heal"),
		moved(60, "retry", 2, "replica-2", att("b", 1, 0), att("b", 2, 0)),
		moved(61, "replace", 2, "replica-2", att("a", 1, 0), att("a", 1, 1)),
		w(62, "settle", 1, "replica-1", att("a", 1, 0), deposed, "failed"),
		w(63, "report", 0, "", att("a", 1, 0), "moved_on", "success"),
		start(70, att("a", 1, 1), "pod-a2"),
		start(71, att("b", 2, 0), "pod-b2"),
		w(75, "heartbeat", 0, "", att("a", 1, 1), applied, ""),
		w(80, "report", 0, "", att("a", 1, 1), applied, "success"),
		w(81, "report", 0, "", att("b", 2, 0), applied, "success"),
		end(85, "pod-a2", "success"),
		end(86, "pod-b2", "success"),
		w(90, "prune", 2, "replica-2", nil, applied, ""),
		final(100, att("a", 1, 1), "success"),
		final(100, att("b", 2, 0), "success"),
	}
}

func TestCleanHistoryPasses(t *testing.T) {
	v := history.Check(clean())
	if !v.OK() {
		t.Fatalf("a clean history has violations:\n%s", v)
	}
	want := history.Verdict{Events: 25, WritesApplied: 11, WritesRefused: 2, RefusedByFence: 1, Executions: 4, Terms: 2, Faults: 2}
	if v.Events != want.Events || v.WritesApplied != want.WritesApplied || v.WritesRefused != want.WritesRefused ||
		v.RefusedByFence != want.RefusedByFence || v.Executions != want.Executions || v.Terms != want.Terms || v.Faults != want.Faults {
		t.Errorf("counts:\n got %s\nwant %s", v.Summary(), want.Summary())
	}
	const line = "history: 25 events, 11 writes applied, 2 refused (1 by the fence), 4 executions, 2 terms, 2 faults; violations: 0"
	if v.String() != line {
		t.Errorf("report:\n got %q\nwant %q", v.String(), line)
	}
}

// The lines of a file need not be in time order: the same history,
// reversed or shuffled, gets the same verdict.
func TestOutOfOrderLines(t *testing.T) {
	h := clean()
	slices.Reverse(h)
	if v := history.Check(h); !v.OK() {
		t.Errorf("reversed clean history:\n%s", v)
	}
	// Every other line moved to the end.
	var shuffled []history.Event
	for i := 0; i < len(h); i += 2 {
		shuffled = append(shuffled, h[i])
	}
	for i := 1; i < len(h); i += 2 {
		shuffled = append(shuffled, h[i])
	}
	if v := history.Check(shuffled); !v.OK() {
		t.Errorf("shuffled clean history:\n%s", v)
	}

	// A violation is found however the lines lie.
	bad := []history.Event{
		final(200, att("a", 1, 0), "success"),
		w(100, "settle", 1, "old", att("a", 1, 0), applied, "success"),
		w(50, "mark", 2, "new", att("a", 1, 0), applied, "failed"),
	}
	v := history.Check(bad)
	if got := rules(v); !slices.Equal(got, []history.Rule{history.RuleOverwritten, history.RuleStaleTerm}) {
		t.Errorf("rules %v, want outcome_overwritten and stale_term:\n%s", got, v)
	}
}

func rules(v history.Verdict) []history.Rule {
	var rs []history.Rule
	for _, x := range v.Violations {
		rs = append(rs, x.Rule)
	}
	return rs
}

func TestViolations(t *testing.T) {
	a10, a11, a20 := att("a", 1, 0), att("a", 1, 1), att("a", 2, 0)
	for _, tc := range []struct {
		name   string
		events []history.Event
		want   []history.Rule // in the verdict's order (by time)
		// mention: words each violation's text must hold, by index.
		mention [][]string
	}{
		// One writer.
		{
			name: "a stale term's write after the newer term's first write",
			events: []history.Event{
				w(10, "mark", 1, "replica-1", a10, applied, "failed"),
				w(50, "heartbeat", 2, "replica-2", a10, applied, ""),
				w(60, "confirm", 1, "replica-1", a10, applied, "failed"),
				w(70, "confirm", 1, "replica-1", a10, applied, "failed"),
				final(100, a10, "failed"),
			},
			want:    []history.Rule{history.RuleStaleTerm},
			mention: [][]string{{"term 1", `"replica-1"`, "2 write(s)", "term 2", `"replica-2"`, ts(50), ts(60), "op confirm"}},
		},
		{
			name: "an older term's write sent before the newer term's first write came back is no proof",
			events: []history.Event{
				w(50, "mark", 2, "replica-2", a10, applied, "failed"),
				sentAt(40, w(60, "confirm", 1, "replica-1", a10, applied, "failed")),
				final(100, a10, "failed"),
			},
		},
		{
			name: "an older term's write sent after the newer term's first write came back",
			events: []history.Event{
				w(50, "mark", 2, "replica-2", a10, applied, "failed"),
				sentAt(51, w(60, "confirm", 1, "replica-1", a10, applied, "failed")),
				final(100, a10, "failed"),
			},
			want:    []history.Rule{history.RuleStaleTerm},
			mention: [][]string{{"sent at " + ts(51)}},
		},
		{
			name: "a stale term's write at the very instant of the newer term's first write orders nothing",
			events: []history.Event{
				w(50, "mark", 2, "replica-2", a10, applied, "failed"),
				w(50, "confirm", 1, "replica-1", a10, applied, "failed"),
				final(100, a10, "failed"),
			},
		},
		{
			name: "a stale term's write against a term two ahead",
			events: []history.Event{
				w(10, "mark", 3, "replica-3", a10, applied, "failed"),
				w(20, "mark", 2, "replica-2", att("b", 1, 0), applied, "failed"),
				w(30, "confirm", 1, "replica-1", a10, applied, "failed"),
				final(100, a10, "failed"),
				final(100, att("b", 1, 0), "failed"),
			},
			want: []history.Rule{history.RuleStaleTerm, history.RuleStaleTerm},
			mention: [][]string{
				{"term 2", "term 3's first applied write"},
				{"term 1", "term 3's first applied write"},
			},
		},
		{
			name: "two holders under one term (a term handed out twice)",
			events: []history.Event{
				w(10, "mark", 5, "replica-1", a10, applied, "failed"),
				w(20, "prune", 5, "replica-2", nil, applied, ""),
				w(30, "confirm", 5, "replica-1", a10, applied, "failed"),
				final(100, a10, "failed"),
			},
			want:    []history.Rule{history.RuleTermTwice},
			mention: [][]string{{"term 5", "2 holders", `"replica-1" first at ` + ts(10), `"replica-2" first at ` + ts(20), "op prune"}},
		},
		{
			name: "refused writes never count: a deposed leader refused, a second holder refused",
			events: []history.Event{
				w(10, "mark", 2, "replica-2", a10, applied, "failed"),
				w(20, "confirm", 1, "replica-1", a10, deposed, "failed"),
				w(30, "confirm", 2, "replica-9", a10, deposed, "failed"),
				w(40, "settle", 1, "replica-1", a10, "moved_on", "success"),
				w(50, "report", 0, "", a10, "moved_on", "running"),
				final(100, a10, "failed"),
			},
		},

		// One execution.
		{
			name: "two executions of one task overlapping",
			events: []history.Event{
				start(0, a10, "pod-1"),
				start(50, a11, "pod-2"),
				end(100, "pod-1", "success"),
				end(150, "pod-2", "success"),
				final(200, a11, "success"),
			},
			want:    []history.Rule{history.RuleOverlap},
			mention: [][]string{{"run-1/a ran twice", "from " + ts(50) + " to " + ts(100), `"pod-1"`, `"pod-2"`, "try 1 epoch 0", "try 1 epoch 1"}},
		},
		{
			name: "one execution ending at the instant the next begins",
			events: []history.Event{
				start(0, a10, "pod-1"),
				end(50, "pod-1", history.OutcomeKilled),
				start(50, a11, "pod-2"),
				end(100, "pod-2", "success"),
				final(200, a11, "success"),
			},
		},
		{
			name: "executions of two tasks at once",
			events: []history.Event{
				start(0, a10, "pod-1"),
				start(10, att("b", 1, 0), "pod-2"),
				end(100, "pod-1", "success"),
				end(100, "pod-2", "success"),
				final(200, a10, "success"),
				final(200, att("b", 1, 0), "success"),
			},
		},
		{
			name: "an open execution overlaps every later one of its task",
			events: []history.Event{
				start(0, a10, "pod-1"),
				start(50, a11, "pod-2"),
				end(100, "pod-2", "success"),
				final(200, a11, "success"),
			},
			want: []history.Rule{history.RuleOverlap, history.RuleUnended},
			mention: [][]string{
				{"from " + ts(50) + " to " + ts(100), "no end"},
				{`"pod-1"`, "started at " + ts(0), "no end by the history's last event at " + ts(200)},
			},
		},
		{
			name: "an open execution started while an earlier one still ran",
			events: []history.Event{
				start(0, a10, "pod-1"),
				start(50, a11, "pod-2"),
				end(100, "pod-1", history.OutcomeKilled),
				final(200, a11, "success"),
			},
			want: []history.Rule{history.RuleOverlap, history.RuleUnended},
			mention: [][]string{
				{"from " + ts(50) + " to " + ts(100), `"pod-2" (try 1 epoch 1, from ` + ts(50) + ", no end)"},
				{`"pod-2"`},
			},
		},
		{
			name: "an open execution started after the earlier one ended",
			events: []history.Event{
				start(0, a10, "pod-1"),
				end(40, "pod-1", history.OutcomeKilled),
				start(50, a11, "pod-2"),
				final(200, a11, "success"),
			},
			want: []history.Rule{history.RuleUnended},
		},
		{
			name: "an open execution",
			events: []history.Event{
				start(0, a10, "pod-1"),
				w(10, "report", 0, "", a10, applied, "success"),
				final(200, a10, "success"),
			},
			want:    []history.Rule{history.RuleUnended},
			mention: [][]string{{`"pod-1"`, "run-1/a try 1 epoch 0"}},
		},
		{
			name: "a killed execution ends",
			events: []history.Event{
				start(0, a10, "pod-1"),
				end(40, "pod-1", history.OutcomeKilled),
				start(50, a11, "pod-2"),
				end(60, "pod-2", "success"),
				final(200, a11, "success"),
			},
		},

		// No outcome lost or overwritten.
		{
			name: "a success overwritten by a failure",
			events: []history.Event{
				w(10, "report", 0, "", a10, applied, "success"),
				w(20, "settle", 3, "replica-1", a10, applied, "failed"),
				final(100, a10, "failed"),
			},
			want:    []history.Rule{history.RuleOverwritten},
			mention: [][]string{{"op settle under term 3", "to failed was applied at " + ts(20), "op report", "settled it as success at " + ts(10)}},
		},
		{
			name: "a success turned back to running",
			events: []history.Event{
				w(10, "report", 0, "", a10, applied, "success"),
				w(20, "report", 0, "", a10, applied, "running"),
				final(100, a10, "running"),
			},
			want: []history.Rule{history.RuleOverwritten, history.RuleNotTerminal},
		},
		{
			name: "the allowed changes: an override, a confirm, an operator's verdict over a failure",
			events: []history.Event{
				w(10, "mark", 1, "r", a10, applied, "failed"),
				w(20, history.OpConfirm, 1, "r", a10, applied, "failed"),
				w(30, history.OpOverride, 1, "r", a10, applied, "success"),
				w(40, "mark", 1, "r", att("b", 1, 0), applied, "failed"),
				w(50, history.OpVerdict, 0, "", att("b", 1, 0), applied, "success"),
				w(60, "report", 0, "", att("c", 1, 0), applied, "failed"),
				w(70, history.OpVerdict, 0, "", att("c", 1, 0), applied, "failed"),
				final(100, a10, "success"),
				final(100, att("b", 1, 0), "success"),
				final(100, att("c", 1, 0), "failed"),
			},
		},
		{
			name: "an override over a success",
			events: []history.Event{
				w(10, "report", 0, "", a10, applied, "skipped"),
				w(30, history.OpOverride, 1, "r", a10, applied, "success"),
				final(100, a10, "success"),
			},
			want:    []history.Rule{history.RuleOverwritten},
			mention: [][]string{{"op override", "settled it as skipped"}},
		},
		{
			name: "an override or a verdict of a failure to anything but success or failed",
			events: []history.Event{
				w(10, "mark", 1, "r", a10, applied, "failed"),
				w(20, history.OpOverride, 1, "r", a10, applied, "skipped"),
				w(30, "mark", 1, "r", att("b", 1, 0), applied, "failed"),
				w(40, history.OpVerdict, 0, "", att("b", 1, 0), applied, "upstream_failed"),
				final(100, a10, "skipped"),
				final(100, att("b", 1, 0), "upstream_failed"),
			},
			want: []history.Rule{history.RuleOverwritten, history.RuleOverwritten},
			mention: [][]string{
				{"op override under term 1", "to skipped", "settled it as failed"},
				{"op verdict on run-1/b", "to upstream_failed", "settled it as failed"},
			},
		},
		{
			name: "a success moved on by a rail that is not a clear",
			events: []history.Event{
				w(10, "report", 0, "", a10, applied, "success"),
				moved(20, "replace", 1, "r", a10, a11),
				final(100, a11, "none"),
			},
			want:    []history.Rule{history.RuleOverwritten, history.RuleNotTerminal},
			mention: [][]string{{"op replace", "on run-1/a try 1 epoch 0 on to try 1 epoch 1", "settled it as success", "only clear"}},
		},
		{
			name: "a success cleared",
			events: []history.Event{
				w(10, "report", 0, "", a10, applied, "success"),
				moved(20, history.OpClear, 0, "", a10, a20),
				w(30, "report", 0, "", a20, applied, "success"),
				final(100, a20, "success"),
			},
		},
		{
			name: "a write applied to an attempt the task was moved past",
			events: []history.Event{
				w(10, "report", 0, "", a10, applied, "failed"),
				moved(20, "retry", 1, "r", a10, a20),
				w(30, "report", 0, "", a10, applied, "running"),
				w(40, "report", 0, "", a20, applied, "success"),
				final(100, a20, "success"),
			},
			want:    []history.Rule{history.RuleOverwritten},
			mention: [][]string{{"op report on run-1/a try 1 epoch 0", "sent at " + ts(30), "op retry", "try 2 epoch 0 at " + ts(20)}},
		},
		{
			name: "a write on the old attempt sent before the move came back",
			events: []history.Event{
				w(10, "report", 0, "", a10, applied, "failed"),
				moved(20, "retry", 1, "r", a10, a20),
				sentAt(15, w(30, "heartbeat", 0, "", a10, applied, "")),
				w(40, "report", 0, "", a20, applied, "success"),
				final(100, a20, "success"),
			},
		},
		{
			name: "a final row that contradicts the applied success",
			events: []history.Event{
				w(10, "report", 0, "", a10, applied, "success"),
				final(100, a10, "running"),
			},
			want: []history.Rule{history.RuleNotTerminal, history.RuleLost},
			mention: [][]string{
				{"run-1/a try 1 epoch 0 is running, not settled"},
				{"run-1/a try 1 epoch 0 says running", "to success was applied at " + ts(10)},
			},
		},
		{
			name: "a final row that contradicts the applied failure",
			events: []history.Event{
				w(10, "mark", 4, "r", a10, applied, "failed"),
				final(100, a10, "success"),
			},
			want: []history.Rule{history.RuleLost},
		},
		{
			name: "a final row behind an attempt the board reached (rolled back)",
			events: []history.Event{
				w(10, "report", 0, "", a10, applied, "failed"),
				moved(20, "retry", 1, "r", a10, a20),
				w(30, "report", 0, "", a20, applied, "success"),
				final(100, a10, "failed"),
			},
			want:    []history.Rule{history.RuleLost},
			mention: [][]string{{"stands at try 1 epoch 0 (failed)", "behind try 2 epoch 0", "op retry"}},
		},

		// Every attempt ended.
		{
			name: "a final row not settled",
			events: []history.Event{
				w(10, "report", 0, "", a10, applied, "running"),
				final(100, a10, "up_for_retry"),
			},
			want:    []history.Rule{history.RuleNotTerminal},
			mention: [][]string{{"the final row of run-1/a try 1 epoch 0 is up_for_retry, not settled"}},
		},
		{
			name: "a task with no final row",
			events: []history.Event{
				start(0, a10, "pod-1"),
				end(10, "pod-1", "success"),
				w(20, "report", 0, "", att("b", 1, 0), "moved_on", "success"),
				final(100, a10, "success"),
			},
			want:    []history.Rule{history.RuleNoFinal},
			mention: [][]string{{"run-1/b has no final row"}},
		},

		// The history itself.
		{
			name: "malformed events",
			events: []history.Event{
				w(10, "mark", 1, "", a10, applied, "failed"),
				{Time: at(11), Kind: "exec_begin", Exec: "x"},
				{Kind: history.KindWrite, Op: "mark", Outcome: applied},
				end(20, "pod-9", "success"),
				start(30, a10, "pod-1"),
				end(25, "pod-1", "success"),
				start(31, a10, "pod-1"),
				w(35, "report", 0, "", a10, "", "success"),
				{Time: at(36), Kind: history.KindWrite, Op: "retry", Outcome: applied, Next: a20},
				{Time: at(37), Kind: history.KindWrite, Op: "retry", Outcome: applied, Attempt: a20, Next: a10},
				{Time: at(38), Kind: history.KindWrite, Op: "retry", Outcome: applied, Attempt: a10, Next: att("b", 2, 0)},
				sentAt(50, w(40, "mark", 1, "r", a10, applied, "failed")),
				final(100, a10, "failed"),
				final(101, a10, "success"),
				final(102, &history.Attempt{TaskID: "a"}, "success"),
			},
			want: []history.Rule{
				history.RuleMalformed, // no time
				history.RuleMalformed, // a term, no holder
				history.RuleMalformed, // an unknown kind
				history.RuleMalformed, // an end that never started
				history.RuleMalformed, // an end before its start
				history.RuleMalformed, // started again
				history.RuleMalformed, // no outcome
				history.RuleMalformed, // next with no attempt
				history.RuleMalformed, // next not after the attempt
				history.RuleMalformed, // next of another task
				history.RuleMalformed, // sent after its answer
				history.RuleMalformed, // a second final row
				history.RuleUnended,   // pod-1 never ended (at the history's end)
				history.RuleMalformed, // a final row with no run (at the history's end)
			},
			mention: [][]string{
				{"event 3 (write)", "no time"},
				{"event 1", "term 1 with no holder"},
				{"event 2", `unknown kind "exec_begin"`},
				{"event 4", `"pod-9" ended and never started`},
				{"event 6", "ended before it started"},
				{"event 7", "started again"},
				{"event 8", "no outcome"},
				{"event 9", "next attempt with no attempt"},
				{"event 10", "not after"},
				{"event 11", "another task"},
				{"event 12", "after its answer"},
				{"event 14", "second final row"},
				{`"pod-1"`},
				{"event 15", "no run_id"},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := history.Check(tc.events)
			if got := rules(v); !slices.Equal(got, tc.want) {
				t.Fatalf("rules %v, want %v:\n%s", got, tc.want, v)
			}
			for i, words := range tc.mention {
				for _, word := range words {
					if !strings.Contains(v.Violations[i].Text, word) {
						t.Errorf("violation %d does not say %q:\n%s", i, word, v.Violations[i])
					}
				}
			}
			if !strings.HasSuffix(strings.SplitN(v.String(), "\n", 2)[0], "violations: "+strconv.Itoa(len(tc.want))) {
				t.Errorf("report's first line does not count %d violations:\n%s", len(tc.want), v)
			}
			if n := strings.Count(v.String(), "\n"); n != len(tc.want) {
				t.Errorf("report has %d violation lines, want %d:\n%s", n, len(tc.want), v)
			}
			for _, x := range v.Violations {
				if !strings.Contains(v.String(), "\n  "+string(x.Rule)+": ") {
					t.Errorf("report does not name %s on a line of its own:\n%s", x.Rule, v)
				}
			}
		})
	}
}

// Events of one time keep their order in the file: a mark then an
// override at the same instant is the allowed change; the other way round
// it is a success overwritten by a failure.
func TestSameTimeKeepsFileOrder(t *testing.T) {
	a := att("a", 1, 0)
	mark := w(10, "mark", 1, "r", a, applied, "failed")
	override := w(10, history.OpOverride, 1, "r", a, applied, "success")
	if v := history.Check([]history.Event{mark, override, final(100, a, "success")}); !v.OK() {
		t.Errorf("mark then override:\n%s", v)
	}
	v := history.Check([]history.Event{override, mark, final(100, a, "failed")})
	if got := rules(v); !slices.Equal(got, []history.Rule{history.RuleOverwritten}) {
		t.Errorf("override then mark: rules %v, want outcome_overwritten:\n%s", got, v)
	}
}

func TestEmptyHistory(t *testing.T) {
	v := history.Check(nil)
	if !v.OK() || v.Summary() != "history: 0 events, 0 writes applied, 0 refused (0 by the fence), 0 executions, 0 terms; violations: 0" {
		t.Errorf("empty history: %s", v)
	}
}

// The words the checker gives a meaning to are the board's.
func TestWordsAreTheBoards(t *testing.T) {
	for _, p := range [][2]string{
		{history.StateSuccess, sdk.StateSuccess},
		{history.StateFailed, sdk.StateFailed},
		{history.StateSkipped, sdk.StateSkipped},
		{history.StateUpstreamFailed, sdk.StateUpstreamFailed},
		{history.OutcomeDeposed, sdk.NoopDeposed},
	} {
		if p[0] != p[1] {
			t.Errorf("history says %q where the board says %q", p[0], p[1])
		}
	}
	for _, s := range []string{sdk.StateNone, sdk.StateScheduled, sdk.StateQueued, sdk.StateRunning,
		sdk.StateUpForRetry, sdk.StateUpForReschedule, sdk.StateDeferred} {
		if history.Terminal(s) {
			t.Errorf("%s taken as settled", s)
		}
	}
}

func ts(ms int) string { return at(ms).Format(time.RFC3339Nano) }

package history

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Rule names what a violation breaks (see the package documentation).
type Rule string

// The rules, by the promise each belongs to.
const (
	// One writer.
	RuleStaleTerm Rule = "stale_term" // a write applied under a term after a later term's first applied write
	RuleTermTwice Rule = "term_twice" // applied writes of one term from two holders

	// One execution.
	RuleOverlap Rule = "overlapping_executions" // two executions of one task at once

	// No outcome lost or overwritten.
	RuleOverwritten Rule = "outcome_overwritten" // a settled attempt changed, moved on, or written after it was moved past
	RuleLost        Rule = "outcome_lost"        // the final row contradicts what was applied

	// Every attempt ended.
	RuleNotTerminal Rule = "final_not_settled"   // a task's final row is not settled
	RuleNoFinal     Rule = "no_final_row"        // a task the history names has no final row
	RuleUnended     Rule = "execution_not_ended" // an execution started and never ended

	// The history itself.
	RuleMalformed Rule = "malformed" // an event that cannot be read as evidence
)

// Violation is one broken rule, with the evidence.
type Violation struct {
	Rule Rule
	// At is when the evidence places the violation.
	At time.Time
	// Text says what happened, naming terms, holders, attempts and times.
	Text string
	// Evidence holds the events that show it.
	Evidence []Event
}

func (v Violation) String() string { return string(v.Rule) + ": " + v.Text }

// Verdict is what Check found in a history.
type Verdict struct {
	Events         int // events in the history
	WritesApplied  int
	WritesRefused  int // refused for any reason, the fence's included
	RefusedByFence int // refused as deposed
	Executions     int // executions started
	Terms          int // distinct terms among the writes, applied or refused
	Faults         int // fault events
	// ExcusedByLostWindow counts what would have been violations but for
	// writes the board lost in a window a fault event names (lost.go).
	ExcusedByLostWindow int
	Violations          []Violation
}

// OK reports whether the history broke no rule.
func (v Verdict) OK() bool { return len(v.Violations) == 0 }

// Summary is the verdict in one line: its counts and how many violations.
func (v Verdict) Summary() string {
	faults := ""
	if v.Faults > 0 {
		faults = fmt.Sprintf(", %d faults", v.Faults)
	}
	if v.ExcusedByLostWindow > 0 {
		faults += fmt.Sprintf(", %d excused_by_lost_window", v.ExcusedByLostWindow)
	}
	return fmt.Sprintf("history: %d events, %d writes applied, %d refused (%d by the fence), %d executions, %d terms%s; violations: %d",
		v.Events, v.WritesApplied, v.WritesRefused, v.RefusedByFence, v.Executions, v.Terms, faults, len(v.Violations))
}

// String is the summary followed by each violation on a line of its own.
func (v Verdict) String() string {
	var b strings.Builder
	b.WriteString(v.Summary())
	for _, x := range v.Violations {
		b.WriteString("\n  ")
		b.WriteString(x.String())
	}
	return b.String()
}

// Check judges a history: events in any order (they are sorted by time,
// events of one time kept in their given order).
func Check(events []Event) Verdict {
	c := &checker{v: Verdict{Events: len(events)}}
	c.sort(events)
	c.read()
	c.oneWriter()
	c.refusals() // refusals.go
	c.outcomes()
	c.executions()
	c.judgeFinals()
	slices.SortStableFunc(c.v.Violations, func(a, b Violation) int {
		return cmp.Or(a.At.Compare(b.At), cmp.Compare(a.Rule, b.Rule), cmp.Compare(a.Text, b.Text))
	})
	return c.v
}

// indexed is an event with its place in the given history (from 1).
type indexed struct {
	n int
	Event
}

type checker struct {
	v      Verdict
	sorted []indexed
	end    time.Time // the last time in the history

	// The well-formed events, each in time order.
	applied []indexed
	starts  []indexed
	ends    []indexed
	finals  []indexed
	tasks   map[task]bool // every task the well-formed events name

	// What the applied writes made of each attempt and task (outcomes).
	attempts   map[Attempt]*attemptState
	taskStates map[task]*taskState
}

func (c *checker) violate(rule Rule, at time.Time, evidence []indexed, format string, args ...any) {
	ev := make([]Event, len(evidence))
	for i, e := range evidence {
		ev[i] = e.Event
	}
	c.v.Violations = append(c.v.Violations, Violation{Rule: rule, At: at, Text: fmt.Sprintf(format, args...), Evidence: ev})
}

func (c *checker) sort(events []Event) {
	c.sorted = make([]indexed, len(events))
	for i, e := range events {
		c.sorted[i] = indexed{i + 1, e}
		if e.Time.After(c.end) {
			c.end = e.Time
		}
	}
	slices.SortStableFunc(c.sorted, func(a, b indexed) int { return a.Time.Compare(b.Time) })
}

// read validates and counts the events and sorts them out by kind.
func (c *checker) read() {
	c.tasks = map[task]bool{}
	terms := map[int64]bool{}
	for _, e := range c.sorted {
		if why := problem(e.Event); why != "" {
			c.violate(RuleMalformed, e.Time, []indexed{e}, "event %d (%s): %s", e.n, place(e.Event), why)
			continue
		}
		if e.Attempt != nil {
			c.tasks[e.Attempt.task()] = true
		}
		switch e.Kind {
		case KindWrite:
			if e.Term > 0 {
				terms[e.Term] = true
			}
			switch e.Outcome {
			case OutcomeApplied:
				c.v.WritesApplied++
				c.applied = append(c.applied, e)
			case OutcomeDeposed:
				c.v.RefusedByFence++
				c.v.WritesRefused++
			default:
				c.v.WritesRefused++
			}
		case KindExecStart:
			c.v.Executions++
			c.starts = append(c.starts, e)
		case KindExecEnd:
			c.ends = append(c.ends, e)
		case KindFinal:
			c.finals = append(c.finals, e)
		case KindFault:
			c.v.Faults++
		}
	}
	c.v.Terms = len(terms)
}

// problem says why e cannot be read as evidence, or "".
func problem(e Event) string {
	if e.Time.IsZero() {
		return "no time"
	}
	if why := lostProblem(e); why != "" {
		return why
	}
	attempt := func(a *Attempt, what string) string {
		if a == nil {
			return "no " + what
		}
		if a.RunID == "" || a.TaskID == "" {
			return "an " + what + " with no run_id or task_id"
		}
		return ""
	}
	switch e.Kind {
	case KindWrite:
		switch {
		case e.Op == "":
			return "a write with no op"
		case e.Outcome == "":
			return "a write with no outcome"
		case e.Term < 0:
			return fmt.Sprintf("a negative term %d", e.Term)
		case e.Term > 0 && e.Holder == "":
			return fmt.Sprintf("a write under term %d with no holder", e.Term)
		case !e.Since.IsZero() && e.Since.After(e.Time):
			return fmt.Sprintf("a write sent at %s, after its answer", ts(e.Since))
		case e.Next != nil && e.Attempt == nil:
			return "a next attempt with no attempt"
		}
		if why := fenceProblem(e); why != "" {
			return why
		}
		if e.Attempt != nil {
			if why := attempt(e.Attempt, "attempt"); why != "" {
				return why
			}
		}
		if e.Next != nil {
			if why := attempt(e.Next, "next attempt"); why != "" {
				return why
			}
			if e.Next.task() != e.Attempt.task() {
				return fmt.Sprintf("a next attempt of another task (%s after %s)", e.Next, e.Attempt)
			}
			if !e.Attempt.before(*e.Next) {
				return fmt.Sprintf("a next attempt %s not after %s", e.Next, e.Attempt)
			}
		}
	case KindExecStart:
		if why := attempt(e.Attempt, "attempt"); why != "" {
			return why
		}
		if e.Exec == "" {
			return "an execution start with no exec"
		}
	case KindExecEnd:
		if e.Exec == "" {
			return "an execution end with no exec"
		}
		if e.Outcome == "" {
			return "an execution end with no outcome"
		}
		if e.Attempt != nil {
			return attempt(e.Attempt, "attempt")
		}
	case KindFinal:
		if why := attempt(e.Attempt, "attempt"); why != "" {
			return why
		}
		if e.State == "" {
			return "a final row with no state"
		}
	case KindFault:
	case "":
		return "no kind"
	default:
		return fmt.Sprintf("an unknown kind %q", e.Kind)
	}
	return ""
}

// place names an event's kind and time, as far as it has them.
func place(e Event) string {
	kind := string(e.Kind)
	if kind == "" {
		kind = "no kind"
	}
	if e.Time.IsZero() {
		return kind
	}
	return kind + " at " + ts(e.Time)
}

// sent is when a write was sent: its Since if known, else its Time.
func sent(e Event) time.Time {
	if !e.Since.IsZero() {
		return e.Since
	}
	return e.Time
}

// after reports whether e is known to have been sent after w's answer came
// back.
func after(e, w Event) bool { return sent(e).After(w.Time) }

// oneWriter: no write applied under a term once a later term's first
// applied write is known to have come before it, and one holder per term.
func (c *checker) oneWriter() {
	first := map[int64]indexed{} // the first applied write of each term
	type holderFirst struct {
		holder string
		w      indexed
	}
	holders := map[int64][]holderFirst{} // each holder's first applied write, per term
	for _, w := range c.applied {
		if w.Term == 0 {
			continue
		}
		if _, ok := first[w.Term]; !ok {
			first[w.Term] = w
		}
		if !slices.ContainsFunc(holders[w.Term], func(h holderFirst) bool { return h.holder == w.Holder }) {
			holders[w.Term] = append(holders[w.Term], holderFirst{w.Holder, w})
		}
	}
	terms := make([]int64, 0, len(first))
	for t := range first {
		terms = append(terms, t)
	}
	slices.Sort(terms)

	for _, t := range terms {
		hs := holders[t]
		if len(hs) < 2 {
			continue
		}
		parts := make([]string, len(hs))
		ev := make([]indexed, len(hs))
		for i, h := range hs {
			parts[i] = fmt.Sprintf("%q first at %s (%s)", h.holder, ts(h.w.Time), write(h.w.Event))
			ev[i] = h.w
		}
		c.violate(RuleTermTwice, hs[1].w.Time, ev, "term %d was held by %d holders, each applying writes: %s",
			t, len(hs), strings.Join(parts, "; "))
	}

	// later[t]: of the terms above t, the first applied write to come back.
	later := map[int64]indexed{}
	var earliest *indexed
	for i := len(terms) - 1; i >= 0; i-- {
		if earliest != nil {
			later[terms[i]] = *earliest
		}
		if f := first[terms[i]]; earliest == nil || f.Time.Before(earliest.Time) {
			earliest = &f
		}
	}
	type stale struct {
		term   int64
		holder string
	}
	type staleWrites struct {
		first indexed
		by    indexed // the later term's first write
		n     int
	}
	found := map[stale]*staleWrites{}
	var order []stale
	for _, w := range c.applied {
		l, ok := later[w.Term]
		if w.Term == 0 || !ok || !after(w.Event, l.Event) {
			continue
		}
		k := stale{w.Term, w.Holder}
		if s := found[k]; s != nil {
			s.n++
			continue
		}
		found[k] = &staleWrites{first: w, by: l, n: 1}
		order = append(order, k)
	}
	for _, k := range order {
		s := found[k]
		c.violate(RuleStaleTerm, s.first.Time, []indexed{s.by, s.first},
			"term %d (holder %q) had %d write(s) applied that were sent after term %d's first applied write came back at %s (%s); the first sent at %s: %s",
			k.term, k.holder, s.n, s.by.Term, ts(s.by.Time), write(s.by.Event), ts(sent(s.first.Event)), write(s.first.Event))
	}
}

// attemptState is what the applied writes made of one attempt.
type attemptState struct {
	settled bool   // a terminal state was applied to it
	state   string // the last state applied to it
	by      indexed
}

// taskState is what the applied writes made of one task.
type taskState struct {
	reached   *Attempt // the latest attempt an applied write named or moved to
	reachedBy indexed
	movedOn   []indexed // the applied writes that moved it to a new attempt
}

// outcomes: no settled attempt changed or moved on but by the ops allowed
// to, no write applied to an attempt already moved past; leaves
// c.attempts and c.taskStates for judgeFinals.
func (c *checker) outcomes() {
	c.attempts = map[Attempt]*attemptState{}
	c.taskStates = map[task]*taskState{}
	for _, w := range c.applied {
		if w.Attempt == nil {
			continue
		}
		a := *w.Attempt
		tk := c.taskState(a.task())
		if m, ok := movedPast(tk.movedOn, w); ok {
			c.violate(RuleOverwritten, w.Time, []indexed{m, w},
				"%s was applied, sent at %s after %s had moved the task on to %s at %s",
				write(w.Event), ts(sent(w.Event)), write(m.Event), m.Next, ts(m.Time))
			continue
		}
		st := c.attempts[a]
		if w.Next != nil {
			if st != nil && st.settled && Terminal(st.state) && st.state != StateFailed && w.Op != OpClear {
				c.violate(RuleOverwritten, w.Time, []indexed{st.by, w},
					"%s was applied at %s, though %s had settled it as %s at %s (only %s moves on from %s)",
					write(w.Event), ts(w.Time), write(st.by.Event), st.state, ts(st.by.Time), OpClear, st.state)
			}
			tk.movedOn = append(tk.movedOn, w)
			c.reach(tk, *w.Next, w)
			if w.State != "" {
				c.attempts[*w.Next] = &attemptState{settled: Terminal(w.State), state: w.State, by: w}
			}
			continue
		}
		c.reach(tk, a, w)
		if w.State == "" {
			continue
		}
		if st == nil {
			st = &attemptState{}
			c.attempts[a] = st
		}
		if st.settled && w.State != st.state && !mayChange(st.state, w.Event) {
			c.violate(RuleOverwritten, w.Time, []indexed{st.by, w},
				"%s was applied at %s, after %s had settled it as %s at %s",
				write(w.Event), ts(w.Time), write(st.by.Event), st.state, ts(st.by.Time))
		}
		st.state, st.by = w.State, w
		st.settled = st.settled || Terminal(w.State)
	}
}

func (c *checker) taskState(t task) *taskState {
	s := c.taskStates[t]
	if s == nil {
		s = &taskState{}
		c.taskStates[t] = s
	}
	return s
}

func (c *checker) reach(s *taskState, a Attempt, w indexed) {
	if s.reached == nil || s.reached.before(a) {
		s.reached, s.reachedBy = &a, w
	}
}

// movedPast returns the first write of moves that moved w's attempt's task
// past w's attempt before w was sent.
func movedPast(moves []indexed, w indexed) (indexed, bool) {
	for _, m := range moves {
		if w.Attempt.before(*m.Next) && after(w.Event, m.Event) {
			return m, true
		}
	}
	return indexed{}, false
}

// mayChange reports whether w may change an attempt settled as from: an
// override or an operator's verdict over a failure.
func mayChange(from string, w Event) bool {
	if from != StateFailed {
		return false
	}
	switch w.Op {
	case OpOverride:
		return w.State == StateSuccess
	case OpVerdict:
		return w.State == StateSuccess || w.State == StateFailed
	}
	return false
}

// execution is one execution's start and end (end nil: open).
type execution struct {
	start indexed
	end   *indexed
}

// executions: each started execution ended, no two of one task at once.
func (c *checker) executions() {
	byID := map[string]*execution{}
	var all []*execution
	for _, s := range c.starts {
		if x := byID[s.Exec]; x != nil {
			c.violate(RuleMalformed, s.Time, []indexed{x.start, s}, "event %d (exec_start at %s): execution %q started again (first at %s)",
				s.n, ts(s.Time), s.Exec, ts(x.start.Time))
			continue
		}
		x := &execution{start: s}
		byID[s.Exec] = x
		all = append(all, x)
	}
	for _, e := range c.ends {
		x := byID[e.Exec]
		switch {
		case x == nil:
			c.violate(RuleMalformed, e.Time, []indexed{e}, "event %d (exec_end at %s): execution %q ended and never started", e.n, ts(e.Time), e.Exec)
		case x.end != nil:
			c.violate(RuleMalformed, e.Time, []indexed{*x.end, e}, "event %d (exec_end at %s): execution %q ended again (first at %s)",
				e.n, ts(e.Time), e.Exec, ts(x.end.Time))
		case e.Time.Before(x.start.Time):
			c.violate(RuleMalformed, e.Time, []indexed{x.start, e}, "event %d (exec_end at %s): execution %q ended before it started at %s",
				e.n, ts(e.Time), e.Exec, ts(x.start.Time))
		case e.Attempt != nil && e.Attempt.task() != x.start.Attempt.task():
			c.violate(RuleMalformed, e.Time, []indexed{x.start, e}, "event %d (exec_end at %s): execution %q of %s ended as one of %s",
				e.n, ts(e.Time), e.Exec, x.start.Attempt.task(), e.Attempt.task())
		default:
			x.end = &e
		}
	}

	byTask := map[task][]*execution{}
	for _, x := range all {
		if x.end == nil {
			c.violate(RuleUnended, c.end, []indexed{x.start},
				"execution %q of %s started at %s and has no end by the history's last event at %s",
				x.start.Exec, x.start.Attempt, ts(x.start.Time), ts(c.end))
		}
		t := x.start.Attempt.task()
		byTask[t] = append(byTask[t], x)
	}
	for _, xs := range byTask {
		for i, x := range xs {
			for _, y := range xs[i+1:] {
				// xs is in start order: y starts no earlier than x.
				if overlap(x, y) {
					from, to := y.start.Time, "then on (neither ended)"
					if e := earlierEnd(x, y); e != nil {
						to = "to " + ts(*e)
					}
					ev := []indexed{x.start, y.start}
					if x.end != nil {
						ev = append(ev, *x.end)
					}
					if y.end != nil {
						ev = append(ev, *y.end)
					}
					c.violate(RuleOverlap, from, ev, "%s ran twice at once from %s %s: execution %q (%s, %s) and execution %q (%s, %s)",
						x.start.Attempt.task(), ts(from), to,
						x.start.Exec, attemptShort(*x.start.Attempt), span(x), y.start.Exec, attemptShort(*y.start.Attempt), span(y))
				}
			}
		}
	}
}

// overlap reports whether x and y, x starting no later, ran at once.
func overlap(x, y *execution) bool {
	if x.end != nil && !y.start.Time.Before(x.end.Time) {
		return false
	}
	return y.end == nil || x.start.Time.Before(y.end.Time)
}

func earlierEnd(x, y *execution) *time.Time {
	switch {
	case x.end == nil && y.end == nil:
		return nil
	case x.end == nil:
		return &y.end.Time
	case y.end == nil || x.end.Time.Before(y.end.Time):
		return &x.end.Time
	}
	return &y.end.Time
}

func span(x *execution) string {
	if x.end == nil {
		return fmt.Sprintf("from %s, no end", ts(x.start.Time))
	}
	return fmt.Sprintf("from %s to %s, %s", ts(x.start.Time), ts(x.end.Time), x.end.Outcome)
}

// judgeFinals: every task has one final row, settled, that agrees with what was
// applied.
func (c *checker) judgeFinals() {
	final := map[task]indexed{}
	for _, f := range c.finals {
		t := f.Attempt.task()
		if g, ok := final[t]; ok {
			c.violate(RuleMalformed, f.Time, []indexed{g, f}, "event %d (final at %s): a second final row of %s (the first read at %s)",
				f.n, ts(f.Time), t, ts(g.Time))
			continue
		}
		final[t] = f
		a := *f.Attempt
		if !Terminal(f.State) {
			c.violate(RuleNotTerminal, f.Time, []indexed{f}, "the final row of %s is %s, not settled (read at %s)", a, f.State, ts(f.Time))
		}
		if s := c.taskStates[t]; s != nil && a.before(*s.reached) {
			c.violate(RuleLost, f.Time, []indexed{s.reachedBy, f}, "the final row of %s stands at try %d epoch %d (%s), behind %s that %s reached at %s",
				t, a.Try, a.Epoch, f.State, attemptShort(*s.reached), write(s.reachedBy.Event), ts(s.reachedBy.Time))
			continue
		}
		if st := c.attempts[a]; st != nil && st.settled && st.state != f.State {
			c.violate(RuleLost, f.Time, []indexed{st.by, f}, "the final row of %s says %s, but %s was applied at %s",
				a, f.State, write(st.by.Event), ts(st.by.Time))
		}
	}
	tasks := make([]task, 0, len(c.tasks))
	for t := range c.tasks {
		if _, ok := final[t]; !ok {
			tasks = append(tasks, t)
		}
	}
	slices.SortFunc(tasks, func(a, b task) int { return cmp.Or(cmp.Compare(a.runID, b.runID), cmp.Compare(a.taskID, b.taskID)) })
	for _, t := range tasks {
		if c.lostTask(t) {
			c.v.ExcusedByLostWindow++
			continue
		}
		c.violate(RuleNoFinal, c.end, nil, "%s has no final row: whether its attempts ended is unknown", t)
	}
}

// write describes a write for a violation's text.
func write(e Event) string {
	var b strings.Builder
	fmt.Fprintf(&b, "op %s", e.Op)
	if e.Term > 0 {
		fmt.Fprintf(&b, " under term %d by %q", e.Term, e.Holder)
	}
	if e.Attempt != nil {
		fmt.Fprintf(&b, " on %s", e.Attempt)
	}
	if e.Next != nil {
		fmt.Fprintf(&b, " on to %s", attemptShort(*e.Next))
		if e.State != "" {
			fmt.Fprintf(&b, " (%s)", e.State)
		}
	} else if e.State != "" {
		fmt.Fprintf(&b, " to %s", e.State)
	}
	return b.String()
}

func attemptShort(a Attempt) string { return fmt.Sprintf("try %d epoch %d", a.Try, a.Epoch) }

// ts formats a time for a violation's text.
func ts(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

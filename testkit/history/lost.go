package history

import (
	"fmt"
	"slices"
	"time"
)

// Writes the board lost. A fault event with a lost_from says the board lost
// every write it had applied from lost_from to the event's time: its
// primary was killed then, and a standby that had stopped receiving those
// writes was promoted (an asynchronous failover). The history holds the
// promoted board's account, so those writes are simply absent from it; what
// remains of them is what the agents saw happen, which the board never
// recorded. The checker excuses exactly that, and counts it
// (Verdict.ExcusedByLostWindow):
//
//   - RuleNoFinal for a task no write in the history names (the promoted
//     board never had it: its run was submitted in the window) all of whose
//     executions started after a window opened and before the promoted
//     board's first write after the window's end (an execution starts only
//     after the board acknowledged its dispatch, and before the promotion
//     only the lost primary could have).
//
// Nothing else is excused: the rules on writes judge only what the promoted
// board applied, and they hold in full across the window (a term number
// the promoted board hands out again, to another holder, is still one term
// held twice if both holders' writes apply: the fence's holder check is
// what prevents it); two executions of one task at once are never excused.

// lostWindow is a window of writes the board lost: from, to, and the first
// write the board applied after to (zero when none did: the history ends).
type lostWindow struct {
	from, to time.Time
	resumed  time.Time
}

// lostProblem says why a fault event's lost window cannot be read, or "".
func lostProblem(e Event) string {
	if e.Kind != KindFault && !e.LostFrom.IsZero() {
		return fmt.Sprintf("a lost_from on a %s event", e.Kind)
	}
	if !e.LostFrom.IsZero() && e.LostFrom.After(e.Time) {
		return fmt.Sprintf("writes lost from %s, after the fault that lost them", ts(e.LostFrom))
	}
	return ""
}

// lostWindows reads the windows from the well-formed fault events, each
// with the first applied write after its end.
func (c *checker) lostWindows() []lostWindow {
	var out []lostWindow
	for _, e := range c.sorted {
		if e.Kind != KindFault || e.LostFrom.IsZero() || problem(e.Event) != "" {
			continue
		}
		lw := lostWindow{from: e.LostFrom, to: e.Time}
		if i := slices.IndexFunc(c.applied, func(w indexed) bool { return w.Time.After(e.Time) }); i >= 0 {
			lw.resumed = c.applied[i].Time
		}
		out = append(out, lw)
	}
	return out
}

// startedIn reports whether an execution that started at t may have been
// dispatched by a write the window lost: after the window opened,
// before the board applied anything after the window.
func (lw lostWindow) startedIn(t time.Time) bool {
	return t.After(lw.from) && (lw.resumed.IsZero() || t.Before(lw.resumed))
}

// lostTask reports whether task t is known to the history only from
// executions that a lost window explains: no write names it, and every
// execution of it started in a lost window.
func (c *checker) lostTask(t task) bool {
	windows := c.lostWindows()
	if len(windows) == 0 {
		return false
	}
	for _, e := range c.sorted {
		if e.Kind == KindWrite && e.Attempt != nil && e.Attempt.task() == t {
			return false
		}
	}
	n := 0
	for _, s := range c.starts {
		if s.Attempt.task() != t {
			continue
		}
		n++
		if !slices.ContainsFunc(windows, func(lw lostWindow) bool { return lw.startedIn(s.Time) }) {
			return false
		}
	}
	return n > 0
}

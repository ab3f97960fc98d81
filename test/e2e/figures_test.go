package e2e_test

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dexaflow/reaper/testkit/history"
)

// figures are one scenario's line of the table.
type figures struct {
	num   int
	title string

	mu                                             sync.Mutex
	faults, recovered, falseReaps, doubles, wedged int
	wall                                           time.Duration
	measured, failed                               bool
	// notes are a scenario's own figures (times to recover, writes the
	// fence refused), printed under the table.
	notes []string
	// The verdict on the scenario's fault history, once judged.
	hist       history.Verdict
	histJudged bool
}

// note adds one of the scenario's own figures.
func (f *figures) note(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.notes = append(f.notes, fmt.Sprintf(format, args...))
}

// setHistory records the verdict on the scenario's history.
func (f *figures) setHistory(v history.Verdict) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hist, f.histJudged = v, true
}

// historyCells are the history's columns: writes applied, executions,
// terms, violations ("-" each when not judged).
func (f *figures) historyCells() []any {
	if !f.histJudged {
		return []any{"-", "-", "-", "-"}
	}
	return []any{fmt.Sprint(f.hist.WritesApplied), fmt.Sprint(f.hist.Executions), fmt.Sprint(f.hist.Terms),
		fmt.Sprint(len(f.hist.Violations))}
}

func (f *figures) set(faults, recovered, falseReaps, doubles, wedged int, wall time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults, f.recovered, f.falseReaps, f.doubles, f.wedged, f.wall = faults, recovered, falseReaps, doubles, wedged, wall
	f.measured = true
}

// figureBook collects the scenarios' lines; the suite prints them once all
// scenarios are done.
type figureBook struct {
	mu   sync.Mutex
	rows []*figures
}

// book is the suite's table: scenarios run in parallel subtests and the
// testing package offers no other way to hand their figures to the test
// that prints them.
var book = &figureBook{}

func (b *figureBook) add(num int, title string) *figures {
	b.mu.Lock()
	defer b.mu.Unlock()
	f := &figures{num: num, title: title}
	b.rows = append(b.rows, f)
	return f
}

// track marks the scenario's line failed when its test fails.
func (f *figures) track(t *testing.T) {
	t.Cleanup(func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.failed = t.Failed()
	})
}

// table renders the figures, one line per scenario and a total.
func (b *figureBook) table(suite time.Duration) string {
	b.mu.Lock()
	rows := append([]*figures(nil), b.rows...)
	b.mu.Unlock()
	sort.Slice(rows, func(i, j int) bool { return rows[i].num < rows[j].num })

	var sb strings.Builder
	fmt.Fprintf(&sb, "\nfault suite figures (ladder: heartbeat %s, agent_lost %s, settling_grace %s, interval %s, lease %s;\n",
		heartbeat, agentLost, grace, interval, lease)
	sb.WriteString("SLA: threshold + one interval, from the fault to the reaping decision; history: the writes applied,\n")
	sb.WriteString("executions, terms and violations of the scenario's fault history, as its checker judged it)\n\n")
	const format = "%-44s %6s %16s %11s %12s %7s %7s %6s %6s %10s %7s  %s\n"
	fmt.Fprintf(&sb, format, "scenario", "faults", "recovered in SLA", "false reaps", "double execs", "wedged",
		"writes", "execs", "terms", "violations", "wall", "result")
	var tf, tr, tfr, td, tw int
	var hw, hx, ht, hv, judged int
	for _, r := range rows {
		r.mu.Lock()
		result := "pass"
		if r.failed {
			result = "FAIL"
		}
		name := fmt.Sprintf("%d. %s", r.num, r.title)
		if !r.measured {
			fmt.Fprintf(&sb, format, name, "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", result+" (not measured)")
			r.mu.Unlock()
			continue
		}
		cells := append([]any{name, fmt.Sprint(r.faults), fmt.Sprintf("%d/%d", r.recovered, r.faults),
			fmt.Sprint(r.falseReaps), fmt.Sprint(r.doubles), fmt.Sprint(r.wedged)}, r.historyCells()...)
		fmt.Fprintf(&sb, format, append(cells, r.wall.Round(100*time.Millisecond), result)...)
		tf, tr, tfr, td, tw = tf+r.faults, tr+r.recovered, tfr+r.falseReaps, td+r.doubles, tw+r.wedged
		if r.histJudged {
			judged++
			hw, hx, ht, hv = hw+r.hist.WritesApplied, hx+r.hist.Executions, ht+r.hist.Terms, hv+len(r.hist.Violations)
		}
		r.mu.Unlock()
	}
	fmt.Fprintf(&sb, format, "total", fmt.Sprint(tf), fmt.Sprintf("%d/%d", tr, tf), fmt.Sprint(tfr), fmt.Sprint(td),
		fmt.Sprint(tw), fmt.Sprint(hw), fmt.Sprint(hx), fmt.Sprint(ht), fmt.Sprint(hv), suite.Round(100*time.Millisecond),
		fmt.Sprintf("%d/%d histories judged", judged, len(rows)))
	first := true
	for _, r := range rows {
		r.mu.Lock()
		for _, n := range r.notes {
			if first {
				sb.WriteString("\nscenario figures:\n")
				first = false
			}
			fmt.Fprintf(&sb, "  %d. %s\n", r.num, n)
		}
		r.mu.Unlock()
	}
	return sb.String()
}

package kubee2e_test

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

	mu                         sync.Mutex
	faults                     []*fault
	falseReaps, doubles, wedge int
	wall                       time.Duration
	measured, failed           bool
	// notes are the scenario's own figures, printed under the table.
	notes []string
	// The verdict on the scenario's fault history, once judged.
	hist       history.Verdict
	histJudged bool
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

func (f *figures) set(faults []*fault, falseReaps, doubles, wedged int, wall time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults, f.falseReaps, f.doubles, f.wedge, f.wall, f.measured = faults, falseReaps, doubles, wedged, wall, true
}

// note adds a line of the scenario's own figures.
func (f *figures) note(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.notes = append(f.notes, fmt.Sprintf(format, args...))
}

// track marks the line failed when its test fails.
func (f *figures) track(t *testing.T) {
	t.Cleanup(func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.failed = t.Failed()
	})
}

// figureBook collects the scenarios' lines for the table printed at the
// end.
type figureBook struct {
	mu   sync.Mutex
	rows []*figures
}

// book is the suite's table: the scenarios run as parallel subtests, and
// the testing package has no other way to hand their figures to the test
// that prints them.
var book = &figureBook{}

func (b *figureBook) add(num int, title string) *figures {
	b.mu.Lock()
	defer b.mu.Unlock()
	f := &figures{num: num, title: title}
	b.rows = append(b.rows, f)
	return f
}

// table renders one line per fault (a scenario's first line carries its
// false reaps, double executions and wedged count) and a total.
func (b *figureBook) table(suite time.Duration) string {
	b.mu.Lock()
	rows := append([]*figures(nil), b.rows...)
	b.mu.Unlock()
	sort.Slice(rows, func(i, j int) bool { return rows[i].num < rows[j].num })
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nkube fault suite figures (ladder: heartbeat %s, agent_lost %s, pod_lost_floor %s, settling_grace %s,\n",
		heartbeat, agentLost, podLostFloor, grace)
	fmt.Fprintf(&sb, "dispatch_lost %s, infra_confirm_valve %s, orphan_run %s, interval %s, lease %s; SLA: threshold (or the\n",
		dispatchLost, valve, orphanRun, interval, lease)
	sb.WriteString("settling gate, when later) + one interval, from the fault to the reaping decision; settled: from the\n")
	sb.WriteString("fault to the run's final state, the tasks released by the test; history: the writes applied,\n")
	sb.WriteString("executions, terms and violations of the scenario's fault history, as its checker judged it)\n\n")
	const format = "%-46s %9s %9s %9s %9s %6s %6s %6s %6s %5s %5s %5s  %s\n"
	fmt.Fprintf(&sb, format, "scenario", "threshold", "SLA", "reaped", "settled", "false", "double", "wedged",
		"writes", "execs", "terms", "viol.", "result")
	var total, inSLA, tfr, td, tw int
	var hw, hx, ht, hv, judged int
	for _, r := range rows {
		r.mu.Lock()
		result := "pass"
		if r.failed {
			result = "FAIL"
		}
		name := fmt.Sprintf("%d. %s", r.num, r.title)
		if !r.measured {
			fmt.Fprintf(&sb, format, name, "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", result+" (not measured)")
			r.mu.Unlock()
			continue
		}
		tfr, td, tw = tfr+r.falseReaps, td+r.doubles, tw+r.wedge
		if r.histJudged {
			judged++
			hw, hx, ht, hv = hw+r.hist.WritesApplied, hx+r.hist.Executions, ht+r.hist.Terms, hv+len(r.hist.Violations)
		}
		hist := r.historyCells()
		for i, f := range r.faults {
			total++
			if f.ok {
				inSLA++
			}
			label, fr, db, wd := name, fmt.Sprint(r.falseReaps), fmt.Sprint(r.doubles), fmt.Sprint(r.wedge)
			hc := hist
			if i > 0 {
				label, fr, db, wd = "   "+f.what, "", "", ""
				hc = []any{"", "", "", ""}
			} else if len(r.faults) > 1 {
				label = name + ": " + f.what
			}
			threshold, sla, reaped := dur(f.threshold), dur(f.deadline.Sub(f.at)), dur(f.reapAt.Sub(f.at))
			if !f.reapAt.IsZero() && !f.reapAt.After(f.at) {
				reaped = "0s" // reaped before the test saw the fault complete (a pod's going)
			}
			if f.none {
				threshold, sla, reaped = "-", "no reap", "none"
			} else if f.reapAt.IsZero() {
				sla, reaped = "-", "never"
			}
			verdict := result
			if !f.ok {
				verdict += " (late)"
			}
			cells := append([]any{clip(label, 46), threshold, sla, reaped, dur(f.settled), fr, db, wd}, hc...)
			fmt.Fprintf(&sb, format, append(cells, verdict)...)
		}
		if len(r.faults) == 0 {
			cells := append([]any{name, "-", "-", "-", "-", fmt.Sprint(r.falseReaps), fmt.Sprint(r.doubles),
				fmt.Sprint(r.wedge)}, hist...)
			fmt.Fprintf(&sb, format, append(cells, result)...)
		}
		r.mu.Unlock()
	}
	fmt.Fprintf(&sb, format, fmt.Sprintf("total: %d/%d faults in SLA", inSLA, total), "", "", "", dur(suite),
		fmt.Sprint(tfr), fmt.Sprint(td), fmt.Sprint(tw), fmt.Sprint(hw), fmt.Sprint(hx), fmt.Sprint(ht), fmt.Sprint(hv),
		fmt.Sprintf("%d/%d histories judged", judged, len(rows)))
	for _, r := range rows {
		r.mu.Lock()
		for _, n := range r.notes {
			fmt.Fprintf(&sb, "%d. %s\n", r.num, n)
		}
		r.mu.Unlock()
	}
	return sb.String()
}

func dur(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return d.Round(100 * time.Millisecond).String()
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n-1] + "~"
	}
	return s
}

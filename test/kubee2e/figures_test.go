package kubee2e_test

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
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
}

func (f *figures) set(faults []*fault, falseReaps, doubles, wedged int, wall time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults, f.falseReaps, f.doubles, f.wedge, f.wall, f.measured = faults, falseReaps, doubles, wedged, wall, true
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
	sb.WriteString("fault to the run's final state, the tasks released by the test)\n\n")
	const format = "%-46s %9s %9s %9s %9s %6s %6s %6s  %s\n"
	fmt.Fprintf(&sb, format, "scenario", "threshold", "SLA", "reaped", "settled", "false", "double", "wedged", "result")
	var total, inSLA, tfr, td, tw int
	for _, r := range rows {
		r.mu.Lock()
		result := "pass"
		if r.failed {
			result = "FAIL"
		}
		name := fmt.Sprintf("%d. %s", r.num, r.title)
		if !r.measured {
			fmt.Fprintf(&sb, format, name, "-", "-", "-", "-", "-", "-", "-", result+" (not measured)")
			r.mu.Unlock()
			continue
		}
		tfr, td, tw = tfr+r.falseReaps, td+r.doubles, tw+r.wedge
		for i, f := range r.faults {
			total++
			if f.ok {
				inSLA++
			}
			label, fr, db, wd := name, fmt.Sprint(r.falseReaps), fmt.Sprint(r.doubles), fmt.Sprint(r.wedge)
			if i > 0 {
				label, fr, db, wd = "   "+f.what, "", "", ""
			} else if len(r.faults) > 1 {
				label = name + ": " + f.what
			}
			threshold, sla, reaped := dur(f.threshold), dur(f.deadline.Sub(f.at)), dur(f.reapAt.Sub(f.at))
			if f.none {
				threshold, sla, reaped = "-", "no reap", "none"
			} else if f.reapAt.IsZero() {
				sla, reaped = "-", "never"
			}
			verdict := result
			if !f.ok {
				verdict += " (late)"
			}
			fmt.Fprintf(&sb, format, clip(label, 46), threshold, sla, reaped, dur(f.settled), fr, db, wd, verdict)
		}
		if len(r.faults) == 0 {
			fmt.Fprintf(&sb, format, name, "-", "-", "-", "-", fmt.Sprint(r.falseReaps), fmt.Sprint(r.doubles),
				fmt.Sprint(r.wedge), result)
		}
		r.mu.Unlock()
	}
	fmt.Fprintf(&sb, format, fmt.Sprintf("total: %d/%d faults in SLA", inSLA, total), "", "", "", dur(suite),
		fmt.Sprint(tfr), fmt.Sprint(td), fmt.Sprint(tw), "")
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

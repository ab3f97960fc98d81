package soak

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

func syscallKill(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }

// spread is the median, 99th percentile and maximum of ds.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	q := func(p float64) time.Duration {
		i := int(p*float64(len(ds))+0.5) - 1
		return ds[min(max(i, 0), len(ds)-1)]
	}
	r := func(d time.Duration) string { return d.Round(100 * time.Millisecond).String() }
	return fmt.Sprintf("p50 %s  p99 %s  max %s  (n=%d)", r(q(0.5)), r(q(0.99)), r(ds[len(ds)-1]), len(ds))
}

// Recovery measures, per fault that harmed an attempt, the time from the
// fault to the attempt's settling (the first change of its row out of
// queued and running) and to its run's final state; per fault of a
// leader, the time to the next term.
type Recovery struct {
	Settled, RunFinal, Takeover []time.Duration
	// Unrecovered lists the harmed attempts never seen settling.
	Unrecovered []string
	// Missed counts faults that landed on an attempt already settled (its
	// agent had reported an instant before it was killed).
	Missed int
}

// MeasureRecovery reads the recovery times out of a history.
func MeasureRecovery(h History) Recovery {
	var r Recovery
	for _, f := range h.Faults {
		switch f.Kind {
		case FaultAgentKill, FaultAgentGroupKill, FaultPodDelete, FaultEviction, FaultNodeLoss:
			for _, a := range f.Harmed() {
				r.measure(h, f, a)
			}
		case FaultLeaderKill, FaultLeaderPause:
			for _, t := range h.Terms {
				if t.At.After(f.At) {
					r.Takeover = append(r.Takeover, t.At.Sub(f.At))
					break
				}
			}
		}
	}
	return r
}

// measure adds the recovery of attempt a from fault f.
func (r *Recovery) measure(h History, f Fault, a sdk.Attempt) {
	settled := time.Time{}
	for _, t := range h.Transitions {
		if t.From == a && (t.OldState == sdk.StateRunning || t.OldState == sdk.StateQueued) &&
			t.NewState != sdk.StateRunning && t.NewState != sdk.StateQueued {
			settled = t.At
			break
		}
	}
	if !settled.IsZero() && !settled.After(f.At) {
		r.Missed++
		return
	}
	if settled.IsZero() {
		r.Unrecovered = append(r.Unrecovered, fmt.Sprintf("%s (%s at %s)", a, f.Kind, stamp(f.At)))
		return
	}
	r.Settled = append(r.Settled, settled.Sub(f.At))
	for _, rc := range h.RunChanges {
		if rc.RunID == a.RunID && rc.At.After(f.At) && (rc.NewState == sdk.RunSuccess || rc.NewState == sdk.RunFailed) {
			r.RunFinal = append(r.RunFinal, rc.At.Sub(f.At))
			break
		}
	}
}

// report prints the soak's figures.
func (s *soak) report(ctx context.Context, quiet time.Time) {
	h, err := s.history(context.WithoutCancel(ctx))
	if err != nil {
		s.logf("report: could not read the history: %v", err)
		s.fail(Violation{Check: HistoryChecked, Evidence: "the accounts could not be read for the history: " + err.Error()})
		return
	}
	verdict, herr := s.judgeHistory(context.WithoutCancel(ctx), h)
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(w, "  %s\t%v\n", k, v) }
	fmt.Fprintf(w, "SOAK REPORT  seed %d  duration %s  faults stopped at %.0fs\n", s.seed, s.dur, quiet.Sub(s.tl.wall).Seconds())

	fmt.Fprintln(w, "faults injected")
	byKind := map[string]int{}
	for _, f := range h.Faults {
		byKind[f.Kind]++
	}
	s.inj.mu.Lock()
	skipped := map[string]int{}
	for k, v := range s.inj.skipped {
		skipped[k] = v
	}
	s.inj.mu.Unlock()
	total := 0
	for _, fw := range s.inj.weights {
		total += byKind[fw.kind]
		row(fw.kind, fmt.Sprintf("%d\t(%d drawn without a target)", byKind[fw.kind], skipped[fw.kind]))
	}
	if n := byKind[FaultFailoverAsync]; n > 0 { // drawn as the failover, its pick odd
		total += n
		row(FaultFailoverAsync, fmt.Sprintf("%d\t(drawn as %s)", n, FaultFailover))
	}
	row("total", total)

	fmt.Fprintln(w, "work")
	runs := s.wl.submitted()
	row("runs submitted", len(runs))
	finals := map[string]int{}
	for _, rc := range h.RunChanges {
		if rc.NewState == sdk.RunSuccess || rc.NewState == sdk.RunFailed {
			finals[rc.NewState]++
		}
	}
	row("runs final", fmt.Sprintf("%d success, %d failed", finals[sdk.RunSuccess], finals[sdk.RunFailed]))
	s.wl.mu.Lock()
	var kinds []string
	for k, n := range s.wl.kinds {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
	}
	s.wl.mu.Unlock()
	sort.Strings(kinds)
	row("tasks by kind", strings.Join(kinds, ", "))
	dispatched := 0
	for _, t := range h.Transitions {
		if t.NewState == sdk.StateQueued {
			dispatched++
		}
	}
	row("attempts dispatched", dispatched)
	agents, execs, polls := s.obs.counts()
	row("agents journaled", agents)
	row("task executions journaled", execs)
	row("leadership terms", len(h.Terms))
	row("process table looks", polls)
	var exits []string
	for _, d := range s.daemons {
		for _, e := range d.unasked() {
			exits = append(exits, fmt.Sprintf("#%d %s", d.slot, e))
		}
	}
	row("replica exits the soak did not cause", fmt.Sprintf("%d %s", len(exits), strings.Join(exits, "; ")))
	if s.kube != nil && s.kube.real != nil {
		s.kube.realReport(row)
	}

	fmt.Fprintln(w, "decisions by label (applied / recorded)")
	type count struct{ applied, all int }
	labels := map[string]*count{}
	for _, d := range h.Decisions {
		c := labels[d.Label]
		if c == nil {
			c = &count{}
			labels[d.Label] = c
		}
		c.all++
		if d.Applied {
			c.applied++
		}
	}
	names := make([]string, 0, len(labels))
	for k := range labels {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		row(k, fmt.Sprintf("%d / %d", labels[k].applied, labels[k].all))
	}

	fmt.Fprintln(w, "invariant checks passed")
	s.mu.Lock()
	for _, k := range Invariants {
		row(k, s.passed[k])
	}
	nv := len(s.violations)
	s.mu.Unlock()
	row("violations", nv)

	rec := MeasureRecovery(h)
	fmt.Fprintln(w, "recovery times")
	row("fault -> harmed attempt settled", spread(rec.Settled))
	row("fault -> its run final", spread(rec.RunFinal))
	row("leader fault -> next term", spread(rec.Takeover))
	row("faults that found their attempt already settled", rec.Missed)
	if len(rec.Unrecovered) > 0 {
		row("harmed attempts never settled", strings.Join(rec.Unrecovered, "; "))
	}
	fmt.Fprintln(w, "nemeses (in each fault's window, from it to its end plus lease and grace: what windows share counts for each)")
	s.nemesisRows(h, verdict, row)
	fmt.Fprintln(w, "fault history")
	row("writes refused by the fence (replicas' "+fenceMetric+", a lower bound)", s.fenceTotal())
	if herr != nil {
		row("history", herr)
	} else {
		row("history file", s.historyPath)
	}
	w.Flush()
	fmt.Print(b.String())
	if herr == nil {
		// The checker's verdict ends the report: its counts, then each
		// violation on a line of its own.
		fmt.Println(verdict.String())
	}
}

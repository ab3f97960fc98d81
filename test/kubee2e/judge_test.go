package kubee2e_test

import (
	"context"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/testkit/marked"
)

// fault is one injected fault and the attempt (or run) whose reaping
// decision shows the system recovered from it.
type fault struct {
	what string
	at   time.Time
	// target is the attempt harmed; zero with run set: the run is.
	target sdk.Attempt
	run    bool
	// threshold is how long after the fault a reaper may act; the
	// reaping leader's settling gate may hold it later still (judged).
	threshold time.Duration
	// none: the fault must be ridden out with no reap at all (an outage
	// that harms nothing); its figure is the time to settle.
	none bool
	// label, when set, is the decision that answers the fault, whoever
	// makes it (the runner's dispatch_failed, the sweep's settlement).
	label string

	reapAt    time.Time
	unaudited time.Time // when the test first saw the mark on the board before its decision was in the audit
	deadline  time.Time
	settled   time.Duration
	ok        bool
}

// harm records a fault that harmed attempt a, to be reaped within
// threshold (plus the gate) plus one interval.
func (s *scenario) harm(what string, a sdk.Attempt, threshold time.Duration) *fault {
	f := &fault{what: what, at: time.Now(), target: a, threshold: threshold}
	s.faults = append(s.faults, f)
	s.harmed[a] = true
	s.t.Logf("%s: %s (%s)", f.at.Format("15:04:05.000"), what, a)
	return f
}

// decision is one audit row.
type decision = board.AuditRecord

// decisions reads the audit of the scenario's run, oldest first.
func (s *scenario) decisions() ([]decision, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return s.store.DecisionsFor(ctx, runID, "", 0)
}

// reapers are the plugins whose applied decisions are reaps.
var reapers = map[string]bool{"dispatchlost": true, "podlost": true, "agentlost": true, "warmworker": true, "orphanrun": true}

// settles reports whether d settles a harmed attempt: a reaper's mark, or
// the sweep's settlement of its finished pod.
func settles(d decision) bool {
	return reapers[d.Reaper] || d.Label == sdk.LabelReconcileSettled
}

// reapOf is the first applied reap of f's target.
func reapOf(ds []decision, f *fault) *decision {
	for i, d := range ds {
		if !d.Applied || (f.label == "" && !settles(d)) || (f.label != "" && d.Label != f.label) {
			continue
		}
		if (f.run && d.Attempt.TaskID == "" && d.Attempt.RunID == runID) || (!f.run && d.Attempt == f.target) {
			return &ds[i]
		}
	}
	return nil
}

// waitReaped waits for the reap of f's target.
func (s *scenario) waitReaped(f *fault, bound time.Duration) {
	s.t.Helper()
	var got *decision
	s.eventually(bound, "the reap after "+f.what, func() bool {
		ds, err := s.decisions()
		if err == nil {
			got = reapOf(ds, f)
		}
		// A mark is on the board before its decision is in the audit (the
		// audit is written beside the pass, at the latest when it ends):
		// seen, it is waited for, never taken for the decision.
		if got == nil && f.unaudited.IsZero() && s.markedUnaudited(f) {
			f.unaudited = time.Now()
		}
		return got != nil
	})
	if !f.unaudited.IsZero() {
		s.t.Logf("%s: %s seen marked on the board; its decision seen in the audit %s later",
			f.unaudited.Format("15:04:05.000"), f.target, time.Since(f.unaudited).Round(time.Millisecond))
	}
	s.t.Logf("%s: reaped by %s as %s (term %d)", got.At.Format("15:04:05.000"), got.Reaper, got.Label, got.Term)
}

// markedUnaudited reports whether the board shows f's target reaped on the
// infra rail (failed as infra, or re-placed past it) whatever the audit
// holds.
func (s *scenario) markedUnaudited(f *fault) bool {
	if f.run || f.label != "" {
		return false
	}
	ti, err := s.taskRow(f.target.TaskID)
	if err != nil {
		return false
	}
	marked := ti.Attempt == f.target && ti.State == sdk.StateFailed && ti.LastFailureKind == sdk.FailureInfra
	return marked || (ti.Epoch > f.target.Epoch && ti.InfraUsed > 0)
}

// finish releases the tasks, waits for the run to end, and checks what
// every scenario promises: each task's exact end, no false reap, no double
// execution, nothing wedged (no row, pod or process left live); then each
// fault's SLA. It fills in the scenario's figures.
func (s *scenario) finish() {
	s.t.Helper()
	if err := os.WriteFile(s.release, nil, 0o600); err != nil {
		s.t.Fatal(err)
	}
	wedged := map[string]bool{}
	var runState string
	deadline := time.Now().Add(90 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
		r, err := s.store.Run(ctx, runID)
		cancel()
		if err == nil && (r.State == sdk.RunSuccess || r.State == sdk.RunFailed) {
			runState = r.State
			break
		}
		if time.Now().After(deadline) {
			s.t.Errorf("run %s not final 90s after the release (state %q, %v)", runID, r.State, err)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	settled := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	tis, err := s.store.TaskInstances(ctx, runID)
	cancel()
	if err != nil {
		s.t.Fatal(err)
	}
	wantRun := sdk.RunSuccess
	doubles := 0
	for _, ts := range s.tasks {
		var ti *sdkRow
		for i := range tis {
			if tis[i].TaskID == ts.id {
				ti = &sdkRow{state: tis[i].State, try: tis[i].Try, epoch: tis[i].Epoch, infra: tis[i].InfraUsed,
					reason: tis[i].FailureReason + " " + tis[i].ErrorMessage}
			}
		}
		if ti == nil {
			s.t.Errorf("task %s has no row", ts.id)
			continue
		}
		want, try := ts.want, ts.try
		if want == "" {
			want = sdk.StateSuccess
		}
		if want != sdk.StateSuccess {
			wantRun = sdk.RunFailed
		}
		if try == 0 {
			try = 1
		}
		if ti.state != want || ti.try != try {
			s.t.Errorf("task %s ended %s at try %d (%s), want %s at try %d", ts.id, ti.state, ti.try, ti.reason, want, try)
		}
		switch ti.state {
		case sdk.StateSuccess, sdk.StateFailed, sdk.StateUpstreamFailed, sdk.StateSkipped:
		default:
			wedged[ts.id] = true
		}
		if ts.replaced {
			for a := range s.harmed {
				if a.TaskID == ts.id && ti.epoch <= a.Epoch {
					s.t.Errorf("task %s was harmed at %s but not re-placed (epoch %d)", ts.id, a, ti.epoch)
				}
			}
			if ti.try != try {
				s.t.Errorf("task %s: a retry was spent on an infra fault", ts.id)
			}
		}
		l := s.execLog(ts.id)
		doubles += l.doubles
		if l.doubles > 0 {
			s.t.Errorf("task %s: %d executions ran while another did", ts.id, l.doubles)
		}
		if ts.lost && l.starts > 2 {
			s.t.Errorf("task %s ran %d times; its first execution lost with a window, want two at most", ts.id, l.starts)
		}
		if !ts.replaced && ts.try <= 1 && ts.want == "" && !ts.lost {
			if ti.infra != 0 || l.starts != 1 || l.ends != 1 {
				s.t.Errorf("task %s was not harmed but ran %d times (%d ends), infra used %d",
					ts.id, l.starts, l.ends, ti.infra)
			}
		}
	}
	if runState != "" && runState != wantRun {
		s.t.Errorf("run %s ended %s, want %s", runID, runState, wantRun)
	}

	// Nothing live is left: every pod of the run finished or went, and
	// once the replicas stop, no agent or task process is left.
	s.eventually(30*time.Second, "the run's pods to finish", func() bool {
		return len(s.livePods()) == 0
	})
	for _, d := range s.daemons {
		if !d.exited() && !d.stop(20*time.Second) {
			s.t.Errorf("%s did not stop within 20s of SIGTERM", d.name)
		}
	}
	// The warm pool's workers live on by design: their player stops them
	// (as the pool's pods would go with the deployment).
	if s.workers != nil {
		s.workers.Stop()
	}
	until := time.Now().Add(10 * time.Second)
	for len(marked.Processes(markEnv, s.mark)) > 0 && time.Now().Before(until) {
		time.Sleep(100 * time.Millisecond)
	}
	for _, p := range marked.Processes(markEnv, s.mark) {
		wedged["pid "+p.Cmdline] = true
		s.t.Errorf("left running: pid %d %s", p.PID, p.Cmdline)
	}
	if v, ok := s.judgeHistory(); ok {
		s.row.setHistory(v)
	}

	ds, err := s.decisions()
	if err != nil {
		s.t.Fatal(err)
	}
	falseReaps := s.falseReaps(ds)
	s.everyMarkAudited()
	marks := map[sdk.Attempt]int{}
	for _, d := range ds {
		if d.Applied && reapers[d.Reaper] && d.Attempt.TaskID != "" && d.Label != sdk.LabelTeardownRetried {
			marks[d.Attempt]++
			if marks[d.Attempt] == 2 {
				s.t.Errorf("%s was reaped twice (again by %s as %s in term %d)", d.Attempt, d.Reaper, d.Label, d.Term)
			}
		}
	}
	s.evaluate(ds, settled)
	s.row.set(s.faults, falseReaps, doubles, len(wedged), time.Since(s.started))
}

// everyMarkAudited checks, once every replica stopped, the rule that each
// write a reaper applied that the board still shows has its decision in
// the audit.
func (s *scenario) everyMarkAudited() {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	lost, err := s.store.UnauditedMarks(ctx, time.Time{})
	if err != nil {
		s.t.Errorf("check the audit of the marks: %v", err)
	}
	for _, m := range lost {
		s.t.Errorf("%s was marked %s on the board at %s, and no decision about it is in the audit",
			m.Attempt, m.Reason, m.At.Format("15:04:05.000"))
	}
}

type sdkRow struct {
	state      string
	try, epoch int32
	infra      int32
	reason     string
}

// livePods lists the namespace's task pods still pending or running.
func (s *scenario) livePods() []string {
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	list, err := s.cs.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return []string{"list: " + err.Error()}
	}
	var out []string
	for _, p := range list.Items {
		if _, worker := p.Labels[kube.LabelWarmPool]; worker {
			continue // the warm pool's workers are long-lived
		}
		if p.Status.Phase == corev1.PodPending || p.Status.Phase == corev1.PodRunning {
			out = append(out, p.Name)
		}
	}
	return out
}

// falseReaps counts the attempts and runs a reaper applied a decision to
// that the scenario did not harm.
func (s *scenario) falseReaps(ds []decision) int {
	wrong := map[string]bool{}
	for _, d := range ds {
		if !d.Applied || !reapers[d.Reaper] {
			continue
		}
		switch {
		case d.Attempt.TaskID == "":
			if !s.runHarm {
				wrong["run"] = true
				s.t.Errorf("false reap: %s applied %s to run %s: %s", d.Reaper, d.Label, d.Attempt.RunID, d.Detail)
			}
		case !s.harmed[d.Attempt]:
			wrong[d.Attempt.String()] = true
			s.t.Errorf("false reap: %s applied %s to %s, which was not harmed: %s", d.Reaper, d.Label, d.Attempt, d.Detail)
		}
	}
	return len(wrong)
}

// evaluate judges each fault: the reap of its target by its deadline, the
// threshold plus one interval from the fault, or from the reaping term's
// settling gate when that opened later; a fault to ride out, no reap at
// all and the run settled.
func (s *scenario) evaluate(ds []decision, settled time.Time) {
	s.t.Helper()
	s.leaderNow()
	for _, f := range s.faults {
		if f.none {
			f.ok = true
			f.settled = settled.Sub(f.at)
			continue
		}
		r := reapOf(ds, f)
		if r == nil {
			s.t.Errorf("fault %q: never reaped", f.what)
			continue
		}
		base := f.at.Add(f.threshold)
		if gained, ok := s.terms[r.Term]; ok && gained.Add(grace).After(base) {
			base = gained.Add(grace)
		}
		f.reapAt, f.deadline = r.At, base.Add(interval)
		f.settled = settled.Sub(f.at)
		late := r.At.Sub(f.deadline)
		f.ok = late <= 0
		s.t.Logf("fault %q at %s: reaped %s after it (%s), deadline %s after it", f.what, f.at.Format("15:04:05.000"),
			r.At.Sub(f.at).Round(time.Millisecond), r.Label, f.deadline.Sub(f.at).Round(time.Millisecond))
		// Up to one more interval is scheduling jitter on a loaded
		// machine (a figure); beyond that, recovery is broken.
		if late > interval {
			s.t.Errorf("fault %q: reaped %s past its deadline", f.what, late.Round(time.Millisecond))
		}
	}
}

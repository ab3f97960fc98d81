package soak

import (
	"fmt"
	"sort"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/sdk"
)

// The invariants, by name. Each is a function of a History that returns the
// violations it finds, each with its evidence; the soak runs them while the
// system runs and once more at the end.
const (
	// NeverTwoLiveExecutions: no two executions of one task overlap, judged
	// from the agents' journals and the process table.
	NeverTwoLiveExecutions = "never_two_live_executions"
	// NoReapOfALiveAttempt: no reaper marks an attempt failed while its
	// agent or its task group is alive, and no live task is stopped by
	// anyone but its own agent (or the injector).
	NoReapOfALiveAttempt = "no_reap_of_a_live_attempt"
	// NoDeposedLeaderWrite: every applied reaper mark was written under the
	// term current in the database at that moment, the term its decision
	// was made under.
	NoDeposedLeaderWrite = "no_deposed_leader_write"
	// BoundedRecovery: once the faults stop, every run is final within the
	// bound, and no attempt is left queued or running.
	BoundedRecovery = "bounded_recovery"
	// NothingLeftBehind: no process, record or socket outlives the soak
	// (on kube, no task pod still pending or running either).
	NothingLeftBehind = "nothing_left_behind"
	// NoLivePodTornDown (kube): no task pod is deleted or stopped in place
	// while its task runs, unless the injector's own fault did it, judged
	// from the API server's account of the pod and the agents' journals.
	NoLivePodTornDown = "no_live_pod_torn_down"
	// NoRetrySpentOnAClusterStop (kube): a task whose pod the cluster
	// stopped (deleted, evicted, lost with its node) settles on the infra
	// rail, never as a task failure that spends a retry, unless the task
	// had ended on its own before.
	NoRetrySpentOnAClusterStop = "no_retry_spent_on_a_cluster_stop"
	// HistoryChecked: the run's fault history (Record), written to its
	// file and judged once at the end by the independent checker
	// (testkit/history.Check), broke none of its rules. Each of its
	// violations fails the soak as history/<rule>.
	HistoryChecked = "history_checked"
)

// Invariants lists the invariants by name, in the report's order.
var Invariants = []string{NeverTwoLiveExecutions, NoReapOfALiveAttempt, NoDeposedLeaderWrite, NoLivePodTornDown,
	NoRetrySpentOnAClusterStop, BoundedRecovery, NothingLeftBehind, HistoryChecked}

// Violation is one breach of an invariant, with what shows it.
type Violation struct {
	Check    string
	Evidence string
}

func (v Violation) String() string { return v.Check + ": " + v.Evidence }

// reaperMarks are the failure reasons a reaper writes when it fails an
// attempt it judged lost. A reaper may only write them about an attempt
// whose agent and task group are gone.
var reaperMarks = map[string]bool{
	sdk.LabelAgentLost: true, sdk.LabelDispatchLost: true, sdk.LabelPodLost: true,
	sdk.LabelStartExpired: true, sdk.LabelWarmWorkerLost: true,
}

// markLabels are the audit labels of decisions that mark an attempt
// failed; their term is the term the mark was made under.
var markLabels = map[string]bool{
	sdk.LabelAgentLost: true, sdk.LabelAgentLostOrphanStopped: true, sdk.LabelAgentLostNeverHeartbeated: true,
	sdk.LabelDispatchLost: true, sdk.LabelDispatchLostOrphanStopped: true, sdk.LabelCredentialCeiling: true,
	sdk.LabelPodLost: true, sdk.LabelStartExpired: true, sdk.LabelWarmWorkerLost: true,
}

// isReaperMark says whether a transition is a reaper's mark.
func isReaperMark(t Transition) bool {
	return t.NewState == sdk.StateFailed && (reaperMarks[t.FailureReason] || t.FailureReason == sdk.LabelCredentialCeiling)
}

// IsReaper tells a reaper's decision from the runner's, the gate's, an
// operator's (reaperctl's submit, mark and release are audited) and the
// attempt API's.
func IsReaper(d Decision) bool {
	switch d.Reaper {
	case "", "runner", "gate", lifecycle.OperatorReaper, attemptapi.DecisionSource:
		return false
	}
	return true
}

func stamp(t time.Time) string { return t.Format("15:04:05.000000") }

// CheckNeverTwoLiveExecutions finds executions of one task that overlap:
// one began before another had provably ended (its end line, or the last
// sight of its group, whichever is later).
func CheckNeverTwoLiveExecutions(h History) []Violation {
	byTask := map[[2]string][]Execution{}
	for _, e := range h.Executions {
		k := [2]string{e.Attempt.RunID, e.Attempt.TaskID}
		byTask[k] = append(byTask[k], e)
	}
	var out []Violation
	for _, es := range byTask {
		sort.Slice(es, func(i, j int) bool { return es[i].Start.Before(es[j].Start) })
		for i := range es {
			for j := i + 1; j < len(es); j++ {
				a, b := es[i], es[j]
				if b.Start.Before(a.Over()) {
					out = append(out, Violation{Check: NeverTwoLiveExecutions, Evidence: fmt.Sprintf(
						"%s (agent %d, group %d) ran from %s to at least %s; %s (agent %d, group %d) started at %s",
						a.Attempt, a.AgentPID, a.PGID, stamp(a.Start), stamp(a.Over()),
						b.Attempt, b.AgentPID, b.PGID, stamp(b.Start))})
				}
			}
		}
	}
	return out
}

// CheckNoReapOfALiveAttempt finds reaper marks written while the marked
// attempt's agent or task group was still alive (seen alive, or writing
// its journal, after the mark), and tasks stopped by someone other than
// their agent or the injector: a task told should_terminate (its attempt
// moved on under it) or killed by a signal its agent did not send.
func CheckNoReapOfALiveAttempt(h History) []Violation {
	agents := map[sdk.Attempt][]AgentLife{}
	for _, a := range h.Agents {
		agents[a.Attempt] = append(agents[a.Attempt], a)
	}
	execs := map[sdk.Attempt][]Execution{}
	for _, e := range h.Executions {
		execs[e.Attempt] = append(execs[e.Attempt], e)
	}
	var out []Violation
	for _, t := range h.Transitions {
		if !isReaperMark(t) || !reaperMarks[t.FailureReason] {
			continue // credential_ceiling ends live attempts by design
		}
		if silent, _ := h.silentAt(t.From, t.At); silent {
			// Kube: the reapers see no process, only heartbeats landing;
			// a mark after agent_lost without one is theirs to make (the
			// pod is then torn down, and a durable record can still
			// override the mark).
			continue
		}
		for _, a := range agents[t.From] {
			alive := a.LastSeenAlive
			if a.Exited.After(alive) {
				alive = a.Exited
			}
			if a.Began.Before(t.At) && alive.After(t.At) {
				out = append(out, Violation{Check: NoReapOfALiveAttempt, Evidence: fmt.Sprintf(
					"%s marked %s at %s (term %d) while its agent %d was alive (began %s, alive at %s)%s",
					t.From, t.FailureReason, stamp(t.At), t.Term, a.PID, stamp(a.Began), stamp(alive), h.lastBeat(t.From, t.At))})
			}
		}
		for _, e := range execs[t.From] {
			if e.Start.Before(t.At) && e.Over().After(t.At) {
				out = append(out, Violation{Check: NoReapOfALiveAttempt, Evidence: fmt.Sprintf(
					"%s marked %s at %s (term %d) while its task group %d was alive (started %s, alive at %s)%s",
					t.From, t.FailureReason, stamp(t.At), t.Term, e.PGID, stamp(e.Start), stamp(e.Over()), h.lastBeat(t.From, t.At))})
			}
		}
	}
	marked := map[sdk.Attempt]time.Time{} // the first reaper mark of each attempt
	for _, t := range h.Transitions {
		if _, ok := marked[t.From]; !ok && isReaperMark(t) {
			marked[t.From] = t.At
		}
	}
	killed := killedBy(h.Faults)
	for _, e := range h.Executions {
		switch {
		case e.EndReason == agent.ReasonTerminated && h.AgentLost > 0 && !marked[e.Attempt].IsZero() &&
			marked[e.Attempt].Before(e.End):
			// Kube: told to stop after a mark judged above.
		case e.EndReason == agent.ReasonTerminated && h.lostRunning(e):
			// The board lost its attempt's running (an asynchronous
			// failover's window): excused, and counted in the report.
		case e.EndReason == agent.ReasonTerminated:
			out = append(out, Violation{Check: NoReapOfALiveAttempt, Evidence: fmt.Sprintf(
				"%s: its live agent %d was told should_terminate and stopped its task group %d (ended %s)",
				e.Attempt, e.AgentPID, e.PGID, stamp(e.End))})
		case e.EndReason == agent.ReasonSignal && !killed[e.Attempt]:
			out = append(out, Violation{Check: NoReapOfALiveAttempt, Evidence: fmt.Sprintf(
				"%s: its task group %d was killed by a signal neither its agent %d nor the injector sent (ended %s)",
				e.Attempt, e.PGID, e.AgentPID, stamp(e.End))})
		}
	}
	return out
}

// killedBy is the set of attempts whose task the faults stopped
// themselves.
func killedBy(faults []Fault) map[sdk.Attempt]bool {
	killed := map[sdk.Attempt]bool{}
	for _, f := range faults {
		if f.KilledGroup {
			for _, a := range f.Harmed() {
				killed[a] = true
			}
		}
	}
	return killed
}

// CheckNoLivePodTornDown finds pod stops (a deletion, a lowered deadline)
// that the injector did not cause, of an attempt the board still held
// queued or running, and that met a task still running: an
// execution of the pod's attempt that had started before the stop was seen
// and was still alive then, or that its agent ended because it was told to
// stop (SIGTERM, as the kubelet does to a pod going away). A stop of an
// execution an asynchronous failover's window took from the board
// (lostPodStop: it started in the window, and the promoted board never had
// its attempt running by the stop) is excused, and counted in the report.
func CheckNoLivePodTornDown(h History) []Violation {
	killed := killedBy(h.Faults)
	execs := map[sdk.Attempt][]Execution{}
	for _, e := range h.Executions {
		execs[e.Attempt] = append(execs[e.Attempt], e)
	}
	settled := map[sdk.Attempt]time.Time{} // when the board first moved the attempt on
	for _, t := range h.Transitions {
		if _, ok := settled[t.From]; !ok && (t.OldState == sdk.StateRunning || t.OldState == sdk.StateQueued) &&
			t.NewState != sdk.StateRunning && t.NewState != sdk.StateQueued {
			settled[t.From] = t.At
		}
	}
	var out []Violation
	for _, ps := range h.PodStops {
		if killed[ps.Attempt] {
			continue
		}
		if at, ok := settled[ps.Attempt]; ok && !at.After(ps.At) {
			continue // a teardown of a settled attempt: its mark is judged by NoReapOfALiveAttempt
		}
		for _, e := range execs[ps.Attempt] {
			if !e.Start.Before(ps.At) {
				continue
			}
			if (e.Over().After(ps.At) || e.EndReason == agent.ReasonAgentStopped) && !h.lostPodStop(ps, e) {
				out = append(out, Violation{Check: NoLivePodTornDown, Evidence: fmt.Sprintf(
					"pod %s of %s %s at %s (phase %s) while its task ran (agent %d, group %d, started %s, alive at %s, ended %q)",
					ps.Pod, ps.Attempt, ps.How, stamp(ps.At), ps.Phase, e.AgentPID, e.PGID, stamp(e.Start),
					stamp(e.Over()), e.EndReason)})
			}
		}
	}
	return out
}

// CheckNoRetrySpentOnAClusterStop finds attempts whose pod a cluster stop
// harmed and that then settled as a task failure, unless their task had
// ended on its own before the pod was stopped (a lost node's pods are
// stopped only when the controller manager's Pod GC deletes them).
func CheckNoRetrySpentOnAClusterStop(h History) []Violation {
	stops := map[sdk.Attempt]Fault{}
	for _, f := range h.Faults {
		if f.ClusterStop {
			for _, a := range f.Harmed() {
				stops[a] = f
			}
		}
	}
	ownEnd := map[sdk.Attempt]time.Time{} // the task ended on its own (not stopped)
	ownVerdict := map[sdk.Attempt]bool{}  // the agent judged the end itself (exit code, timeout)
	for _, e := range h.Executions {
		if !e.End.IsZero() && e.EndReason != agent.ReasonAgentStopped {
			ownEnd[e.Attempt] = e.End
		}
		// An exit code or a timeout is the agent's own verdict, reached
		// before any stop reached it (a stopped agent says agent_stopped),
		// even when the group's end is journaled an instant after the stop.
		if e.EndReason == agent.ReasonExitCode || e.EndReason == agent.ReasonExecutionTimeout {
			ownVerdict[e.Attempt] = true
		}
	}
	var out []Violation
	for _, t := range h.Transitions {
		f, ok := stops[t.From]
		if !ok || !t.At.After(f.At) || t.OldState != sdk.StateRunning || t.FailureKind != sdk.FailureTask {
			continue
		}
		var stopped time.Time
		if f.Target != nil && *f.Target == t.From {
			stopped = f.At // the injector stopped this pod itself, then
		}
		for _, ps := range h.PodStops {
			if stopped.IsZero() && ps.Attempt == t.From && !ps.At.Before(f.At) {
				stopped = ps.At // a lost node's pod, when Pod GC deleted it
				break
			}
		}
		if stopped.IsZero() || stopped.After(t.At) {
			continue // its pod was not stopped yet (a lost node's pod waits for Pod GC): the end is the task's
		}
		if end, ok := ownEnd[t.From]; (ok && end.Before(stopped)) || ownVerdict[t.From] {
			continue
		}
		out = append(out, Violation{Check: NoRetrySpentOnAClusterStop, Evidence: fmt.Sprintf(
			"%s settled %s as a task failure (%s) at %s (term %d) after %s at %s stopped its pod (seen stopped at %s)",
			t.From, t.NewState, t.FailureReason, stamp(t.At), t.Term, f.Kind, stamp(f.At), stamp(stopped))})
	}
	return out
}

// CheckNoDeposedLeaderWrite finds applied reaper marks (task marks and run
// reaps) whose transaction ran under another term than the one their
// decision was made under, or under a term that a newer one had already
// replaced when the write landed.
func CheckNoDeposedLeaderWrite(h History) []Violation {
	var out []Violation
	marks := map[sdk.Attempt][]Decision{}
	runReaps := map[string][]Decision{}
	for _, d := range h.Decisions {
		if !d.Applied || !IsReaper(d) {
			continue
		}
		switch {
		case markLabels[d.Label] && d.Attempt.TaskID != "":
			marks[d.Attempt] = append(marks[d.Attempt], d)
		case d.Label == sdk.LabelOrphanRun:
			runReaps[d.Attempt.RunID] = append(runReaps[d.Attempt.RunID], d)
		}
	}
	terms := append([]Term(nil), h.Terms...)
	sort.Slice(terms, func(i, j int) bool { return terms[i].At.Before(terms[j].At) })
	// current is the newest term the database had begun at t.
	current := func(t time.Time) (Term, bool) {
		i := sort.Search(len(terms), func(i int) bool { return terms[i].At.After(t) })
		if i == 0 {
			return Term{}, false
		}
		return terms[i-1], true
	}
	judge := func(what string, at time.Time, writeTerm int64, ds []Decision) {
		for _, d := range ds {
			if d.Term != writeTerm {
				out = append(out, Violation{Check: NoDeposedLeaderWrite, Evidence: fmt.Sprintf(
					"%s applied at %s under term %d, but decided (%s by %s, audit %d) under term %d",
					what, stamp(at), writeTerm, d.Label, d.Reaper, d.ID, d.Term)})
			}
		}
		if cur, ok := current(at); ok && cur.Term != writeTerm {
			out = append(out, Violation{Check: NoDeposedLeaderWrite, Evidence: fmt.Sprintf(
				"%s applied at %s under term %d, while term %d (%s) had begun at %s",
				what, stamp(at), writeTerm, cur.Term, cur.Holder, stamp(cur.At))})
		}
	}
	for _, t := range h.Transitions {
		if isReaperMark(t) {
			judge(fmt.Sprintf("mark %s of %s", t.FailureReason, t.From), t.At, t.Term, marks[t.From])
		}
	}
	for _, rc := range h.RunChanges {
		if rc.NewState == sdk.RunFailed && len(runReaps[rc.RunID]) > 0 {
			judge("orphan reap of run "+rc.RunID, rc.At, rc.Term, runReaps[rc.RunID])
		}
	}
	return out
}

// CheckAll runs the invariants that judge a history while the system runs.
func CheckAll(h History) map[string][]Violation {
	return map[string][]Violation{
		NeverTwoLiveExecutions:     CheckNeverTwoLiveExecutions(h),
		NoReapOfALiveAttempt:       CheckNoReapOfALiveAttempt(h),
		NoDeposedLeaderWrite:       CheckNoDeposedLeaderWrite(h),
		NoLivePodTornDown:          CheckNoLivePodTornDown(h),
		NoRetrySpentOnAClusterStop: CheckNoRetrySpentOnAClusterStop(h),
	}
}

// Unsettled lists what BoundedRecovery refuses at its deadline: runs not
// final, attempts still queued or running.
func Unsettled(runs map[string]string, live []sdk.Attempt, deadline time.Time) []Violation {
	var out []Violation
	ids := make([]string, 0, len(runs))
	for id, st := range runs {
		if st != sdk.RunSuccess && st != sdk.RunFailed {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	for _, id := range ids {
		out = append(out, Violation{Check: BoundedRecovery, Evidence: fmt.Sprintf(
			"run %s still %s at the deadline %s", id, runs[id], stamp(deadline))})
	}
	for _, a := range live {
		out = append(out, Violation{Check: BoundedRecovery, Evidence: fmt.Sprintf(
			"attempt %s still queued or running at the deadline %s", a, stamp(deadline))})
	}
	return out
}

package kube

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// Failure reasons of the task failures the sweep settles from a finished
// pod; each also starts the error_message.
const (
	// ReasonTaskFailed: the task's own FAILED record, or a pod that failed
	// with no record and no disruption.
	ReasonTaskFailed = "task_failed"
	// ReasonOOMKilled: the task container was OOM-killed: the kernel
	// enforced the task's own memory limit.
	ReasonOOMKilled = "oom_killed"
	// ReasonOwnLimitEvicted: the kubelet evicted the pod for outgrowing a
	// limit of its own (ephemeral storage, an emptyDir sizeLimit).
	ReasonOwnLimitEvicted = "evicted_own_limit"
)

// disruptionConditions are the DisruptionTarget reasons that say the
// cluster, not the task, stopped the pod.
var disruptionConditions = []string{
	"TerminationByKubelet", "PreemptionByScheduler", "EvictionByEvictionAPI",
	"DeletionByTaintManager", "DeletionByPodGC",
}

// startFailures are the terminated reasons the container runtime gives a
// container it could not start.
var startFailures = []string{"StartError", "ContainerCannotRun"}

// disruptionReasons are the pod reasons older kubelets and admission
// refusals set without the condition.
var disruptionReasons = []string{
	"Evicted", "Shutdown", "NodeShutdown", "Terminated", "OutOfcpu", "OutOfmemory", "UnexpectedAdmissionError",
}

// ownLimitMessages are the kubelet's eviction messages that name a limit
// of the pod's own (pkg/kubelet/eviction): a container over its
// ephemeral-storage limit, the pod over its containers' total, an emptyDir
// over its sizeLimit. The node-pressure message ("The node was low on
// resource") is not among them.
var ownLimitMessages = []string{
	"exceeded its local ephemeral storage limit",
	"exceeds the total limit of containers",
	"Usage of EmptyDir volume",
}

// verdict is how the sweep settles one finished pod's attempt.
type verdict struct {
	outcome sdk.Outcome
	reason  string // the failure label (failed and infra outcomes)
	message string // the error_message, starting with reason
	rule    string // the rule that decided, for the decision's evidence
}

// judgeFinished settles a finished pod from its durable outcome record and
// what the cluster says. ok is false for a pod that has not finished
// (Unknown is not finished: a container may still run on a silent node).
//
// In order: a SUCCESS or RESCHEDULE record wins; the infra marker with the
// agent's shape settles control_plane_unavailable on the infra rail; a
// disrupted pod settles pod_disrupted on the infra rail, unless its task
// container was OOM-killed or the kubelet evicted it for a limit of its
// own (task failures); a pod deleted while its task ran (the agent's
// "stopped from outside" record on a pod with a deletion timestamp: the
// record says the task was stopped, not why) settles pod_disrupted on the
// infra rail, as the same pod gone from the cache settles pod_lost, and so
// does one with no record whose task container ended at or after the
// deletion (the deletion's kill, on an agent that could write nothing);
// otherwise the pod's phase decides, a FAILED record giving the failure its
// words (the agent's "stopped" record gives none: the pod's end does).
func judgeFinished(p *pod) (verdict, bool) {
	if !finished(p.phase) {
		return verdict{}, false
	}
	rec, hasRec := p.record()
	if hasRec {
		switch {
		case rec.Outcome == RecordSuccess:
			return verdict{outcome: sdk.OutcomeSuccess, rule: "DurableSuccessRecord"}, true
		case rec.Outcome == RecordReschedule:
			return verdict{outcome: sdk.OutcomeReschedule, rule: "DurableRescheduleRecord"}, true
		case rec.HonoredInfra():
			return verdict{outcome: sdk.OutcomeInfra, reason: sdk.ReasonControlPlaneUnavailable,
				message: sdk.ReasonControlPlaneUnavailable + ": " + rec.Reason, rule: "ControlPlaneUnavailableRecord"}, true
		}
	}
	if cause, ok := disruption(p); ok {
		task, _ := p.task()
		switch {
		case task.terminatedWith("OOMKilled"):
			return verdict{outcome: sdk.OutcomeFailed, reason: ReasonOOMKilled,
				message: fmt.Sprintf("%s: task container OOMKilled (exit %d) on a disrupted pod (%s)", ReasonOOMKilled, task.term.exitCode, cause),
				rule:    "OOMKilledStaysTaskFailure"}, true
		case p.statusReason() == "Evicted" && ownLimit(p.statusMessage()):
			return verdict{outcome: sdk.OutcomeFailed, reason: ReasonOwnLimitEvicted,
				message: ReasonOwnLimitEvicted + ": " + strings.TrimSpace(p.statusMessage()), rule: "OwnLimitEvictionStaysTaskFailure"}, true
		}
		msg := sdk.ReasonPodDisrupted + ": " + cause
		if m := strings.TrimSpace(p.statusMessage()); m != "" {
			msg += ": " + m
		}
		return verdict{outcome: sdk.OutcomeInfra, reason: sdk.ReasonPodDisrupted, message: msg, rule: "DisruptedPodIsInfra"}, true
	}
	stopped := hasRec && rec.StoppedFromOutside()
	if stopped && p.DeletionTimestamp != nil {
		task, _ := p.task()
		if !task.terminatedWith("OOMKilled") {
			return verdict{outcome: sdk.OutcomeInfra, reason: sdk.ReasonPodDisrupted,
				message: sdk.ReasonPodDisrupted + ": pod deleted while its task ran (the agent was stopped before the task finished)",
				rule:    "DeletedUnderTheTaskIsInfra"}, true
		}
	}
	if p.phase == corev1.PodSucceeded {
		return verdict{outcome: sdk.OutcomeSuccess, rule: "SucceededWithoutRecord"}, true
	}
	// No record, and the task container was never started (the runtime
	// failed to: a kubelet killed while it started the container, a
	// broken image): nothing of the task ran, so it is no failure of the
	// task's; the infra rail re-places it, its budget bounding a container
	// that can never start.
	if !hasRec {
		if task, ok := p.task(); ok && task.terminated() && slices.Contains(startFailures, task.term.reason) {
			msg := fmt.Sprintf("%s: the task container never started (%s, exit %d)", sdk.ReasonPodDisrupted, task.term.reason, task.term.exitCode)
			if m := strings.TrimSpace(task.term.message); m != "" {
				msg += ": " + m
			}
			return verdict{outcome: sdk.OutcomeInfra, reason: sdk.ReasonPodDisrupted, message: msg, rule: "NeverStartedIsInfra"}, true
		}
	}
	// No record at all, and the task container ended at or after the
	// pod's deletion was asked for: the deletion's kill ended it (an agent
	// frozen or killed outright writes nothing; a grace of 0 leaves it no
	// time to). The request, not the deletion timestamp: while the pod's
	// grace runs the timestamp is when the kill is due, and after the
	// kubelet's last delete it is that delete's time, both after the kill
	// (deletionRequested). The request's second and the container's end
	// are both whole seconds: the same second counts as after (a task that
	// failed by itself in the very second someone deleted its pod is
	// re-run on the infra budget, not charged a retry).
	if !hasRec && p.DeletionTimestamp != nil {
		if task, ok := p.task(); ok && task.terminated() && task.term.reason != "OOMKilled" &&
			!task.term.finishedAt.Before(p.deletionRequested()) {
			return verdict{outcome: sdk.OutcomeInfra, reason: sdk.ReasonPodDisrupted,
				message: fmt.Sprintf("%s: pod deleted while its task ran (its container ended at %s, after the deletion, with no record: exit %d)",
					sdk.ReasonPodDisrupted, task.term.finishedAt.UTC().Format(time.RFC3339), task.term.exitCode),
				rule: "KilledByItsDeletionIsInfra"}, true
		}
	}
	if hasRec && !stopped && strings.TrimSpace(rec.Reason) != "" {
		return verdict{outcome: sdk.OutcomeFailed, reason: ReasonTaskFailed,
			message: ReasonTaskFailed + ": " + rec.Reason, rule: "FailedRecord"}, true
	}
	return verdict{outcome: sdk.OutcomeFailed, reason: ReasonTaskFailed,
		message: ReasonTaskFailed + ": " + failedWords(p), rule: "FailedPod"}, true
}

// disruption reports whether the cluster stopped the pod, and how.
func disruption(p *pod) (string, bool) {
	disrupted, _ := p.disruptionTarget()
	for _, c := range disruptionConditions {
		if disrupted == c {
			return "DisruptionTarget " + c, true
		}
	}
	for _, r := range disruptionReasons {
		if p.statusReason() == r {
			return r, true
		}
	}
	return "", false
}

func ownLimit(msg string) bool {
	for _, m := range ownLimitMessages {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// failedWords says why a pod failed, as the cluster saw it.
func failedWords(p *pod) string {
	var parts []string
	if r := p.statusReason(); r != "" {
		parts = append(parts, r)
	}
	if task, ok := p.task(); ok && task.terminated() {
		parts = append(parts, fmt.Sprintf("task container exited %d", task.term.exitCode))
		if task.term.reason != "" {
			parts[len(parts)-1] += " (" + task.term.reason + ")"
		}
	}
	if m := strings.TrimSpace(p.statusMessage()); m != "" {
		parts = append(parts, m)
	}
	if len(parts) == 0 {
		return "pod failed"
	}
	return "pod failed: " + strings.Join(parts, ": ")
}

// markAction is what the sweep does with one provisional infra mark.
type markAction int

const (
	// markHold: something of the attempt may still run, or its record
	// came too late; leave the mark provisional.
	markHold markAction = iota
	// markConfirm: nothing of the attempt runs and it left no SUCCESS:
	// the planner may act on the mark.
	markConfirm
	// markOverride: the attempt left a durable SUCCESS record while its
	// mark is provisional and inside the valve: settle it success.
	markOverride
)

// judgeMark decides a provisional infra mark from the pods of exactly its
// attempt, read live. A SUCCESS record overrides the mark while it is
// inside the infra confirmation valve (the board also requires the run to
// be running); after the valve the record is ignored and the mark left to
// the planner. Otherwise the mark is confirmed when no pod of the attempt
// is left, or when every one's task container has terminated; a container
// still running or yet to run (inside its termination grace, or not
// started) holds it back. The containers' states decide, never the pod's
// phase: a pod stopped in place can read Failed while its container runs.
// A pod without the exact task id may be a sibling's whose task id shares
// the lossy label: it holds a confirmation back (when in doubt, defer), and
// its SUCCESS record overrides only if the board finds the attempt recorded
// that pod's UID.
// A finished pod deleted with no grace left (held only by a finalizer)
// counts as gone, as it did before finalizers held it.
func judgeMark(c sdk.Candidate, pods []*pod, now time.Time, l ladder.Ladder) (markAction, string) {
	if p := successPod(pods); p != nil {
		if insideValve(c, now, l) {
			return markOverride, fmt.Sprintf("%s left a durable SUCCESS record %s after the mark", p.ref(),
				now.Sub(c.InfraMarkedAt).Round(time.Second))
		}
		return markHold, fmt.Sprintf("%s left a durable SUCCESS record, but the mark is past the valve (%s): ignored",
			p.ref(), l.InfraConfirmValve)
	}
	if len(pods) == 0 {
		return markConfirm, "no pod of the attempt is left"
	}
	for _, p := range pods {
		// A finished pod the cluster has let go (deleted with no grace
		// left: Pod GC, a forced delete) counts as gone: only a finalizer
		// keeps its object, and no kubelet writes to it any more.
		if finished(p.phase) && p.letGo() {
			continue
		}
		task, ok := p.task()
		if !ok || !task.terminated() {
			return markHold, fmt.Sprintf("the task container of %s has not terminated (pod %s)", p.ref(), p.phase)
		}
	}
	return markConfirm, "every task container of the attempt terminated without a SUCCESS record"
}

// insideValve: the mark was made less than the infra confirmation valve
// ago.
func insideValve(c sdk.Candidate, now time.Time, l ladder.Ladder) bool {
	return !c.InfraMarkedAt.IsZero() && c.InfraMarkedAt.After(now.Add(-l.InfraConfirmValve))
}

// collectible: a finished pod whose attempt is settled is deleted once it
// has been finished for CollectAfter. Unknown is not finished.
func collectible(p *pod, settled bool, now time.Time) bool {
	return finished(p.phase) && settled && now.Sub(p.finishedAt()) >= CollectAfter
}

// warmSignal names the positive signal a warm mark was confirmed on (the
// warm_signal evidence of its decision).
type warmSignal string

const (
	warmNoSignal         warmSignal = ""
	warmWorkerGone       warmSignal = "worker_gone"
	warmWorkerTerminated warmSignal = "worker_terminated"
	warmWorkerClaim      warmSignal = "worker_claim"
)

// judgeWarmMark decides a provisional infra mark of a warm attempt from a
// live read of the warm pool (workers, by pod name), made after the mark
// was listed, and from the last claim of its worker the board carries on
// the candidate. A warm attempt has no pod of its own and leaves no
// outcome record, so the positive signals that nothing of it runs on are
// its worker's:
//   - the worker's pod is gone, or every container of it has terminated
//     (a worker is never restarted in place);
//   - the worker is alive, but its last claim was made strictly after the
//     mark and said which attempts it runs without this one (same try and
//     epoch). A worker lists every attempt handed to it until the attempt's
//     run has ended, and the claim's time is the issue time of the worker
//     token it presented, so a claim after the mark speaks for the marked
//     attempt, which was handed over before it.
//
// Anything else holds the mark (the valve stays its guard): no claim
// record, a claim that did not say what the worker runs (an older worker,
// or a list the attempt API refused), a claim not after the mark, a claim
// that lists the attempt.
func judgeWarmMark(c sdk.Candidate, workers map[string]*pod) (markAction, warmSignal, string) {
	if c.WarmWorker == "" {
		return markHold, warmNoSignal, "the warm attempt is bound to no worker: nothing says it stopped"
	}
	p, ok := workers[c.WarmWorker]
	if !ok {
		return markConfirm, warmWorkerGone, fmt.Sprintf("warm worker %s is gone: a live list of the pool (%d pods) does not hold it",
			c.WarmWorker, len(workers))
	}
	if len(p.containers) > 0 && !slices.ContainsFunc(p.containers, func(ct container) bool { return !ct.terminated() }) {
		return markConfirm, warmWorkerTerminated, fmt.Sprintf("every container of warm worker %s has terminated (pod %s)",
			c.WarmWorker, p.phase)
	}
	switch {
	case c.WarmClaimedAt.IsZero():
		return markHold, warmNoSignal, fmt.Sprintf("warm worker %s (pod %s) is alive and has no claim on the board that says what it runs: it may still run the attempt",
			c.WarmWorker, p.phase)
	case !c.WarmClaimedAt.After(c.InfraMarkedAt):
		return markHold, warmNoSignal, fmt.Sprintf("warm worker %s (pod %s) is alive and last claimed at %s, not after the mark (%s): it may still run the attempt",
			c.WarmWorker, p.phase, c.WarmClaimedAt.UTC().Format(time.RFC3339Nano), c.InfraMarkedAt.UTC().Format(time.RFC3339Nano))
	case c.WarmClaimHolds:
		return markHold, warmNoSignal, fmt.Sprintf("warm worker %s (pod %s) claimed at %s that it still runs the attempt",
			c.WarmWorker, p.phase, c.WarmClaimedAt.UTC().Format(time.RFC3339Nano))
	}
	return markConfirm, warmWorkerClaim, fmt.Sprintf("warm worker %s (pod %s) is alive, and its claim at %s, %s after the mark, does not list the attempt",
		c.WarmWorker, p.phase, c.WarmClaimedAt.UTC().Format(time.RFC3339Nano), c.WarmClaimedAt.Sub(c.InfraMarkedAt).Round(time.Millisecond))
}

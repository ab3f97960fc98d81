package kube

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/dexaflow/reaper/sdk"
)

// disruptionCauses are the specification's ways the cluster, not the task,
// stops a pod, each written out as the cluster spells it: the
// DisruptionTarget condition's reasons, then the pod reasons older kubelets
// and admission refusals set without it.
var disruptionCauses = []struct {
	name string
	pod  func(*corev1.Pod)
	msg  string // the error_message the settlement starts with
}{
	{"ConditionTerminationByKubelet", disrupted("TerminationByKubelet"), "pod_disrupted: DisruptionTarget TerminationByKubelet"},
	{"ConditionPreemptionByScheduler", disrupted("PreemptionByScheduler"), "pod_disrupted: DisruptionTarget PreemptionByScheduler"},
	{"ConditionEvictionByEvictionAPI", disrupted("EvictionByEvictionAPI"), "pod_disrupted: DisruptionTarget EvictionByEvictionAPI"},
	{"ConditionDeletionByTaintManager", disrupted("DeletionByTaintManager"), "pod_disrupted: DisruptionTarget DeletionByTaintManager"},
	{"ReasonEvicted", podReason("Evicted", "The node was low on resource: ephemeral-storage. "), "pod_disrupted: Evicted: The node was low on resource"},
	{"ReasonShutdown", podReason("Shutdown", "Pod was rejected as the node is shutting down."), "pod_disrupted: Shutdown"},
	{"ReasonNodeShutdown", podReason("NodeShutdown", "Pod was terminated in response to imminent node shutdown."), "pod_disrupted: NodeShutdown"},
	{"ReasonTerminated", podReason("Terminated", "Pod was terminated in response to imminent node shutdown."), "pod_disrupted: Terminated"},
	{"ReasonOutOfcpu", podReason("OutOfcpu", "Pod was rejected: Node didn't have enough resource: cpu"), "pod_disrupted: OutOfcpu"},
	{"ReasonOutOfmemory", podReason("OutOfmemory", "Pod was rejected: Node didn't have enough resource: memory"), "pod_disrupted: OutOfmemory"},
	{"ReasonUnexpectedAdmissionError", podReason("UnexpectedAdmissionError", "Allocate failed due to can't allocate"), "pod_disrupted: UnexpectedAdmissionError"},
}

// Each way the cluster stops a pod settles its attempt on the infra rail
// with an error_message starting pod_disrupted:, whether or not the task
// container ran (an admission refusal leaves none), whatever its exit.
func TestEachDisruptionSettlesOnTheInfraRail(t *testing.T) {
	shapes := []struct {
		name string
		opts []func(*corev1.Pod)
	}{
		{"NoContainerRan", nil},
		{"TaskKilled", []func(*corev1.Pod){taskTerminated(137, "Error", "", t0)}},
		{"TaskExitedNonZero", []func(*corev1.Pod){taskTerminated(1, "Error", "not a record", t0)}},
	}
	for _, c := range disruptionCauses {
		for _, s := range shapes {
			t.Run(c.name+"/"+s.name, func(t *testing.T) {
				v, ok := judgeFinished(podOf(attempt, corev1.PodFailed, append([]func(*corev1.Pod){c.pod}, s.opts...)...))
				if !ok || v.outcome != sdk.OutcomeInfra || v.reason != sdk.ReasonPodDisrupted {
					t.Fatalf("settled %v as %s/%s (%s), want infra/%s", ok, v.outcome, v.reason, v.message, sdk.ReasonPodDisrupted)
				}
				if !strings.HasPrefix(v.message, c.msg) {
					t.Fatalf("error_message %q, want it to start %q", v.message, c.msg)
				}
			})
		}
	}
}

// The exceptions, for every way of disruption: the attempt's own SUCCESS or
// RESCHEDULE record wins over it; a task container the kernel OOM-killed
// stays a task failure (the task's own memory limit); a FAILED record does
// not win (the task was killed by the disruption, and says so).
func TestDisruptionExceptions(t *testing.T) {
	for _, c := range disruptionCauses {
		t.Run(c.name, func(t *testing.T) {
			t.Run("SuccessRecordWins", func(t *testing.T) {
				v, _ := judgeFinished(podOf(attempt, corev1.PodFailed, c.pod,
					taskTerminated(0, "Completed", rec(t, attempt, RecordSuccess, code(0), ""), t0)))
				if v.outcome != sdk.OutcomeSuccess {
					t.Fatalf("got %s (%s), want success", v.outcome, v.message)
				}
			})
			t.Run("RescheduleRecordWins", func(t *testing.T) {
				v, _ := judgeFinished(podOf(attempt, corev1.PodFailed, c.pod,
					taskTerminated(0, "Completed", rec(t, attempt, RecordReschedule, code(0), ""), t0)))
				if v.outcome != sdk.OutcomeReschedule {
					t.Fatalf("got %s (%s), want reschedule", v.outcome, v.message)
				}
			})
			t.Run("OOMKilledTaskContainerStaysTaskFailure", func(t *testing.T) {
				v, _ := judgeFinished(podOf(attempt, corev1.PodFailed, c.pod, taskTerminated(137, "OOMKilled", "", t0)))
				if v.outcome != sdk.OutcomeFailed || v.reason != ReasonOOMKilled {
					t.Fatalf("got %s/%s (%s), want failed/%s", v.outcome, v.reason, v.message, ReasonOOMKilled)
				}
			})
			t.Run("FailedRecordDoesNotWin", func(t *testing.T) {
				v, _ := judgeFinished(podOf(attempt, corev1.PodFailed, c.pod,
					taskTerminated(143, "Error", rec(t, attempt, RecordFailed, code(143), "terminated by SIGTERM"), t0)))
				if v.outcome != sdk.OutcomeInfra || v.reason != sdk.ReasonPodDisrupted {
					t.Fatalf("got %s/%s (%s), want infra/%s", v.outcome, v.reason, v.message, sdk.ReasonPodDisrupted)
				}
			})
		})
	}
}

// An eviction is the task's own fault when the kubelet's message names a
// limit of the pod's own (a task failure), and the cluster's when it says
// the node was low on a resource (infra); the kubelet also sets the
// TerminationByKubelet condition on both.
func TestEvictionMessageDecidesWhoseFault(t *testing.T) {
	own := `Container task exceeded its local ephemeral storage limit "1Gi". `
	node := "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. "
	cases := []struct {
		name       string
		opts       []func(*corev1.Pod)
		outcome    sdk.Outcome
		wantReason string
	}{
		{"OwnLimit_TaskFailure", []func(*corev1.Pod){podReason("Evicted", own)}, sdk.OutcomeFailed, ReasonOwnLimitEvicted},
		{"OwnLimitWithTheKubeletsCondition_TaskFailure", []func(*corev1.Pod){podReason("Evicted", own), disrupted("TerminationByKubelet")},
			sdk.OutcomeFailed, ReasonOwnLimitEvicted},
		{"NodeLowOnResource_Infra", []func(*corev1.Pod){podReason("Evicted", node)}, sdk.OutcomeInfra, sdk.ReasonPodDisrupted},
		{"NodeLowOnResourceWithTheKubeletsCondition_Infra", []func(*corev1.Pod){podReason("Evicted", node), disrupted("TerminationByKubelet")},
			sdk.OutcomeInfra, sdk.ReasonPodDisrupted},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, ok := judgeFinished(podOf(attempt, corev1.PodFailed, tc.opts...))
			if !ok || v.outcome != tc.outcome || v.reason != tc.wantReason {
				t.Fatalf("got %s/%s (%s), want %s/%s", v.outcome, v.reason, v.message, tc.outcome, tc.wantReason)
			}
		})
	}
}

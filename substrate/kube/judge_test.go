package kube

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

var (
	t0      = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	attempt = sdk.Attempt{RunID: "run-1", TaskID: "load_a", Try: 2, Epoch: 1}
)

// podOf builds a corev1.Pod of attempt a in phase, reduced as the cache
// and live reads reduce it; opts adjust the corev1.Pod first.
func podOf(a sdk.Attempt, phase corev1.PodPhase, opts ...func(*corev1.Pod)) *pod {
	l, ann := AttemptLabels(a)
	in := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "uid-1", Labels: l, Annotations: ann},
		Status:     corev1.PodStatus{Phase: phase},
	}
	for _, o := range opts {
		o(in)
	}
	return reduce(in)
}

func started(at time.Time) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Status.StartTime = &metav1.Time{Time: at} }
}

func taskTerminated(exit int32, reason, message string, at time.Time) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: TaskContainer,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: exit, Reason: reason,
				Message: message, FinishedAt: metav1.Time{Time: at}}}})
	}
}

func taskRunning() func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: TaskContainer,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}})
	}
}

func disrupted(reason string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget,
			Status: corev1.ConditionTrue, Reason: reason})
	}
}

func podReason(reason, message string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Status.Reason, p.Status.Message = reason, message }
}

func withoutAnnotation() func(*corev1.Pod) {
	return func(p *corev1.Pod) { delete(p.Annotations, AnnotationRawTaskID) }
}

func withoutEpoch() func(*corev1.Pod) {
	return func(p *corev1.Pod) { delete(p.Labels, LabelAttemptEpoch) }
}

// rec encodes a record of attempt a.
func rec(t *testing.T, a sdk.Attempt, outcome RecordOutcome, exit *int32, reason string) string {
	t.Helper()
	s, err := Record{Outcome: outcome, RunID: a.RunID, TaskID: a.TaskID, Try: a.Try, Epoch: a.Epoch,
		ExitCode: exit, Reason: reason}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func code(c int32) *int32 { return &c }

// deleting gives a pod the deletion timestamp a graceful delete sets
// (the outcome record finalizer keeps the object).
func deleting(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: t0.Add(20 * time.Second)} }

// deletedByTheKubelet gives a pod what its object reads as after the
// kubelet's last (grace-0) delete at at: the timestamp is that delete's
// time, no grace left.
func deletedByTheKubelet(at time.Time) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.DeletionTimestamp = &metav1.Time{Time: at}
		g := int64(0)
		p.DeletionGracePeriodSeconds = &g
	}
}

// deletingInGrace gives a pod what a delete asked for at t0+20s with a
// 30 s grace reads as while the grace runs: the timestamp is when the kill
// is due (t0+50s), the grace still recorded.
func deletingInGrace(p *corev1.Pod) {
	p.DeletionTimestamp = &metav1.Time{Time: t0.Add(50 * time.Second)}
	g := int64(30)
	p.DeletionGracePeriodSeconds = &g
}

func TestJudgeFinished(t *testing.T) {
	other := attempt
	other.Epoch = 0
	tests := []struct {
		name        string
		pod         func(t *testing.T) *pod
		wantOK      bool
		wantOutcome sdk.Outcome
		wantReason  string
		wantMsg     string // prefix of the error_message
	}{
		{name: "RunningPod_NotSettled", pod: func(t *testing.T) *pod {
			return podOf(attempt, corev1.PodRunning, taskRunning())
		}},
		{name: "UnknownPhase_IsNotTerminal", pod: func(t *testing.T) *pod {
			return podOf(attempt, corev1.PodUnknown, taskTerminated(0, "Completed", rec(t, attempt, RecordSuccess, code(0), ""), t0))
		}},
		{name: "SuccessRecord_SettlesSuccess", wantOK: true, wantOutcome: sdk.OutcomeSuccess, pod: func(t *testing.T) *pod {
			return podOf(attempt, corev1.PodFailed, taskTerminated(0, "Completed", rec(t, attempt, RecordSuccess, code(0), ""), t0))
		}},
		{name: "RescheduleRecord_SettlesReschedule", wantOK: true, wantOutcome: sdk.OutcomeReschedule, pod: func(t *testing.T) *pod {
			return podOf(attempt, corev1.PodSucceeded, taskTerminated(0, "Completed", rec(t, attempt, RecordReschedule, code(0), ""), t0))
		}},
		{name: "RecordOfAnotherEpoch_IsNoRecord", wantOK: true, wantOutcome: sdk.OutcomeFailed, wantReason: ReasonTaskFailed,
			wantMsg: "task_failed: pod failed", pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, taskTerminated(1, "Error", rec(t, other, RecordSuccess, code(0), ""), t0))
			}},
		{name: "SucceededWithoutRecord_SettlesSuccess", wantOK: true, wantOutcome: sdk.OutcomeSuccess, pod: func(t *testing.T) *pod {
			return podOf(attempt, corev1.PodSucceeded, taskTerminated(0, "Completed", "task's own words", t0))
		}},
		{name: "FailedRecord_TaskFailureWithItsWords", wantOK: true, wantOutcome: sdk.OutcomeFailed, wantReason: ReasonTaskFailed,
			wantMsg: "task_failed: exit status 3", pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, taskTerminated(3, "Error", rec(t, attempt, RecordFailed, code(3), "exit status 3"), t0))
			}},
		{name: "DeletedUnderTheTask_AgentStoppedRecordIsInfra", wantOK: true, wantOutcome: sdk.OutcomeInfra,
			wantReason: sdk.ReasonPodDisrupted, wantMsg: "pod_disrupted: pod deleted while its task ran", pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, deleting,
					taskTerminated(1, "Error", rec(t, attempt, RecordFailed, nil, "agent_stopped: the agent was stopped before the task finished"), t0))
			}},
		{name: "DeletedUnderTheTask_OOMKilledStaysTaskFailure", wantOK: true, wantOutcome: sdk.OutcomeFailed, wantReason: ReasonTaskFailed,
			pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, deleting,
					taskTerminated(137, "OOMKilled", rec(t, attempt, RecordFailed, nil, "agent_stopped: the agent was stopped before the task finished"), t0))
			}},
		{name: "DeletedAfterTheTaskFailedOnItsOwn_StaysTaskFailureInItsWords", wantOK: true, wantOutcome: sdk.OutcomeFailed,
			wantReason: ReasonTaskFailed, wantMsg: "task_failed: exit status 3", pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, deleting, taskTerminated(3, "Error", rec(t, attempt, RecordFailed, code(3), "exit status 3"), t0))
			}},
		// The runtime could not start the task container (the kubelet
		// killed while it started it): nothing of the task ran.
		{name: "NeverStarted_StartErrorIsInfra", wantOK: true, wantOutcome: sdk.OutcomeInfra,
			wantReason: sdk.ReasonPodDisrupted, wantMsg: "pod_disrupted: the task container never started (StartError, exit 128): failed to start", pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, taskTerminated(128, "StartError", "failed to start containerd task", t0))
			}},
		{name: "NeverStarted_ButARecordIsTheRecords", wantOK: true, wantOutcome: sdk.OutcomeSuccess, pod: func(t *testing.T) *pod {
			return podOf(attempt, corev1.PodFailed, taskTerminated(128, "StartError", rec(t, attempt, RecordSuccess, code(0), ""), t0))
		}},
		// An agent frozen or killed outright writes no record; its pod
		// deleted (grace 0 leaves no time to write one either), the
		// kubelet's kill ends the container after the deletion.
		{name: "KilledByItsDeletion_NoRecordIsInfra", wantOK: true, wantOutcome: sdk.OutcomeInfra,
			wantReason: sdk.ReasonPodDisrupted, wantMsg: "pod_disrupted: pod deleted while its task ran", pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, deleting, taskTerminated(137, "Error", "", t0.Add(21*time.Second)))
			}},
		{name: "KilledInTheSecondOfItsDeletion_NoRecordIsInfra", wantOK: true, wantOutcome: sdk.OutcomeInfra,
			wantReason: sdk.ReasonPodDisrupted, wantMsg: "pod_disrupted: pod deleted while its task ran", pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, deleting, taskTerminated(137, "Error", "", t0.Add(20*time.Second)))
			}},
		{name: "EndedBeforeItsDeletion_NoRecordStaysTaskFailure", wantOK: true, wantOutcome: sdk.OutcomeFailed,
			wantReason: ReasonTaskFailed, wantMsg: "task_failed: pod failed", pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, deleting, taskTerminated(137, "Error", "", t0.Add(19*time.Second)))
			}},
		// Read while its grace runs, the timestamp is the kill's due time:
		// a container the stop ended inside the grace ended after the
		// request, and the request is what counts.
		{name: "KilledInsideItsGrace_NoRecordIsInfra", wantOK: true, wantOutcome: sdk.OutcomeInfra,
			wantReason: sdk.ReasonPodDisrupted, wantMsg: "pod_disrupted: pod deleted while its task ran", pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, deletingInGrace, taskTerminated(143, "Error", "", t0.Add(25*time.Second)))
			}},
		{name: "EndedBeforeTheRequestOfADeletionInGrace_NoRecordStaysTaskFailure", wantOK: true, wantOutcome: sdk.OutcomeFailed,
			wantReason: ReasonTaskFailed, wantMsg: "task_failed: pod failed", pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, deletingInGrace, taskTerminated(1, "Error", "", t0.Add(19*time.Second)))
			}},
		// Read after the kubelet's last delete, the timestamp is that
		// delete's time and the grace 0: the request is gone from the
		// object. An end a few seconds before is the deletion's kill (a
		// replica that was cut off from the API server while the grace ran
		// sees only this state); an end long before is the task's own.
		{name: "KilledThenDeletedByTheKubelet_NoRecordIsInfra", wantOK: true, wantOutcome: sdk.OutcomeInfra,
			wantReason: sdk.ReasonPodDisrupted, wantMsg: "pod_disrupted: pod deleted while its task ran", pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, deletedByTheKubelet(t0.Add(24*time.Second)), taskTerminated(137, "Error", "", t0.Add(20*time.Second)))
			}},
		{name: "EndedLongBeforeADeletionWithNoGraceLeft_NoRecordStaysTaskFailure", wantOK: true, wantOutcome: sdk.OutcomeFailed,
			wantReason: ReasonTaskFailed, wantMsg: "task_failed: pod failed", pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, deletedByTheKubelet(t0.Add(20*time.Second).Add(finalDeleteSlack+time.Second)),
					taskTerminated(137, "Error", "", t0.Add(20*time.Second)))
			}},
		{name: "KilledByItsDeletion_OOMKilledStaysTaskFailure", wantOK: true, wantOutcome: sdk.OutcomeFailed,
			wantReason: ReasonTaskFailed, wantMsg: "task_failed: pod failed: task container exited 137 (OOMKilled)", pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, deleting, taskTerminated(137, "OOMKilled", "", t0.Add(21*time.Second)))
			}},
		{name: "NoRecordNoDeletion_Exit137StaysTaskFailure", wantOK: true, wantOutcome: sdk.OutcomeFailed,
			wantReason: ReasonTaskFailed, wantMsg: "task_failed: pod failed", pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, taskTerminated(137, "Error", "", t0.Add(21*time.Second)))
			}},
		{name: "AgentStoppedRecordWithoutADeletion_ThePodsEndGivesTheWords", wantOK: true, wantOutcome: sdk.OutcomeFailed,
			wantReason: ReasonTaskFailed, wantMsg: "task_failed: pod failed: DeadlineExceeded", pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, podReason("DeadlineExceeded", "Pod was active on the node longer than the specified deadline"),
					taskTerminated(1, "Error", rec(t, attempt, RecordFailed, nil, "agent_stopped: the agent was stopped before the task finished"), t0))
			}},
		{name: "AStoppedRecordWithAnExitCodeIsTheTasksOwn", wantOK: true, wantOutcome: sdk.OutcomeFailed,
			wantReason: ReasonTaskFailed, wantMsg: "task_failed: agent_stopped", pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, deleting, taskTerminated(1, "Error", rec(t, attempt, RecordFailed, code(1), "agent_stopped: forged by the task"), t0))
			}},
		{name: "ControlPlaneUnavailable_InfraMarkerWithReasonNoExitCode", wantOK: true, wantOutcome: sdk.OutcomeInfra,
			wantReason: sdk.ReasonControlPlaneUnavailable, wantMsg: "control_plane_unavailable: Unavailable: GetTaskSpec",
			pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, taskTerminated(1, "Error", rec(t, attempt, RecordInfra, nil, "Unavailable: GetTaskSpec"), t0))
			}},
		{name: "ControlPlaneUnavailable_MarkerWithExitCodeStaysTaskFailure", wantOK: true, wantOutcome: sdk.OutcomeFailed,
			wantReason: ReasonTaskFailed, pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, taskTerminated(1, "Error", rec(t, attempt, RecordInfra, code(1), "Unavailable"), t0))
			}},
		{name: "ControlPlaneUnavailable_MarkerWithoutReasonStaysTaskFailure", wantOK: true, wantOutcome: sdk.OutcomeFailed,
			wantReason: ReasonTaskFailed, pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, taskTerminated(1, "Error", rec(t, attempt, RecordInfra, nil, ""), t0))
			}},
		{name: "Disruption_ConditionIsInfra", wantOK: true, wantOutcome: sdk.OutcomeInfra, wantReason: sdk.ReasonPodDisrupted,
			wantMsg: "pod_disrupted: DisruptionTarget DeletionByTaintManager", pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, disrupted("DeletionByTaintManager"), taskTerminated(137, "Error", "", t0))
			}},
		{name: "Disruption_PodGCIsInfra", wantOK: true, wantOutcome: sdk.OutcomeInfra, wantReason: sdk.ReasonPodDisrupted,
			pod: func(t *testing.T) *pod { return podOf(attempt, corev1.PodFailed, disrupted("DeletionByPodGC")) }},
		{name: "Disruption_NodeShutdownReasonIsInfra", wantOK: true, wantOutcome: sdk.OutcomeInfra, wantReason: sdk.ReasonPodDisrupted,
			wantMsg: "pod_disrupted: NodeShutdown: Pod was terminated", pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, podReason("NodeShutdown", "Pod was terminated in response to imminent node shutdown."))
			}},
		{name: "Disruption_NodePressureEvictionIsInfra", wantOK: true, wantOutcome: sdk.OutcomeInfra, wantReason: sdk.ReasonPodDisrupted,
			wantMsg: "pod_disrupted: Evicted: The node was low on resource: memory.", pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, podReason("Evicted", "The node was low on resource: memory. "))
			}},
		{name: "Disruption_FailedRecordDoesNotWin", wantOK: true, wantOutcome: sdk.OutcomeInfra, wantReason: sdk.ReasonPodDisrupted,
			pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, disrupted("TerminationByKubelet"),
					taskTerminated(143, "Error", rec(t, attempt, RecordFailed, code(143), "terminated by SIGTERM"), t0))
			}},
		{name: "Disruption_SuccessRecordWins", wantOK: true, wantOutcome: sdk.OutcomeSuccess, pod: func(t *testing.T) *pod {
			return podOf(attempt, corev1.PodFailed, disrupted("TerminationByKubelet"),
				taskTerminated(0, "Completed", rec(t, attempt, RecordSuccess, code(0), ""), t0))
		}},
		{name: "Disruption_RescheduleRecordWins", wantOK: true, wantOutcome: sdk.OutcomeReschedule, pod: func(t *testing.T) *pod {
			return podOf(attempt, corev1.PodFailed, podReason("Shutdown", ""),
				taskTerminated(0, "Completed", rec(t, attempt, RecordReschedule, code(0), ""), t0))
		}},
		{name: "Disruption_OOMKilledStaysTaskFailure", wantOK: true, wantOutcome: sdk.OutcomeFailed, wantReason: ReasonOOMKilled,
			pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, disrupted("TerminationByKubelet"), taskTerminated(137, "OOMKilled", "", t0))
			}},
		{name: "Disruption_OwnEphemeralStorageEvictionStaysTaskFailure", wantOK: true, wantOutcome: sdk.OutcomeFailed,
			wantReason: ReasonOwnLimitEvicted,
			wantMsg:    `evicted_own_limit: Container task exceeded its local ephemeral storage limit "1Gi".`,
			pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, podReason("Evicted", `Container task exceeded its local ephemeral storage limit "1Gi". `))
			}},
		{name: "Disruption_EmptyDirSizeLimitEvictionStaysTaskFailure", wantOK: true, wantOutcome: sdk.OutcomeFailed,
			wantReason: ReasonOwnLimitEvicted, pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, podReason("Evicted", `Usage of EmptyDir volume "scratch" exceeds the limit "1Gi". `))
			}},
		{name: "Disruption_PodTotalEphemeralStorageEvictionStaysTaskFailure", wantOK: true, wantOutcome: sdk.OutcomeFailed,
			wantReason: ReasonOwnLimitEvicted, pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, podReason("Evicted", "Pod ephemeral local storage usage exceeds the total limit of containers 2Gi. "))
			}},
		{name: "DeadlineExceeded_IsTaskFailure", wantOK: true, wantOutcome: sdk.OutcomeFailed, wantReason: ReasonTaskFailed,
			wantMsg: "task_failed: pod failed: DeadlineExceeded", pod: func(t *testing.T) *pod {
				return podOf(attempt, corev1.PodFailed, podReason("DeadlineExceeded", "Pod was active on the node longer than the specified deadline"))
			}},
		{name: "PodWithoutAnnotation_RecordMatchedOnLabels", wantOK: true, wantOutcome: sdk.OutcomeSuccess, pod: func(t *testing.T) *pod {
			return podOf(attempt, corev1.PodFailed, withoutAnnotation(),
				taskTerminated(0, "Completed", rec(t, attempt, RecordSuccess, code(0), ""), t0))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, ok := judgeFinished(tt.pod(t))
			if ok != tt.wantOK {
				t.Fatalf("settled = %v, want %v (%+v)", ok, tt.wantOK, v)
			}
			if !ok {
				return
			}
			if v.outcome != tt.wantOutcome || (tt.wantReason != "" && v.reason != tt.wantReason) {
				t.Fatalf("got %s/%s (%s), want %s/%s", v.outcome, v.reason, v.message, tt.wantOutcome, tt.wantReason)
			}
			if !strings.HasPrefix(v.message, tt.wantMsg) {
				t.Fatalf("message %q, want prefix %q", v.message, tt.wantMsg)
			}
			if v.reason != "" && !strings.HasPrefix(v.message, v.reason+": ") {
				t.Fatalf("message %q does not start with its reason %q", v.message, v.reason)
			}
		})
	}
}

func TestJudgeMark(t *testing.T) {
	l := ladder.Defaults()
	now := t0
	mark := sdk.Candidate{Attempt: attempt, State: sdk.StateFailed, LastFailureKind: sdk.FailureInfra,
		FailureReason: sdk.LabelAgentLost, InfraMarkedAt: now.Add(-30 * time.Second)}
	late := mark
	late.InfraMarkedAt = now.Add(-l.InfraConfirmValve - time.Second)
	tests := []struct {
		name string
		c    sdk.Candidate
		pods func(t *testing.T) []*pod
		want markAction
	}{
		{name: "NoPodLeft_Confirms", c: mark, want: markConfirm, pods: func(*testing.T) []*pod { return nil }},
		{name: "TaskContainerTerminatedWithoutSuccess_Confirms", c: mark, want: markConfirm, pods: func(t *testing.T) []*pod {
			return []*pod{podOf(attempt, corev1.PodFailed, taskTerminated(137, "Error", rec(t, attempt, RecordFailed, code(137), "killed"), now))}
		}},
		{name: "ContainerStillRunning_Holds", c: mark, want: markHold, pods: func(*testing.T) []*pod {
			return []*pod{podOf(attempt, corev1.PodRunning, started(now.Add(-time.Minute)), taskRunning())}
		}},
		{name: "StoppedInPlaceReadsFailedWhileContainerRuns_Holds", c: mark, want: markHold, pods: func(*testing.T) []*pod {
			return []*pod{podOf(attempt, corev1.PodFailed, podReason("DeadlineExceeded", ""), taskRunning())}
		}},
		{name: "InsideTerminationGrace_Holds", c: mark, want: markHold, pods: func(*testing.T) []*pod {
			return []*pod{podOf(attempt, corev1.PodRunning, taskRunning(), func(p *corev1.Pod) {
				p.DeletionTimestamp = &metav1.Time{Time: now.Add(20 * time.Second)}
			})}
		}},
		{name: "PendingPodNoContainer_Holds", c: mark, want: markHold, pods: func(*testing.T) []*pod {
			return []*pod{podOf(attempt, corev1.PodPending)}
		}},
		{name: "SuccessRecordInsideValve_Overrides", c: mark, want: markOverride, pods: func(t *testing.T) []*pod {
			return []*pod{podOf(attempt, corev1.PodSucceeded, taskTerminated(0, "Completed", rec(t, attempt, RecordSuccess, code(0), ""), now))}
		}},
		{name: "SuccessRecordAfterValve_Ignored", c: late, want: markHold, pods: func(t *testing.T) []*pod {
			return []*pod{podOf(attempt, corev1.PodSucceeded, taskTerminated(0, "Completed", rec(t, attempt, RecordSuccess, code(0), ""), now))}
		}},
		{name: "SuccessRecordOfAnotherEpoch_Confirms", c: mark, want: markConfirm, pods: func(t *testing.T) []*pod {
			other := attempt
			other.Epoch = 7
			return []*pod{podOf(attempt, corev1.PodFailed, taskTerminated(0, "Completed", rec(t, other, RecordSuccess, code(0), ""), now))}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, detail := judgeMark(tt.c, tt.pods(t), now, l)
			if got != tt.want {
				t.Fatalf("got %d (%s), want %d", got, detail, tt.want)
			}
		})
	}
}

func TestJudgeTeardown(t *testing.T) {
	tests := []struct {
		name string
		pod  *pod
		want stopAction
	}{
		{"SucceededPod_Skipped", podOf(attempt, corev1.PodSucceeded, started(t0)), stopSkipTerminal},
		{"FailedPod_Skipped", podOf(attempt, corev1.PodFailed, started(t0)), stopSkipTerminal},
		{"StartedPod_StoppedInPlace", podOf(attempt, corev1.PodRunning, started(t0)), stopInPlace},
		{"StartedPendingPod_StoppedInPlace", podOf(attempt, corev1.PodPending, started(t0)), stopInPlace},
		{"NeverStartedPod_Deleted", podOf(attempt, corev1.PodPending), stopDelete},
		{"UnknownPhase_TornDown", podOf(attempt, corev1.PodUnknown, started(t0)), stopDelete},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, why := judgeTeardown(tt.pod); got != tt.want {
				t.Fatalf("got %d (%s), want %d", got, why, tt.want)
			}
		})
	}
}

func TestCollectible(t *testing.T) {
	done := podOf(attempt, corev1.PodSucceeded, taskTerminated(0, "Completed", "", t0))
	tests := []struct {
		name    string
		pod     *pod
		settled bool
		now     time.Time
		want    bool
	}{
		{"SettledOlderThanTenMinutes_Collected", done, true, t0.Add(CollectAfter), true},
		{"SettledYounger_Kept", done, true, t0.Add(CollectAfter - time.Second), false},
		{"Unsettled_Kept", done, false, t0.Add(time.Hour), false},
		{"UnknownPhase_NeverCollected", podOf(attempt, corev1.PodUnknown, taskTerminated(0, "Completed", "", t0)), true, t0.Add(time.Hour), false},
		{"RunningPod_NeverCollected", podOf(attempt, corev1.PodRunning, started(t0)), true, t0.Add(time.Hour), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := collectible(tt.pod, tt.settled, tt.now); got != tt.want {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// The SUCCESS record an override is made from: one on a pod with the exact
// task id wins over one on a pod that only its lossy label ties to the
// attempt (the board accepts that one only when the attempt recorded it).
func TestSuccessPodPrefersTheExactTaskID(t *testing.T) {
	ok := func(t *testing.T) func(*corev1.Pod) {
		return taskTerminated(0, "Completed", rec(t, attempt, RecordSuccess, code(0), ""), t0)
	}
	lossy := podOf(attempt, corev1.PodSucceeded, ok(t), withoutAnnotation(), func(p *corev1.Pod) { p.UID = "uid-lossy" })
	exact := podOf(attempt, corev1.PodSucceeded, ok(t), func(p *corev1.Pod) { p.UID = "uid-exact" })
	failed := podOf(attempt, corev1.PodFailed, taskTerminated(1, "Error", "", t0))
	if got := successPod([]*pod{lossy, exact}); got != exact {
		t.Fatalf("chose %v, want the exact pod", got.UID)
	}
	if got := successPod([]*pod{failed, lossy}); got != lossy {
		t.Fatalf("chose %v, want the lossy pod as the only record", got)
	}
	if got := successPod([]*pod{failed}); got != nil {
		t.Fatalf("chose %v from no SUCCESS record", got.UID)
	}
}

func TestJudgeWarmMark(t *testing.T) {
	mark := sdk.Candidate{Attempt: attempt, State: sdk.StateFailed, Executor: sdk.ExecutorWarm, LastFailureKind: sdk.FailureInfra,
		FailureReason: sdk.LabelAgentLost, InfraMarkedAt: t0.Add(-30 * time.Second), WarmWorker: "reaper-warm-a"}
	worker := func(phase corev1.PodPhase, opts ...func(*corev1.Pod)) map[string]*pod {
		p := podOf(attempt, phase, opts...)
		p.Name = "reaper-warm-a"
		return map[string]*pod{p.Name: p}
	}
	workerState := func(running bool) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			st := corev1.ContainerStatus{Name: "worker"}
			if running {
				st.State.Running = &corev1.ContainerStateRunning{}
			} else {
				st.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: 137, FinishedAt: metav1.Time{Time: t0}}
			}
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, st)
		}
	}
	unbound := mark
	unbound.WarmWorker = ""
	// claimed is the mark with its worker's last claim, made after off
	// past the mark, holding the attempt or not.
	claimed := func(off time.Duration, holds bool) sdk.Candidate {
		c := mark
		c.WarmClaimedAt, c.WarmClaimHolds = mark.InfraMarkedAt.Add(off), holds
		return c
	}
	alive := worker(corev1.PodRunning, workerState(true))
	tests := []struct {
		name    string
		c       sdk.Candidate
		workers map[string]*pod
		want    markAction
		signal  warmSignal
	}{
		{name: "AliveWorkerClaimedAfterTheMarkWithoutTheAttempt_Confirms", c: claimed(time.Second, false), workers: alive,
			want: markConfirm, signal: warmWorkerClaim},
		{name: "AliveWorkerClaimedAMillisecondAfterTheMarkWithoutTheAttempt_Confirms", c: claimed(time.Millisecond, false), workers: alive,
			want: markConfirm, signal: warmWorkerClaim},
		{name: "AliveWorkerClaimStillListsTheAttempt_Holds", c: claimed(time.Second, true), workers: alive, want: markHold},
		{name: "AliveWorkerClaimedAtTheMarkItself_Holds", c: claimed(0, false), workers: alive, want: markHold},
		{name: "AliveWorkerClaimedBeforeTheMark_Holds", c: claimed(-time.Second, false), workers: alive, want: markHold},
		{name: "AliveWorkerWithNoClaimThatSaysWhatItRuns_Holds", c: mark, workers: alive, want: markHold},
		{name: "WorkerInItsGraceClaimedWithoutTheAttempt_Confirms", c: claimed(time.Second, false), want: markConfirm,
			signal: warmWorkerClaim, workers: worker(corev1.PodRunning, workerState(true),
				func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: t0.Add(20 * time.Second)} })},
		{name: "UnboundAttemptWithAClaim_Holds", c: func() sdk.Candidate { c := claimed(time.Second, false); c.WarmWorker = ""; return c }(),
			workers: alive, want: markHold},
		{name: "WorkerGoneWhileItsClaimListedTheAttempt_Confirms", c: claimed(time.Second, true), workers: map[string]*pod{},
			want: markConfirm, signal: warmWorkerGone},
		{name: "WorkerGoneFromTheLiveList_Confirms", c: mark, workers: map[string]*pod{}, want: markConfirm, signal: warmWorkerGone},
		{name: "OnlyOtherWorkersInTheList_Confirms", c: mark, want: markConfirm, workers: func() map[string]*pod {
			w := worker(corev1.PodRunning, workerState(true))
			return map[string]*pod{"reaper-warm-b": w["reaper-warm-a"]}
		}(), signal: warmWorkerGone},
		{name: "WorkerContainerTerminated_Confirms", c: mark, workers: worker(corev1.PodFailed, workerState(false)), want: markConfirm,
			signal: warmWorkerTerminated},
		{name: "WorkerStillRunning_Holds", c: mark, workers: worker(corev1.PodRunning, workerState(true)), want: markHold},
		{name: "WorkerReadsFailedWhileItsContainerRuns_Holds", c: mark, workers: worker(corev1.PodFailed, workerState(true)), want: markHold},
		{name: "WorkerTerminatingInItsGrace_Holds", c: mark, want: markHold, workers: worker(corev1.PodRunning, workerState(true),
			func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: t0.Add(20 * time.Second)} })},
		{name: "WorkerReportsNoContainer_Holds", c: mark, workers: worker(corev1.PodFailed), want: markHold},
		{name: "BoundToNoWorker_Holds", c: unbound, workers: map[string]*pod{}, want: markHold},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, signal, detail := judgeWarmMark(tt.c, tt.workers)
			if got != tt.want || signal != tt.signal {
				t.Fatalf("got %d on %q (%s), want %d on %q", got, signal, detail, tt.want, tt.signal)
			}
			if got == markConfirm && signal == warmWorkerClaim &&
				(!strings.Contains(detail, tt.c.WarmWorker) || !strings.Contains(detail, tt.c.WarmClaimedAt.UTC().Format(time.RFC3339Nano))) {
				t.Fatalf("the detail %q names neither the worker nor its claim's time", detail)
			}
		})
	}
}

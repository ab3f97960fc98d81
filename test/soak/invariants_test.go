package soak

import (
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/sdk"
)

var t0 = time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)

func at(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }

func attempt(task string, try, epoch int32) sdk.Attempt {
	return sdk.Attempt{RunID: "r", TaskID: task, Try: try, Epoch: epoch}
}

func expect(t *testing.T, vs []Violation, n int, contains string) {
	t.Helper()
	if len(vs) != n {
		t.Fatalf("got %d violations, want %d: %v", len(vs), n, vs)
	}
	for _, v := range vs {
		if !strings.Contains(v.Evidence, contains) {
			t.Fatalf("evidence %q does not say %q", v.Evidence, contains)
		}
	}
}

func TestNeverTwoLiveExecutions(t *testing.T) {
	first := Execution{Attempt: attempt("a", 1, 0), AgentPID: 10, PGID: 11, Start: at(0), LastSeenAlive: at(5), Gone: true}
	t.Run("ReplacementAfterTheOrphanIsGone_Holds", func(t *testing.T) {
		next := Execution{Attempt: attempt("a", 1, 1), AgentPID: 20, PGID: 21, Start: at(6), End: at(8)}
		expect(t, CheckNeverTwoLiveExecutions(History{Executions: []Execution{next, first}}), 0, "")
	})
	t.Run("ReplacementWhileTheOrphanRuns_Violates", func(t *testing.T) {
		next := Execution{Attempt: attempt("a", 1, 1), AgentPID: 20, PGID: 21, Start: at(4), End: at(8)}
		expect(t, CheckNeverTwoLiveExecutions(History{Executions: []Execution{first, next}}), 1, "started at")
	})
	t.Run("AnEndLineLaterThanTheLastSight_Counts", func(t *testing.T) {
		ended := first
		ended.End = at(7)
		next := Execution{Attempt: attempt("a", 2, 0), Start: at(6)}
		expect(t, CheckNeverTwoLiveExecutions(History{Executions: []Execution{ended, next}}), 1, "")
	})
	t.Run("OtherTasksMayOverlap", func(t *testing.T) {
		other := Execution{Attempt: attempt("b", 1, 0), Start: at(1), LastSeenAlive: at(9)}
		expect(t, CheckNeverTwoLiveExecutions(History{Executions: []Execution{first, other}}), 0, "")
	})
}

func TestNoReapOfALiveAttempt(t *testing.T) {
	a := attempt("a", 1, 0)
	mark := Transition{At: at(10), From: a, To: a, OldState: sdk.StateRunning, NewState: sdk.StateFailed,
		FailureReason: sdk.LabelAgentLost, Term: 3}
	deadAgent := AgentLife{Attempt: a, PID: 10, Began: at(0), LastSeenAlive: at(2), Gone: true}
	deadGroup := Execution{Attempt: a, AgentPID: 10, PGID: 11, Start: at(0.5), LastSeenAlive: at(9), Gone: true}
	t.Run("AgentAndGroupGoneBeforeTheMark_Holds", func(t *testing.T) {
		h := History{Transitions: []Transition{mark}, Agents: []AgentLife{deadAgent}, Executions: []Execution{deadGroup}}
		expect(t, CheckNoReapOfALiveAttempt(h), 0, "")
	})
	t.Run("AgentSeenAliveAfterTheMark_Violates", func(t *testing.T) {
		alive := deadAgent
		alive.LastSeenAlive = at(11)
		h := History{Transitions: []Transition{mark}, Agents: []AgentLife{alive}}
		expect(t, CheckNoReapOfALiveAttempt(h), 1, "its agent 10 was alive")
	})
	t.Run("AgentJournalingAfterTheMark_Violates", func(t *testing.T) {
		exiting := deadAgent
		exiting.Exited = at(12)
		h := History{Transitions: []Transition{mark}, Agents: []AgentLife{exiting}}
		expect(t, CheckNoReapOfALiveAttempt(h), 1, "alive at")
	})
	t.Run("GroupAliveAfterTheMark_Violates", func(t *testing.T) {
		alive := deadGroup
		alive.LastSeenAlive = at(10.5)
		h := History{Transitions: []Transition{mark}, Executions: []Execution{alive}}
		expect(t, CheckNoReapOfALiveAttempt(h), 1, "task group 11 was alive")
	})
	t.Run("AnAgentThatBeganAfterTheMark_IsAnotherStory", func(t *testing.T) {
		late := AgentLife{Attempt: a, PID: 12, Began: at(10.2), LastSeenAlive: at(11)}
		h := History{Transitions: []Transition{mark}, Agents: []AgentLife{late}}
		expect(t, CheckNoReapOfALiveAttempt(h), 0, "")
	})
	t.Run("CredentialCeilingEndsLiveAttemptsByDesign", func(t *testing.T) {
		ceiling := mark
		ceiling.FailureReason = sdk.LabelCredentialCeiling
		alive := deadAgent
		alive.LastSeenAlive = at(11)
		h := History{Transitions: []Transition{ceiling}, Agents: []AgentLife{alive}}
		expect(t, CheckNoReapOfALiveAttempt(h), 0, "")
	})
	t.Run("ATaskToldShouldTerminate_Violates", func(t *testing.T) {
		e := Execution{Attempt: a, AgentPID: 10, PGID: 11, Start: at(0), End: at(4), EndReason: agent.ReasonTerminated}
		expect(t, CheckNoReapOfALiveAttempt(History{Executions: []Execution{e}}), 1, "should_terminate")
	})
	t.Run("ATaskKilledByANSignalOfNobodyKnown_Violates", func(t *testing.T) {
		e := Execution{Attempt: a, AgentPID: 10, PGID: 11, Start: at(0), End: at(4), EndReason: agent.ReasonSignal}
		expect(t, CheckNoReapOfALiveAttempt(History{Executions: []Execution{e}}), 1, "signal")
		f := Fault{Kind: FaultAgentGroupKill, Target: &a, KilledGroup: true}
		expect(t, CheckNoReapOfALiveAttempt(History{Executions: []Execution{e}, Faults: []Fault{f}}), 0, "")
	})
}

func TestNoDeposedLeaderWrite(t *testing.T) {
	a := attempt("a", 1, 0)
	terms := []Term{{Term: 3, Holder: "h/1", At: at(0)}, {Term: 4, Holder: "h/2", At: at(20)}}
	mark := Transition{At: at(10), From: a, To: a, OldState: sdk.StateRunning, NewState: sdk.StateFailed,
		FailureReason: sdk.LabelAgentLost, Term: 3}
	decided := Decision{ID: 7, At: at(10), Term: 3, Reaper: "agentlost", Label: sdk.LabelAgentLostOrphanStopped,
		Applied: true, Attempt: a}
	t.Run("MarkUnderTheCurrentTerm_Holds", func(t *testing.T) {
		h := History{Transitions: []Transition{mark}, Decisions: []Decision{decided}, Terms: terms}
		expect(t, CheckNoDeposedLeaderWrite(h), 0, "")
	})
	t.Run("MarkDecidedUnderAnOlderTerm_Violates", func(t *testing.T) {
		old := decided
		old.Term = 2
		h := History{Transitions: []Transition{mark}, Decisions: []Decision{old}, Terms: terms}
		expect(t, CheckNoDeposedLeaderWrite(h), 1, "decided")
	})
	t.Run("MarkAfterANewerTermBegan_Violates", func(t *testing.T) {
		late := mark
		late.At = at(21)
		h := History{Transitions: []Transition{late}, Decisions: []Decision{decided}, Terms: terms}
		expect(t, CheckNoDeposedLeaderWrite(h), 1, "term 4")
	})
	t.Run("OrphanRunReapUnderAnOlderTerm_Violates", func(t *testing.T) {
		reap := Decision{ID: 8, Term: 3, Reaper: "orphanrun", Label: sdk.LabelOrphanRun, Applied: true,
			Attempt: sdk.Attempt{RunID: "r"}}
		rc := RunChange{At: at(22), RunID: "r", OldState: sdk.RunRunning, NewState: sdk.RunFailed, Term: 4}
		h := History{RunChanges: []RunChange{rc}, Decisions: []Decision{reap}, Terms: terms}
		expect(t, CheckNoDeposedLeaderWrite(h), 1, "orphan reap")
	})
	t.Run("TheRunnersOwnFailuresAreNotMarks", func(t *testing.T) {
		done := Transition{At: at(21), From: a, To: a, OldState: sdk.StateRunning, NewState: sdk.StateFailed,
			FailureReason: "exit_code", Term: 3}
		expect(t, CheckNoDeposedLeaderWrite(History{Transitions: []Transition{done}, Terms: terms}), 0, "")
	})
}

func TestBoundedRecovery_UnsettledRunsAndAttemptsViolate(t *testing.T) {
	vs := Unsettled(map[string]string{"r1": sdk.RunSuccess, "r2": sdk.RunRunning}, []sdk.Attempt{attempt("a", 1, 0)}, at(60))
	if len(vs) != 2 || !strings.Contains(vs[0].Evidence, "run r2") || !strings.Contains(vs[1].Evidence, "r/a") {
		t.Fatalf("violations %v", vs)
	}
}

func TestMeasureRecovery(t *testing.T) {
	a := attempt("a", 1, 0)
	h := History{
		Faults: []Fault{{Kind: FaultAgentKill, At: at(1), Target: &a}, {Kind: FaultLeaderKill, At: at(30)}},
		Transitions: []Transition{
			{At: at(-2), From: a, OldState: sdk.StateNone, NewState: sdk.StateScheduled},
			{At: at(-1), From: a, OldState: sdk.StateScheduled, NewState: sdk.StateQueued},
			{At: at(0), From: a, OldState: sdk.StateQueued, NewState: sdk.StateRunning},
			{At: at(9), From: a, OldState: sdk.StateRunning, NewState: sdk.StateFailed, FailureReason: sdk.LabelAgentLost},
		},
		RunChanges: []RunChange{{At: at(15), RunID: "r", NewState: sdk.RunSuccess}},
		Terms:      []Term{{Term: 1, At: at(0)}, {Term: 2, At: at(34)}},
	}
	r := MeasureRecovery(h)
	if len(r.Settled) != 1 || r.Settled[0] != 8*time.Second || len(r.RunFinal) != 1 || r.RunFinal[0] != 14*time.Second ||
		len(r.Takeover) != 1 || r.Takeover[0] != 4*time.Second || r.Missed != 0 {
		t.Fatalf("recovery %+v", r)
	}
	// A kill that lands after the attempt reported is no recovery to time.
	late := h
	late.Faults = []Fault{{Kind: FaultAgentKill, At: at(10), Target: &a}}
	if r := MeasureRecovery(late); r.Missed != 1 || len(r.Settled) != 0 {
		t.Fatalf("recovery of a late fault %+v", r)
	}
}

func TestNoLivePodTornDown(t *testing.T) {
	a := attempt("a", 1, 0)
	running := Execution{Attempt: a, AgentPID: 10, PGID: 11, Start: at(0), LastSeenAlive: at(9), Gone: true}
	stop := PodStop{At: at(5), Attempt: a, Pod: "pod-a", How: "deadline lowered to 1s", Phase: "Running"}
	t.Run("TeardownAfterTheTaskEnded_Holds", func(t *testing.T) {
		late := stop
		late.At = at(10)
		expect(t, CheckNoLivePodTornDown(History{Executions: []Execution{running}, PodStops: []PodStop{late}}), 0, "")
	})
	t.Run("TeardownWhileTheTaskRuns_Violates", func(t *testing.T) {
		expect(t, CheckNoLivePodTornDown(History{Executions: []Execution{running}, PodStops: []PodStop{stop}}), 1,
			"while its task ran")
	})
	t.Run("AgentStoppedByAStopSeenLate_Violates", func(t *testing.T) {
		stopped := running
		stopped.LastSeenAlive, stopped.End, stopped.EndReason = at(4), at(4.5), agent.ReasonAgentStopped
		expect(t, CheckNoLivePodTornDown(History{Executions: []Execution{stopped}, PodStops: []PodStop{stop}}), 1,
			"agent_stopped")
	})
	t.Run("TheInjectorsOwnDeletion_Holds", func(t *testing.T) {
		f := Fault{Kind: "delete_pod", At: at(4.9), Target: &a, KilledGroup: true, ClusterStop: true}
		h := History{Executions: []Execution{running}, PodStops: []PodStop{stop}, Faults: []Fault{f}}
		expect(t, CheckNoLivePodTornDown(h), 0, "")
	})
	t.Run("ANodesPodsAreTheInjectors_Holds", func(t *testing.T) {
		f := Fault{Kind: "delete_node", At: at(4.9), KilledGroup: true, ClusterStop: true, Others: []sdk.Attempt{a}}
		h := History{Executions: []Execution{running}, PodStops: []PodStop{stop}, Faults: []Fault{f}}
		expect(t, CheckNoLivePodTornDown(h), 0, "")
	})
}

func TestNoRetrySpentOnAClusterStop(t *testing.T) {
	a := attempt("a", 1, 0)
	evict := Fault{Kind: "evict_pod", At: at(5), Target: &a, KilledGroup: true, ClusterStop: true}
	settle := func(kind, reason string) Transition {
		return Transition{At: at(6), From: a, To: a, OldState: sdk.StateRunning, NewState: sdk.StateFailed,
			FailureReason: reason, FailureKind: kind, Term: 2}
	}
	t.Run("EvictedTaskOnTheInfraRail_Holds", func(t *testing.T) {
		h := History{Faults: []Fault{evict}, Transitions: []Transition{settle(sdk.FailureInfra, sdk.LabelPodLost)}}
		expect(t, CheckNoRetrySpentOnAClusterStop(h), 0, "")
	})
	t.Run("EvictedTaskFailedAsATaskFailure_Violates", func(t *testing.T) {
		stopped := Execution{Attempt: a, Start: at(0), End: at(5.5), EndReason: agent.ReasonAgentStopped}
		h := History{Faults: []Fault{evict}, Executions: []Execution{stopped}, PodStops: []PodStop{{At: at(5.1), Attempt: a}},
			Transitions: []Transition{settle(sdk.FailureTask, agent.ReasonAgentStopped)}}
		expect(t, CheckNoRetrySpentOnAClusterStop(h), 1, "as a task failure (agent_stopped)")
	})
	t.Run("TaskThatFailedOnItsOwnBeforeTheStop_Holds", func(t *testing.T) {
		own := Execution{Attempt: a, Start: at(0), End: at(4.8), EndReason: agent.ReasonExitCode}
		h := History{Faults: []Fault{evict}, Executions: []Execution{own},
			Transitions: []Transition{settle(sdk.FailureTask, agent.ReasonExitCode)}}
		expect(t, CheckNoRetrySpentOnAClusterStop(h), 0, "")
	})
	t.Run("LostNodesPodNotYetDeleted_Holds", func(t *testing.T) {
		node := Fault{Kind: "delete_node", At: at(5), KilledGroup: true, ClusterStop: true, Others: []sdk.Attempt{a}}
		h := History{Faults: []Fault{node}, Transitions: []Transition{settle(sdk.FailureTask, agent.ReasonExitCode)}}
		expect(t, CheckNoRetrySpentOnAClusterStop(h), 0, "")
	})
	t.Run("TaskEndedOnItsOwnBeforeTheLostNodesPodWasDeleted_Holds", func(t *testing.T) {
		node := Fault{Kind: "delete_node", At: at(5), KilledGroup: true, ClusterStop: true, Others: []sdk.Attempt{a}}
		own := Execution{Attempt: a, Start: at(0), End: at(5.5), EndReason: agent.ReasonExitCode}
		gc := PodStop{At: at(40), Attempt: a, Pod: "pod-a", How: "deleted"}
		h := History{Faults: []Fault{node}, Executions: []Execution{own}, PodStops: []PodStop{gc},
			Transitions: []Transition{settle(sdk.FailureTask, agent.ReasonExitCode)}}
		expect(t, CheckNoRetrySpentOnAClusterStop(h), 0, "")
	})
	t.Run("TimeoutVerdictRacingTheEviction_Holds", func(t *testing.T) {
		own := Execution{Attempt: a, Start: at(2), End: at(5.2), EndReason: agent.ReasonExecutionTimeout}
		h := History{Faults: []Fault{evict}, Executions: []Execution{own},
			Transitions: []Transition{settle(sdk.FailureTask, agent.ReasonExecutionTimeout)}}
		expect(t, CheckNoRetrySpentOnAClusterStop(h), 0, "")
	})
	t.Run("AKillOfTheAgentIsNoClusterStop", func(t *testing.T) {
		kill := Fault{Kind: "kill_agent", At: at(5), Target: &a}
		h := History{Faults: []Fault{kill}, Transitions: []Transition{settle(sdk.FailureTask, "signal")}}
		expect(t, CheckNoRetrySpentOnAClusterStop(h), 0, "")
	})
}

// On kube the reapers judge an agent by its heartbeats landing, not by its
// process: a mark of a live agent is theirs to make once its heartbeats
// have stopped landing for agent_lost, and a violation while they land.
func TestNoReapOfALiveAttempt_KubeJudgesHeartbeatsLanding(t *testing.T) {
	a := attempt("a", 1, 0)
	mark := Transition{At: at(10), From: a, To: a, OldState: sdk.StateRunning, NewState: sdk.StateFailed,
		FailureReason: sdk.LabelAgentLost, FailureKind: sdk.FailureInfra, Term: 3}
	alive := AgentLife{Attempt: a, PID: 10, Began: at(0), LastSeenAlive: at(12)}
	t.Run("SilentForAgentLost_Holds", func(t *testing.T) {
		h := History{Transitions: []Transition{mark}, Agents: []AgentLife{alive}, AgentLost: 5 * time.Second,
			Heartbeats: map[sdk.Attempt][]time.Time{a: {at(1), at(2), at(4.5)}}}
		expect(t, CheckNoReapOfALiveAttempt(h), 0, "")
	})
	t.Run("HeartbeatLandedWithinAgentLost_Violates", func(t *testing.T) {
		h := History{Transitions: []Transition{mark}, Agents: []AgentLife{alive}, AgentLost: 5 * time.Second,
			Heartbeats: map[sdk.Attempt][]time.Time{a: {at(1), at(7)}}}
		expect(t, CheckNoReapOfALiveAttempt(h), 1, "its last heartbeat landed at")
	})
	t.Run("ToldToStopAfterTheMark_Holds", func(t *testing.T) {
		stopped := Execution{Attempt: a, AgentPID: 10, Start: at(0), End: at(13), EndReason: agent.ReasonTerminated}
		h := History{Transitions: []Transition{mark}, Executions: []Execution{stopped}, AgentLost: 5 * time.Second}
		expect(t, CheckNoReapOfALiveAttempt(h), 0, "")
	})
}

func TestNoLivePodTornDown_TeardownOfAMarkedAttemptIsJudgedByItsMark(t *testing.T) {
	a := attempt("a", 1, 0)
	running := Execution{Attempt: a, AgentPID: 10, PGID: 11, Start: at(0), LastSeenAlive: at(9), Gone: true}
	mark := Transition{At: at(4), From: a, To: a, OldState: sdk.StateRunning, NewState: sdk.StateFailed,
		FailureReason: sdk.LabelAgentLost, FailureKind: sdk.FailureInfra}
	stop := PodStop{At: at(5), Attempt: a, Pod: "pod-a", How: "deadline lowered to 1s", Phase: "Running"}
	h := History{Executions: []Execution{running}, Transitions: []Transition{mark}, PodStops: []PodStop{stop}}
	expect(t, CheckNoLivePodTornDown(h), 0, "")
}

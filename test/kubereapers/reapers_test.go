package kubereapers_test

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/plugins/agentlost"
	"github.com/dexaflow/reaper/plugins/dispatchlost"
	"github.com/dexaflow/reaper/plugins/orphanrun"
	"github.com/dexaflow/reaper/plugins/podlost"
	"github.com/dexaflow/reaper/plugins/warmworker"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/reap"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

func TestPodLost(t *testing.T) {
	t.Parallel()
	t.Run("PodDeletedUnderRunningAttempt_PodLostProvisional", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a, sibling := att("run-1", "load_a"), att("run-1", "load-a")
		e.running(a)
		e.running(sibling)
		p := e.pod(a, true)
		sp := e.pod(sibling, true) // shares a's task-id label
		e.remove(p, &a)
		e.clk.Advance(e.ladder.PodLostFloor + time.Second)
		ds := e.reap(podlost.New(nil), e.sub)
		d, ok := applied(ds, a, sdk.LabelPodLost)
		if !ok || labels(ds, sibling) != "" {
			t.Fatalf("decisions %+v", ds)
		}
		if d.Evidence[reap.EvTeardown] == "" {
			t.Fatalf("no teardown after the mark: %v", d.Evidence)
		}
		e.wantProvisional(a, sdk.LabelPodLost)
		e.wantState(sibling, sdk.StateRunning)
		if got := e.get(sp.Name); got == nil || got.Status.Phase != corev1.PodRunning || stoppedInPlace(got) {
			t.Fatalf("the sibling's pod was touched: %+v", got)
		}
	})
	t.Run("PodPresentPendingRunningOrFinished_Deferred", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		pending, running, done := att("run-1", "pending"), att("run-1", "running"), att("run-1", "done")
		for _, a := range []sdk.Attempt{pending, running, done} {
			e.running(a)
		}
		e.pod(pending, false)
		e.pod(running, true)
		dp := e.pod(done, true)
		e.playStatus(dp.Name, func(st *corev1.PodStatus) { st.Phase = corev1.PodSucceeded })
		e.waitPhase(dp.Name, corev1.PodSucceeded)
		e.clk.Advance(10 * time.Minute)
		ds := e.reap(podlost.New(nil), e.sub)
		if len(ds) != 0 {
			t.Fatalf("decisions about present pods: %+v", ds)
		}
		for _, a := range []sdk.Attempt{pending, running, done} {
			e.wantState(a, sdk.StateRunning)
		}
	})
	t.Run("PodReadForbidden_PodQueryErrorDeferred", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a := att("run-1", "t")
		e.running(a)
		e.clk.Advance(e.ladder.PodLostFloor + time.Second)
		// Carol has no Role in the namespace: every pod read is refused.
		ds := e.reap(podlost.New(nil), e.substrateAs(kubetest.Carol))
		if got := labels(ds, a); got != sdk.LabelPodLostPodQueryErr {
			t.Fatalf("decisions %q (%+v)", got, ds)
		}
		e.wantState(a, sdk.StateRunning)
	})
	t.Run("InsideFloor_NotJudged", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a := att("run-1", "t")
		e.running(a)
		e.clk.Advance(e.ladder.PodLostFloor)
		if ds := e.reap(podlost.New(nil), e.sub); len(ds) != 0 {
			t.Fatalf("decisions %+v", ds)
		}
		e.wantState(a, sdk.StateRunning)
	})
}

func TestDispatchLost(t *testing.T) {
	t.Parallel()
	t.Run("NoPod_DispatchLostProvisional", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a := att("run-1", "t")
		e.queued(a)
		e.clk.Advance(e.ladder.DispatchLost + time.Second)
		ds := e.reap(dispatchlost.New(nil), e.sub)
		if _, ok := applied(ds, a, sdk.LabelDispatchLost); !ok {
			t.Fatalf("decisions %+v", ds)
		}
		e.wantProvisional(a, sdk.LabelDispatchLost)
	})
	t.Run("PendingPodNearCredentialLapse_StartExpiredPodDeleted", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a := att("run-1", "t")
		e.queued(a)
		p := e.pod(a, false)
		e.clk.Advance(e.ladder.AttemptTokenTTL - 2*time.Minute)
		ds := e.reap(dispatchlost.New(nil), e.sub)
		if _, ok := applied(ds, a, sdk.LabelStartExpired); !ok {
			t.Fatalf("decisions %+v", ds)
		}
		e.wantProvisional(a, sdk.LabelStartExpired)
		e.waitFor("the Pending pod to be deleted", func() bool { return e.get(p.Name) == nil })
	})
	t.Run("PendingPodBeforeTheMargin_Deferred", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a := att("run-1", "t")
		e.queued(a)
		p := e.pod(a, false)
		e.clk.Advance(e.ladder.DispatchLost + time.Second)
		ds := e.reap(dispatchlost.New(nil), e.sub)
		if got := labels(ds, a); got != sdk.LabelDispatchLostPodAlive {
			t.Fatalf("decisions %q", got)
		}
		e.wantState(a, sdk.StateQueued)
		if e.get(p.Name) == nil {
			t.Fatal("the pod was deleted")
		}
	})
	t.Run("RunningPodNearCredentialLapse_Deferred", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a := att("run-1", "t")
		e.queued(a)
		p := e.pod(a, true)
		e.clk.Advance(e.ladder.AttemptTokenTTL - time.Minute)
		ds := e.reap(dispatchlost.New(nil), e.sub)
		if got := labels(ds, a); got != sdk.LabelDispatchLostPodAlive {
			t.Fatalf("decisions %q", got)
		}
		e.wantState(a, sdk.StateQueued)
		if got := e.get(p.Name); got == nil || stoppedInPlace(got) {
			t.Fatalf("the running pod was touched: %+v", got)
		}
	})
	t.Run("PodReadForbidden_PodQueryErrorDeferred", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a := att("run-1", "t")
		e.queued(a)
		e.clk.Advance(e.ladder.DispatchLost + time.Second)
		ds := e.reap(dispatchlost.New(nil), e.substrateAs(kubetest.Carol))
		if got := labels(ds, a); got != sdk.LabelDispatchLostPodQueryErr {
			t.Fatalf("decisions %q", got)
		}
		e.wantState(a, sdk.StateQueued)
	})
}

func TestAgentLost(t *testing.T) {
	t.Parallel()
	t.Run("SilentAttempt_AgentLostProvisionalThenPodStoppedInPlace", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a := att("run-1", "t")
		e.running(a)
		p := e.pod(a, true)
		e.clk.Advance(e.ladder.AgentLost + time.Second)
		ds := e.reap(agentlost.New(nil), e.sub)
		if _, ok := applied(ds, a, sdk.LabelAgentLost); !ok {
			t.Fatalf("decisions %+v", ds)
		}
		e.wantProvisional(a, sdk.LabelAgentLost)
		e.waitFor("the pod to be stopped in place", func() bool { return stoppedInPlace(e.get(p.Name)) })
	})
	t.Run("SilentAttemptPodGone_PositiveSignalNeverBraked", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		// More silent attempts than the brake's minimum, every pod gone:
		// each mark rests on a live read that found no pod.
		var as []sdk.Attempt
		for i := range 25 {
			a := att("run-1", "t"+string(rune('a'+i)))
			e.running(a)
			as = append(as, a)
		}
		e.clk.Advance(e.ladder.AgentLost + time.Second)
		ds := e.reap(agentlost.New(nil), e.sub)
		for _, a := range as {
			d, ok := applied(ds, a, sdk.LabelAgentLost)
			if !ok || d.Evidence[reap.EvSignal] != reap.SignalPositive {
				t.Fatalf("%s: decisions %q (%+v)", a, labels(ds, a), d.Evidence)
			}
		}
	})
}

func TestWarmWorkerLost(t *testing.T) {
	t.Parallel()
	t.Run("WarmPodDeleted_WarmWorkerLostNoPodTouched", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		kept, lost := att("run-1", "kept"), att("run-1", "lost")
		w0 := e.warmPod("warm-0")
		w1 := e.warmPod("warm-1")
		e.runningWarm(kept, w0.Name)
		e.runningWarm(lost, w1.Name)
		e.remove(w1, nil)
		e.clk.Advance(time.Second)
		ds := e.reap(warmworker.New(nil), e.sub)
		if _, ok := applied(ds, lost, sdk.LabelWarmWorkerLost); !ok || labels(ds, kept) != "" {
			t.Fatalf("decisions %+v", ds)
		}
		// Provisional: the sweep confirms it (the worker's pod is gone
		// from a live list), never the reaper.
		e.wantProvisional(lost, sdk.LabelWarmWorkerLost)
		e.wantState(kept, sdk.StateRunning)
		if got := e.get(w0.Name); got == nil || got.Status.Phase != corev1.PodRunning || stoppedInPlace(got) {
			t.Fatalf("the live worker was touched: %+v", got)
		}
	})
	t.Run("ListForbidden_ZeroMarks", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		a := att("run-1", "t")
		e.runningWarm(a, "warm-0") // no such pod: it would be lost
		e.clk.Advance(time.Second)
		ds := e.reap(warmworker.New(nil), e.substrateAs(kubetest.Carol))
		if len(ds) != 1 || ds[0].Label != sdk.LabelWarmWorkerListErr {
			t.Fatalf("decisions %+v", ds)
		}
		e.wantState(a, sdk.StateRunning)
	})
}

func TestOrphanRun(t *testing.T) {
	t.Parallel()
	t.Run("OrphanRun_EveryPodOfTheRunTornDown", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		ran, waiting, other := att("run-1", "ran"), att("run-1", "waiting"), att("run-2", "t")
		e.running(ran)
		e.running(waiting)
		e.running(other)
		rp := e.pod(ran, true)
		wp := e.pod(waiting, false)
		op := e.pod(other, true)
		// Both tasks of run-1 reported failed, yet their pods linger.
		for _, a := range []sdk.Attempt{ran, waiting} {
			if stop, err := e.w.Report(t.Context(), a, lifecycleFailed(), e.clk.Now()); err != nil || stop {
				t.Fatalf("report %s: %v %v", a, stop, err)
			}
		}
		e.clk.Advance(e.ladder.OrphanRun + time.Second)
		if stop, err := e.w.Heartbeat(t.Context(), other, e.clk.Now()); err != nil || stop {
			t.Fatalf("heartbeat: %v %v", stop, err)
		}
		ds := e.reap(orphanrun.New(nil), e.sub)
		if _, ok := applied(ds, sdk.Attempt{RunID: "run-1"}, sdk.LabelOrphanRun); !ok {
			t.Fatalf("decisions %+v", ds)
		}
		if labels(ds, sdk.Attempt{RunID: "run-2"}) != "" {
			t.Fatalf("run-2 judged: %+v", ds)
		}
		e.waitFor("the running pod to be stopped in place", func() bool { return stoppedInPlace(e.get(rp.Name)) })
		e.waitFor("the never-started pod to be deleted", func() bool { return e.get(wp.Name) == nil })
		if got := e.get(op.Name); got == nil || stoppedInPlace(got) {
			t.Fatalf("another run's pod was touched: %+v", got)
		}
	})
}

func lifecycleFailed() lifecycle.TerminalReport {
	return lifecycle.TerminalReport{State: sdk.StateFailed, Reason: "exit_code", Message: "exit_code: 1"}
}

// An API server that cannot be reached at all: every pod read fails, so
// podlost and dispatchlost defer and warmworker marks nothing.
func TestAPIServerUnreachable_EveryReaperDefers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	lost, queued, warm := att("run-1", "lost"), att("run-1", "queued"), att("run-1", "warm")
	e.running(lost)
	e.queued(queued)
	e.runningWarm(warm, "warm-0")
	blind := e.unreachableSubstrate()
	e.clk.Advance(e.ladder.DispatchLost + time.Second)
	for _, a := range []sdk.Attempt{lost, warm} {
		e.beat(a)
	}
	if ds := e.reap(podlost.New(nil), blind); labels(ds, lost) != sdk.LabelPodLostPodQueryErr {
		t.Fatalf("podlost: %+v", ds)
	}
	if ds := e.reap(dispatchlost.New(nil), blind); labels(ds, queued) != sdk.LabelDispatchLostPodQueryErr {
		t.Fatalf("dispatchlost: %+v", ds)
	}
	if ds := e.reap(warmworker.New(nil), blind); len(ds) != 1 || ds[0].Label != sdk.LabelWarmWorkerListErr {
		t.Fatalf("warmworker: %+v", ds)
	}
	e.wantState(lost, sdk.StateRunning)
	e.wantState(queued, sdk.StateQueued)
	e.wantState(warm, sdk.StateRunning)
}

package kube

// Node loss end to end: the real kube-controller-manager (Pod GC and
// taint-based eviction) stops the task pod, writes its DisruptionTarget
// condition and deletes it; the sweep then settles the attempt on the infra
// rail. The test writes no condition and holds no pod: Pod GC deletes the
// pod at once, and the sweep settles it from the tombstone the presence
// cache kept of its final state. KWOK plays no kubelet stopping an evicted
// pod: it deletes the pod as it is, Running, where a kubelet would first
// write the terminal phase; the taint case proves that such a deletion is
// left to the pod-lost reaper, and, with a finalizer standing for the
// kubelet's own hold on the object, that the terminal state it writes is
// settled as a disruption.

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/eventually"
)

// keepFinalizer holds a deleted task pod until the test lets it go: it
// stands for the kubelet, which keeps a pod it stops until it has written
// the terminal status.
const keepFinalizer = "reaper.test/keep"

// kept adds keepFinalizer to a pod, and removes it when the test ends (so
// that the namespace can go).
func (s *sweepEnv) kept(p *corev1.Pod) {
	p.Finalizers = append(p.Finalizers, keepFinalizer)
	s.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		patch := []byte(`{"metadata":{"finalizers":null}}`)
		_, err := s.cs.CoreV1().Pods(s.ns).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			s.t.Errorf("releasing pod %s: %v", p.Name, err)
		}
	})
}

// disruptedWith waits (within bound: the controllers' own periods) until
// the cache holds pod name with the DisruptionTarget reason the controller
// wrote, and returns the pod as the API server has it.
func (s *sweepEnv) disruptedWith(a sdk.Attempt, name, reason string, bound time.Duration) *corev1.Pod {
	s.t.Helper()
	var got *corev1.Pod
	// The controller's own progress, polled: not a threshold of ours.
	if eventually.Until(bound, func() bool {
		got = s.get(name)
		if got == nil {
			return false
		}
		disrupted, _ := reduce(got).disruptionTarget()
		return disrupted == reason
	}, eventually.Every(controllerPoll)) {
		return got
	}
	node, err := s.cs.CoreV1().Nodes().Get(context.Background(), s.node, metav1.GetOptions{})
	if err != nil {
		s.t.Fatalf("pod %s was not disrupted by %s within %s (its node: %v)", name, reason, bound, err)
	}
	var phase corev1.PodPhase
	if got != nil {
		phase = got.Status.Phase
	}
	s.t.Fatalf("pod %s (%s) was not disrupted by %s within %s; its node's annotations %v, taints %+v, conditions %+v",
		name, phase, reason, bound, node.Annotations, node.Spec.Taints, node.Status.Conditions)
	return got
}

// settledDisrupted sweeps and checks the decision, the exact row and the
// attempt log of an attempt settled as pod_disrupted by reason from pod.
func (s *sweepEnv) settledDisrupted(a sdk.Attempt, pod, reason string) {
	s.t.Helper()
	res := s.sweep(time.Now())
	if len(res.Decisions) != 1 || res.Decisions[0].Label != sdk.LabelReconcileSettled || !res.Decisions[0].Applied ||
		res.Decisions[0].Attempt != a || res.Decisions[0].Evidence["rule"] != "DisruptedPodIsInfra" ||
		res.Decisions[0].Evidence["pod"] != pod {
		s.t.Fatalf("decisions %+v, want one applied %s of %s by DisruptedPodIsInfra", res.Decisions, sdk.LabelReconcileSettled, pod)
	}
	ti := s.row(a)
	msg := "pod_disrupted: DisruptionTarget " + reason
	wantRow(s.t.(*testing.T), ti, sdk.StateFailed, sdk.FailureInfra, msg, true)
	if ti.ErrorMessage != msg || ti.FailureReason != sdk.ReasonPodDisrupted || ti.EndedAt.IsZero() {
		s.t.Fatalf("row error_message %q, failure_reason %q, ended %v; want %q, %s, an end",
			ti.ErrorMessage, ti.FailureReason, ti.EndedAt, msg, sdk.ReasonPodDisrupted)
	}
	// The settlement's words are the row's; the attempt log holds only
	// overrides of a mark, and there was none.
	if log := s.log(a); len(log) != 0 {
		s.t.Fatalf("attempt log %q, want none", log)
	}
}

func TestSweepNodeLoss(t *testing.T) {
	t.Parallel()
	if !cluster.Load().HasControllerManager() {
		t.Fatal("the cluster runs without kube-controller-manager")
	}
	a := sdk.Attempt{RunID: "run-1", TaskID: "load_a", Try: 1, Epoch: 1}

	// The node object is deleted: Pod GC marks the orphaned pod Failed with
	// DisruptionTarget DeletionByPodGC and deletes it, after its quarantine
	// of 40s (checked every 20s): about a minute.
	t.Run("NodeDeletedPodGCIsInfraConfirmedAtOnce_FromTheTombstone", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(a)
		p := s.running(a)
		if err := s.cs.CoreV1().Nodes().Delete(context.Background(), s.node, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("deleting the node: %v", err)
		}
		got := s.tombstoned(p.Name, 3*time.Minute)
		if disrupted, _ := got.disruptionTarget(); got.phase != corev1.PodFailed || disrupted != "DeletionByPodGC" {
			t.Fatalf("Pod GC's last state of the pod: %s, DisruptionTarget %q; want Failed, DeletionByPodGC", got.phase, disrupted)
		}
		// Gone is gone: the tombstone is no presence.
		if l := liveness(t, s.sub, false, a)[0]; l.State != sdk.Dead {
			t.Fatalf("liveness of the deleted pod's attempt %+v, want dead", l)
		}
		s.settledDisrupted(a, p.Name, "DeletionByPodGC")
		// Offered once: the next sweep has nothing of it.
		if n := s.tombs().len(); n != 0 {
			t.Fatalf("%d tombstones after the sweep, want 0", n)
		}
		if res := s.sweep(time.Now()); len(res.Decisions) != 0 {
			t.Fatalf("second sweep decisions %+v, want none", res.Decisions)
		}
	})

	// The same node loss with the outcome record finalizer the kube runner
	// puts on its pods: Pod GC's deletion leaves the object, Failed with
	// its condition, the sweep settles it as a present pod (no tombstone
	// needed), releases it, and it goes.
	t.Run("NodeDeletedPodGCHeldByTheFinalizerIsSettledPresentThenReleased", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(a)
		p := s.running(a, recordHeld)
		if err := s.cs.CoreV1().Nodes().Delete(context.Background(), s.node, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("deleting the node: %v", err)
		}
		got := s.disruptedWith(a, p.Name, "DeletionByPodGC", 3*time.Minute)
		eventually.True(s.t, time.Minute, "Pod GC's deletion held by the finalizer", func() bool {
			got = s.get(p.Name)
			return got != nil && got.DeletionTimestamp != nil && got.Status.Phase == corev1.PodFailed
		}, eventually.Every(controllerPoll))
		s.cachedDeleting(a, p.Name)
		s.settledDisrupted(a, p.Name, "DeletionByPodGC")
		s.released(p.Name)
		if n := s.tombs().len(); n != 0 {
			t.Fatalf("%d tombstones, want 0: the pod was settled present", n)
		}
	})

	// A NoExecute taint, and KWOK deleting the evicted pod as it is
	// (Running): nothing says how it ended, so the sweep settles nothing and
	// the attempt, with no pod object left, is the pod-lost reaper's.
	t.Run("DeletedWhileNotTerminalIsLeftToPodLost", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(a)
		p := s.running(a)
		patch := []byte(`{"spec":{"taints":[{"key":"reaper.test/gone","effect":"NoExecute"}]}}`)
		if _, err := s.cs.CoreV1().Nodes().Patch(context.Background(), s.node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatalf("tainting the node: %v", err)
		}
		eventually.True(s.t, time.Minute, "the pod's deletion seen by the cache", func() bool {
			return s.get(p.Name) == nil && s.tombs().droppedBy(dropNotTerminal) == 1
		}, eventually.Every(controllerPoll))
		if res := s.sweep(time.Now()); len(res.Decisions) != 0 {
			t.Fatalf("sweep decisions %+v, want none", res.Decisions)
		}
		if ti := s.row(a); ti.State != sdk.StateRunning {
			t.Fatalf("row %s, want it left running for the pod-lost reaper", ti.State)
		}
		if l := liveness(t, s.sub, false, a)[0]; l.State != sdk.Dead {
			t.Fatalf("liveness %+v, want dead (no pod object at all)", l)
		}
	})

	// A NoExecute taint on the node: the taint manager writes DisruptionTarget
	// DeletionByTaintManager and deletes the pod at once; the finalizer
	// plays the kubelet's hold until its terminal status is written.
	t.Run("NoExecuteTaintEvictionIsInfraConfirmedAtOnce", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(a)
		p := s.running(a, s.kept)
		patch := []byte(`{"spec":{"taints":[{"key":"reaper.test/gone","effect":"NoExecute"}]}}`)
		if _, err := s.cs.CoreV1().Nodes().Patch(context.Background(), s.node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatalf("tainting the node: %v", err)
		}
		s.disruptedWith(a, p.Name, "DeletionByTaintManager", time.Minute)
		s.killedByKubelet(a, p.Name)
		s.settledDisrupted(a, p.Name, "DeletionByTaintManager")
	})

	// Not played: a node that stops heartbeating (the node lifecycle
	// controller then taints it unreachable:NoExecute and the taint manager
	// evicts as above). KWOK keeps heartbeating a node it has taken up even
	// once its annotation is removed, and the one KWOK serves every test of
	// the binary, so it cannot be stopped for one node.
}

// killedByKubelet plays what a kubelet writes once it has stopped an
// evicted pod (KWOK deletes the pod but writes no terminal status): phase
// Failed, the task container terminated by SIGTERM. The DisruptionTarget
// condition stays the controller's.
func (s *sweepEnv) killedByKubelet(a sdk.Attempt, name string) {
	s.t.Helper()
	s.playStatus(name, finish(corev1.PodFailed, 143, "Error", ""))
	s.cachedPhase(s.sub, a, name, corev1.PodFailed)
}

// tombs is the tombstone store of the env's substrate.
func (s *sweepEnv) tombs() *tombstones {
	s.t.Helper()
	r, err := s.sub.current()
	if err != nil {
		s.t.Fatal(err)
	}
	return r.presence.tombs
}

// tombstoned waits (within bound: the controllers' own periods) until pod
// name is gone from the API server and the cache holds its tombstone, and
// returns the tombstone.
func (s *sweepEnv) tombstoned(name string, bound time.Duration) *pod {
	s.t.Helper()
	var got *pod
	eventually.True(s.t, bound, "pod "+name+" deleted and tombstoned", func() bool {
		if s.get(name) != nil {
			return false
		}
		tb := s.tombs()
		tb.mu.Lock()
		defer tb.mu.Unlock()
		for _, t := range tb.byUID {
			if t.pod.Name == name {
				got = t.pod
			}
		}
		return got != nil
	}, eventually.Every(controllerPoll))
	return got
}

// controllerPoll is the pace of a wait on the controllers' own progress
// (their periods, not a threshold of ours).
const controllerPoll = 100 * time.Millisecond

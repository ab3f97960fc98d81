package kube

// Node loss end to end: the real kube-controller-manager (Pod GC and
// taint-based eviction) stops the task pod and writes its DisruptionTarget
// condition; the sweep then settles the attempt on the infra rail. The test
// writes no condition. Two things are the test's, and say so where they
// happen:
//   - KWOK plays no kubelet stopping an evicted pod: a kubelet would kill
//     its containers and write the terminal phase and their terminated
//     states. After a taint eviction the test writes that status.
//   - The task pods carry a finalizer of the test's own, so that a pod the
//     controller deleted is still there for the sweep to read. Pod GC
//     deletes the pods it stops at once, with no grace, and the taint
//     manager once the kubelet is done; without something that holds the
//     object, the pod may be gone before a sweep runs, and the attempt is
//     then the pod-lost reaper's.

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dexaflow/reaper/sdk"
)

// keepFinalizer holds a deleted task pod until the test lets it go.
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
	deadline := time.Now().Add(bound)
	for got = s.get(name); got == nil || reduce(got).disrupted != reason; got = s.get(name) {
		if time.Now().After(deadline) {
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
		}
		time.Sleep(100 * time.Millisecond) // polling the controller's progress, not a threshold of ours
	}
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
	t.Run("NodeDeletedPodGCIsInfraConfirmedAtOnce", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(a)
		p := s.running(a, s.kept)
		if err := s.cs.CoreV1().Nodes().Delete(context.Background(), s.node, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("deleting the node: %v", err)
		}
		got := s.disruptedWith(a, p.Name, "DeletionByPodGC", 3*time.Minute)
		if got.Status.Phase != corev1.PodFailed {
			t.Fatalf("Pod GC left the pod %s, want Failed", got.Status.Phase)
		}
		s.cachedPhase(s.sub, a, p.Name, corev1.PodFailed)
		s.settledDisrupted(a, p.Name, "DeletionByPodGC")
	})

	// A NoExecute taint on the node: the taint manager writes DisruptionTarget
	// DeletionByTaintManager and deletes the pod at once.
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

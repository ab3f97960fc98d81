package kubereapers_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/dexaflow/reaper/plugins/podlost"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/reap"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// silentNode creates a node that no KWOK manages, Ready with a fresh
// heartbeat, and deletes it when the test ends. Nothing renews it, so the
// real node lifecycle controller turns it Unknown once its grace period
// (kube-controller-manager's --node-monitor-grace-period) has passed: a
// machine that went off.
func (e *env) silentNode() string {
	e.t.Helper()
	ctx := context.Background()
	name := "silent-" + e.ns
	n, err := e.cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels: map[string]string{"kubernetes.io/hostname": name}}}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("creating node %s: %v", name, err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := e.cs.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			e.t.Errorf("deleting node %s: %v", name, err)
		}
	})
	// The node lifecycle controller writes the new node too (its taints).
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := e.cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: now, LastTransitionTime: now}}
		_, err = e.cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatalf("writing node %s Ready: %v", name, err)
	}
	return name
}

// readyCondition is node name's Ready condition as the API server has it.
func (e *env) readyCondition(name string) corev1.NodeCondition {
	e.t.Helper()
	n, err := e.cs.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c
		}
	}
	return corev1.NodeCondition{}
}

// waitWithin polls cond, a state a controller reaches on its own, for at
// most bound.
func (e *env) waitWithin(bound time.Duration, what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out after %s waiting for %s", bound, what)
		}
		time.Sleep(200 * time.Millisecond) // polling the controller, not a threshold of ours
	}
}

// A pod on a node that stops heartbeating: the real node lifecycle
// controller marks the node Unknown and the pod not Ready; the attempt,
// which never heartbeated, is deferred as pod_lost_node_unreachable once
// the node has been unreachable past the threshold (on the fake clock),
// naming the node and since when, and never failed; once the pod object is
// gone (deleted with grace 0, as the out-of-service taint leads to), the
// pod-lost reaper marks it pod_lost on its own signal.
func TestPodLostNodeUnreachable(t *testing.T) {
	t.Parallel()
	if !kubetest.Current(t).HasControllerManager() {
		t.Fatal("the cluster runs without kube-controller-manager: no node lifecycle controller")
	}
	e := newEnv(t)
	ctx := context.Background()
	node := e.silentNode()
	a := att("run-1", "extract")
	e.queued(a)
	if stop, err := e.w.Running(ctx, a, e.clk.Now()); err != nil || stop { // running, never heartbeated
		t.Fatalf("driving %s to running: %v, %v", a, stop, err)
	}
	l, ann := kube.AttemptLabels(a)
	p, err := e.cs.CoreV1().Pods(e.ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "task-silent", Labels: l, Annotations: ann},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, NodeName: node,
			Containers: []corev1.Container{{Name: kube.TaskContainer, Image: "agent"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// What the node's kubelet wrote before the machine went off.
	e.playStatus(p.Name, func(st *corev1.PodStatus) {
		now := metav1.Now()
		st.Phase, st.StartTime = corev1.PodRunning, &now
		st.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}
		st.ContainerStatuses = []corev1.ContainerStatus{{Name: kube.TaskContainer, Ready: true,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}
	})

	// The controller's own grace (50 s by default) and period (5 s).
	e.waitWithin(3*time.Minute, "the node lifecycle controller to mark node "+node+" Unknown", func() bool {
		return e.readyCondition(node).Status == corev1.ConditionUnknown
	})
	since := e.readyCondition(node).LastTransitionTime.Time
	t.Logf("the node lifecycle controller marked %s Unknown %s after it was made", node,
		since.Sub(e.clk.Now()).Round(time.Second))
	e.waitWithin(time.Minute, "the controller to mark the pod not Ready and the cache to see it", func() bool {
		got, err := e.sub.Liveness(ctx, sdk.LivenessRequest{Attempts: []sdk.Attempt{a}, Now: time.Now()})
		return err == nil && got[0].Node == node
	})

	t.Run("UnderTheThreshold_PodPresentDeferred", func(t *testing.T) {
		// A minute after the node went Unknown (the attempt is then past
		// the floor: it entered running before the node was made).
		e.clk.Advance(since.Add(time.Minute).Sub(e.clk.Now()))
		ds := e.reap(podlost.New(nil), e.sub)
		if got := labels(ds, a); got != sdk.LabelPodLostPodPresent {
			t.Fatalf("decisions %q (%+v), want %s", got, ds, sdk.LabelPodLostPodPresent)
		}
		e.wantState(a, sdk.StateRunning)
	})
	t.Run("PastTheThreshold_NodeUnreachableDeferredNeverFailed", func(t *testing.T) {
		// Past the threshold, and past full_walk_every so that the pass
		// walks every running attempt again.
		e.clk.Advance(podlost.FullWalkEveryDefault + time.Minute)
		ds := e.reap(podlost.New(nil), e.sub)
		if got := labels(ds, a); got != sdk.LabelPodLostNodeUnreachable {
			t.Fatalf("decisions %q (%+v), want %s", got, ds, sdk.LabelPodLostNodeUnreachable)
		}
		d := ds[0]
		if d.Applied || d.Evidence[reap.EvNode] != node ||
			d.Evidence[reap.EvNodeUnreachableSince] != since.UTC().Format(time.RFC3339) ||
			!strings.Contains(d.Detail, node) || !strings.Contains(d.Detail, "Ready Unknown") {
			t.Fatalf("decision %+v; want node %s, since %s", d, node, since.UTC().Format(time.RFC3339))
		}
		e.wantState(a, sdk.StateRunning)
		if got := e.get(p.Name); got == nil || got.DeletionTimestamp != nil || stoppedInPlace(got) {
			t.Fatalf("the pod was touched: %+v", got)
		}
	})
	t.Run("TerminatingWithNoKubeletToConfirm_StillNodeUnreachable", func(t *testing.T) {
		// An eviction (the taint manager's, after the pods' toleration) or
		// anyone's graceful delete: no kubelet confirms it, so the pod stays.
		if err := e.cs.CoreV1().Pods(e.ns).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitFor("the cache to see the pod Terminating", func() bool {
			got, err := e.sub.Liveness(ctx, sdk.LivenessRequest{Attempts: []sdk.Attempt{a}, Now: time.Now()})
			return err == nil && got[0].Node == node && strings.Contains(got[0].Detail, "Terminating")
		})
		e.clk.Advance(podlost.FullWalkEveryDefault + time.Minute)
		ds := e.reap(podlost.New(nil), e.sub)
		if got := labels(ds, a); got != sdk.LabelPodLostNodeUnreachable || !strings.Contains(ds[0].Detail, "Terminating") {
			t.Fatalf("decisions %q (%+v), want %s of a Terminating pod", got, ds, sdk.LabelPodLostNodeUnreachable)
		}
		e.wantState(a, sdk.StateRunning)
		if e.get(p.Name) == nil {
			t.Fatal("the Terminating pod went: something confirmed its deletion")
		}
	})
	t.Run("PodObjectGone_PodLost", func(t *testing.T) {
		e.remove(p, &a)
		e.clk.Advance(e.ladder.MaintenanceInterval)
		ds := e.reap(podlost.New(nil), e.sub)
		if _, ok := applied(ds, a, sdk.LabelPodLost); !ok {
			t.Fatalf("decisions %q (%+v), want %s applied", labels(ds, a), ds, sdk.LabelPodLost)
		}
		e.wantProvisional(a, sdk.LabelPodLost)
	})
}

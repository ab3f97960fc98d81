package kuberunner_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/kuberunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/testkit/eventually"
)

// TestTheValveHoldsAMarkWhosePodMayStillRunOnANodeNotReady: past the infra
// confirmation valve, an unconfirmed mark whose pod is bound to a node
// that is not Ready, not finished and not terminated is held
// (infra_confirm_valve_held, noted once a minute), never re-placed: a
// re-place would run the task beside an execution that resumes with the
// node. Each thing that says nothing runs there any more lets the valve
// open as before; so does anything the runner cannot read.
func TestTheValveHoldsAMarkWhosePodMayStillRunOnANodeNotReady(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	// Each case's node is made here, no KWOK behind it: its status is
	// what the test writes (a kubelet that stopped reporting).
	node := func(t *testing.T, name string, ready corev1.ConditionStatus, taints ...corev1.Taint) {
		t.Helper()
		n, err := e.cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.NodeSpec{Taints: taints}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.cs.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
		setReady(t, e, n, ready)
	}
	var r0 *kuberunner.Runner // the case's runner, for its then
	for name, tc := range map[string]struct {
		ready  corev1.ConditionStatus
		taints []corev1.Taint
		// then changes the world after the first cycle past the valve;
		// held says whether the mark is held before it.
		then func(t *testing.T, p *corev1.Pod, nodeName string)
		held bool
	}{
		"NodeUnknown_HeldUntilTheNodeIsBackAndHadTimeToEndThePod": {ready: corev1.ConditionUnknown, held: true,
			then: func(t *testing.T, _ *corev1.Pod, n string) {
				got, err := e.cs.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				setReady(t, e, got, corev1.ConditionTrue)
				// Just back: its kubelet is ending the stopped pod, so the
				// mark is still held, until the pods' grace and two
				// maintenance intervals have passed.
				e.clk.Advance(time.Second)
				res := cycle(t, r0, e.clk.Now())
				if res.Replaced != 0 || res.Waiting != 1 {
					t.Fatalf("a second after the node is back: replaced %d, waiting %d, decisions %v: want still held", res.Replaced, res.Waiting, labels(res))
				}
				l := ladder.Defaults()
				e.clk.Advance(l.TaskTerminationGrace + 2*l.MaintenanceInterval)
			}},
		"NodeNotReady_HeldUntilTheNodeIsDeleted": {ready: corev1.ConditionFalse, held: true,
			then: func(t *testing.T, _ *corev1.Pod, n string) {
				if err := e.cs.CoreV1().Nodes().Delete(ctx, n, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}},
		"HeldUntilTheOutOfServiceTaint": {ready: corev1.ConditionUnknown, held: true,
			then: func(t *testing.T, _ *corev1.Pod, n string) {
				got, err := e.cs.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				got.Spec.Taints = append(got.Spec.Taints, corev1.Taint{Key: "node.kubernetes.io/out-of-service", Effect: corev1.TaintEffectNoExecute})
				if _, err := e.cs.CoreV1().Nodes().Update(ctx, got, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}},
		"HeldUntilThePodIsForceDeleted": {ready: corev1.ConditionUnknown, held: true,
			then: func(t *testing.T, p *corev1.Pod, _ string) {
				// The outcome record finalizer keeps the object: grace 0
				// is the operator's word that it is gone.
				if err := e.cs.CoreV1().Pods(e.ns).Delete(ctx, p.Name, *metav1.NewDeleteOptions(0)); err != nil {
					t.Fatal(err)
				}
			}},
		"HeldUntilItsTaskContainerTerminated": {ready: corev1.ConditionUnknown, held: true,
			then: func(t *testing.T, p *corev1.Pod, _ string) {
				got, err := e.cs.CoreV1().Pods(e.ns).Get(ctx, p.Name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				got.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "task", State: corev1.ContainerState{
					Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error"}}}}
				if _, err := e.cs.CoreV1().Pods(e.ns).UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}},
		"NodeReady_TheValveOpensAsBefore":     {ready: corev1.ConditionTrue},
		"OutOfServiceAlready_TheValveOpens":   {ready: corev1.ConditionUnknown, taints: []corev1.Taint{{Key: "node.kubernetes.io/out-of-service", Effect: corev1.TaintEffectNoExecute}}},
		"NodeWithoutAReadyCondition_NoSignal": {ready: ""},
	} {
		t.Run(name, func(t *testing.T) {
			run := fmt.Sprintf("valve-%d", time.Now().UnixNano())
			nodeName := "unreachable-" + run
			node(t, nodeName, tc.ready, tc.taints...)
			e.mkRun(t, run, lifecycle.NewTask{TaskID: "task", Retries: 1})
			r := e.runner(t, e.config(e.cs))
			r0 = r
			if res := cycle(t, r, e.clk.Now()); res.Dispatched != 1 {
				t.Fatalf("dispatched %d", res.Dispatched)
			}
			a := e.ti(t, run, "task").Attempt
			p := e.pods(t)[a]
			if err := e.cs.CoreV1().Pods(e.ns).Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: p.Name},
				Target: corev1.ObjectReference{Kind: "Node", Name: nodeName}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if sd, err := e.w.Running(ctx, a, e.clk.Now()); err != nil || sd {
				t.Fatal(sd, err)
			}
			if ok, err := e.w.Fail(ctx, a, []string{sdk.StateRunning},
				lifecycle.Failure{Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost}, e.clk.Now()); err != nil || !ok {
				t.Fatal(ok, err)
			}
			e.clk.Advance(ladder.Defaults().InfraConfirmValve)
			res := cycle(t, r, e.clk.Now())
			if !tc.held {
				if res.Replaced != 1 || !slices.Equal(labels(res), []string{sdk.LabelInfraConfirmValveOpen, sdk.LabelInfraReplace}) {
					t.Fatalf("replaced %d, decisions %v: want the valve open, then a re-place", res.Replaced, labels(res))
				}
				return
			}
			if res.Replaced != 0 || res.Waiting != 1 || !slices.Equal(labels(res), []string{sdk.LabelInfraConfirmValveHeld}) {
				t.Fatalf("replaced %d, waiting %d, decisions %v: want the mark held", res.Replaced, res.Waiting, labels(res))
			}
			d := res.Decisions[0]
			if d.Applied || d.Attempt != a || d.Evidence["node"] != nodeName || d.Evidence["pod"] != p.Name ||
				d.Evidence["node_ready"] != string(tc.ready) {
				t.Fatalf("held decision %+v", d)
			}
			// Held every cycle, noted once a minute.
			e.clk.Advance(10 * time.Second)
			if res := cycle(t, r, e.clk.Now()); res.Replaced != 0 || res.Waiting != 1 || len(labels(res)) != 0 {
				t.Fatalf("10s later: replaced %d, waiting %d, decisions %v: want held, not noted again", res.Replaced, res.Waiting, labels(res))
			}
			e.clk.Advance(time.Minute)
			if res := cycle(t, r, e.clk.Now()); res.Replaced != 0 || !slices.Equal(labels(res), []string{sdk.LabelInfraConfirmValveHeld}) {
				t.Fatalf("a minute later: replaced %d, decisions %v: want held and noted again", res.Replaced, labels(res))
			}
			if ti := e.ti(t, run, "task"); ti.Attempt != a || ti.State != sdk.StateFailed {
				t.Fatalf("a held mark moved: %+v", ti)
			}
			tc.then(t, &p, nodeName)
			e.clk.Advance(time.Second)
			if res := cycle(t, r, e.clk.Now()); res.Replaced != 1 ||
				!slices.Equal(labels(res), []string{sdk.LabelInfraConfirmValveOpen, sdk.LabelInfraReplace}) {
				t.Fatalf("once nothing can run there: replaced %d, decisions %v: want the valve open, then a re-place", res.Replaced, labels(res))
			}
		})
	}
}

// setReady writes the node's Ready condition ("" removes every condition:
// a node no kubelet ever reported on).
func setReady(t *testing.T, e *env, n *corev1.Node, status corev1.ConditionStatus) {
	t.Helper()
	n.Status.Conditions = nil
	if status != "" {
		now := metav1.NewTime(e.clk.Now())
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, Reason: "Test",
			LastHeartbeatTime: now, LastTransitionTime: now}}
	}
	if _, err := e.cs.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// A tenant with pods/create cannot hold a mark past the valve with a pod
// of its own: a pod under the attempt's recorded name that names another
// attempt (or none), or even the attempt itself but is not the pod of its
// recorded UID, on a node that is not Ready holds nothing, and the valve
// opens as it would have; the runner's decisions say nothing of it.
func TestTheValveIsNotHeldByAPodThatIsNotTheAttempts(t *testing.T) {
	e := newEnv(t)
	for name, ownLabels := range map[string]bool{"NamingAnotherAttempt": false, "WithTheAttemptsOwnLabels": true} {
		t.Run(name, func(t *testing.T) { valveNotHeldByAForeignPod(t, e, ownLabels) })
	}
}

func valveNotHeldByAForeignPod(t *testing.T, e *env, ownLabels bool) {
	ctx := context.Background()
	run := fmt.Sprintf("foreign-%d", time.Now().UnixNano())
	nodeName := "unreachable-" + run
	n, err := e.cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.cs.CoreV1().Nodes().Delete(context.Background(), nodeName, metav1.DeleteOptions{}) })
	setReady(t, e, n, corev1.ConditionUnknown)
	e.mkRun(t, run, lifecycle.NewTask{TaskID: "task", Retries: 1})
	r := e.runner(t, e.config(e.cs))
	if res := cycle(t, r, e.clk.Now()); res.Dispatched != 1 {
		t.Fatalf("dispatched %d", res.Dispatched)
	}
	a := e.ti(t, run, "task").Attempt
	ours := e.pods(t)[a]
	// Ours goes (its finalizer released), a tenant's takes its name,
	// labelled for another try (or for the attempt itself), bound to the
	// node nobody hears from.
	ours.Finalizers = nil
	if _, err := e.cs.CoreV1().Pods(e.ns).Update(ctx, &ours, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.cs.CoreV1().Pods(e.ns).Delete(ctx, ours.Name, *metav1.NewDeleteOptions(0)); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, 30*time.Second, "our pod to go", func() bool {
		_, err := e.cs.CoreV1().Pods(e.ns).Get(ctx, ours.Name, metav1.GetOptions{})
		return err != nil
	})
	other := a
	if !ownLabels {
		other.Try = 7
	}
	lbls, ann := kube.AttemptLabels(other)
	foreign := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: ours.Name, Namespace: e.ns, Labels: lbls, Annotations: ann},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "task", Image: "registry.invalid/x"}}}}
	if _, err := e.cs.CoreV1().Pods(e.ns).Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if sd, err := e.w.Running(ctx, a, e.clk.Now()); err != nil || sd {
		t.Fatal(sd, err)
	}
	if ok, err := e.w.Fail(ctx, a, []string{sdk.StateRunning},
		lifecycle.Failure{Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost}, e.clk.Now()); err != nil || !ok {
		t.Fatal(ok, err)
	}
	e.clk.Advance(ladder.Defaults().InfraConfirmValve)
	res := cycle(t, r, e.clk.Now())
	if res.Replaced != 1 || !slices.Equal(labels(res), []string{sdk.LabelInfraConfirmValveOpen, sdk.LabelInfraReplace}) {
		t.Fatalf("replaced %d, decisions %v: a foreign pod held the mark", res.Replaced, labels(res))
	}
}

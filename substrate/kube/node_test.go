package kube

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/dexaflow/reaper/sdk"
)

// The policy of the node fields of a liveness answer, over client-go's fake
// clientset (the real API server and controller prove it in
// test/kubereapers, TestPodLostNodeUnreachable).
func TestNodeReachability(t *testing.T) {
	t.Parallel()
	since := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	node := func(name string, status corev1.ConditionStatus, reason string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if status != "" {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, Reason: reason,
				LastTransitionTime: metav1.NewTime(since)}}
		}
		return n
	}
	nodes := []runtime.Object{
		node("lost", corev1.ConditionUnknown, "NodeStatusUnknown"),
		node("sick", corev1.ConditionFalse, "KubeletNotReady"),
		node("fine", corev1.ConditionTrue, "KubeletReady"),
		node("new", "", ""),
	}
	type podSpec struct {
		node        string
		phase       corev1.PodPhase
		ready       bool
		terminating bool
	}
	mk := func(i int, s podSpec) *pod {
		in := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p" + string(rune('0'+i)), Namespace: "ns"},
			Spec: corev1.PodSpec{NodeName: s.node}, Status: corev1.PodStatus{Phase: s.phase}}
		st := corev1.ConditionFalse
		if s.ready {
			st = corev1.ConditionTrue
		}
		in.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
		if s.terminating {
			ts := metav1.NewTime(since.Add(time.Minute))
			in.DeletionTimestamp = &ts
		}
		return reduce(in)
	}
	run, pending, succeeded := corev1.PodRunning, corev1.PodPending, corev1.PodSucceeded
	for _, tc := range []struct {
		name      string
		pods      []podSpec
		getErr    bool
		wantNode  string
		wantErr   bool
		wantReads int
		detail    string
	}{
		{name: "NotReadyPodOnUnknownNode_Unreachable", pods: []podSpec{{node: "lost", phase: run}},
			wantNode: "lost", wantReads: 1, detail: "Ready Unknown since 2030-01-02T03:04:05Z (NodeStatusUnknown)"},
		{name: "NotReadyPodOnNotReadyNode_Unreachable", pods: []podSpec{{node: "sick", phase: run}},
			wantNode: "sick", wantReads: 1, detail: "Ready False"},
		{name: "PendingPodOnUnknownNode_Unreachable", pods: []podSpec{{node: "lost", phase: pending}},
			wantNode: "lost", wantReads: 1},
		{name: "TerminatingPodOnUnknownNode_UnreachableTerminating", pods: []podSpec{{node: "lost", phase: run, ready: true, terminating: true}},
			wantNode: "lost", wantReads: 1, detail: "Terminating since 2030-01-02T03:05:05Z with no kubelet to confirm it"},
		{name: "ReadyPod_NoReadNoSignal", pods: []podSpec{{node: "lost", phase: run, ready: true}}},
		{name: "FinishedPod_NoReadNoSignal", pods: []podSpec{{node: "lost", phase: succeeded}}},
		{name: "UnscheduledPod_NoReadNoSignal", pods: []podSpec{{phase: pending}}},
		{name: "NotReadyPodOnReadyNode_NoSignal", pods: []podSpec{{node: "fine", phase: run}}, wantReads: 1},
		{name: "NodeWithoutReadyCondition_NoSignal", pods: []podSpec{{node: "new", phase: pending}}, wantReads: 1},
		{name: "NodeGone_NoSignalPodGCsCase", pods: []podSpec{{node: "deleted", phase: run}}, wantReads: 1,
			detail: "node deleted of pod p0 is gone"},
		{name: "OnePodOnAReadyNode_NoSignal", pods: []podSpec{{node: "lost", phase: run}, {node: "fine", phase: run}}, wantReads: 2},
		{name: "OnePodFinished_NoSignal", pods: []podSpec{{node: "lost", phase: run}, {node: "lost", phase: succeeded}}},
		{name: "TwoPodsOnOneLostNode_ReadOnce", pods: []podSpec{{node: "lost", phase: run}, {node: "lost", phase: pending}},
			wantNode: "lost", wantReads: 1},
		{name: "TwoLostNodes_BothNamed", pods: []podSpec{{node: "lost", phase: run}, {node: "sick", phase: run}},
			wantNode: "lost,sick", wantReads: 2},
		{name: "NodeReadError_NodeErrorNoSignal", pods: []podSpec{{node: "lost", phase: run}}, getErr: true,
			wantErr: true, wantReads: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cs := fake.NewClientset(nodes...)
			if tc.getErr {
				cs.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, errors.New("nodes is forbidden")
				})
			}
			pods := make([]*pod, len(tc.pods))
			for i, s := range tc.pods {
				pods[i] = mk(i, s)
			}
			l := presentLive(sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}, pods)
			newNodeReads(&running{client: cs}).annotate(context.Background(), &l, pods)
			if l.Node != tc.wantNode || (tc.wantNode != "") != l.NodeUnreachableSince.Equal(since) ||
				(l.NodeError != "") != tc.wantErr || !strings.Contains(l.Detail, tc.detail) {
				t.Fatalf("answer %+v; want node %q (since %v), error %v, detail with %q", l, tc.wantNode, since, tc.wantErr, tc.detail)
			}
			if tc.wantErr && !strings.Contains(l.NodeError, "reading node lost") {
				t.Fatalf("node error %q does not say what was read", l.NodeError)
			}
			if n := len(cs.Actions()); n != tc.wantReads {
				t.Fatalf("%d node reads %v, want %d", n, cs.Actions(), tc.wantReads)
			}
			if l.State != sdk.Alive {
				t.Fatalf("state %s: a node never makes a present pod anything but alive", l.State)
			}
		})
	}
}

// The latest transition among the attempt's not-Ready nodes is the one
// reported: the threshold must be past for every one of them.
func TestNodeReachability_LatestSinceReported(t *testing.T) {
	t.Parallel()
	early, late := time.Date(2030, 1, 2, 3, 0, 0, 0, time.UTC), time.Date(2030, 1, 2, 3, 30, 0, 0, time.UTC)
	cs := fake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, LastTransitionTime: metav1.NewTime(late)}}}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, LastTransitionTime: metav1.NewTime(early)}}}})
	var pods []*pod
	for _, n := range []string{"b", "a"} {
		pods = append(pods, reduce(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p-" + n}, Spec: corev1.PodSpec{NodeName: n},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}}))
	}
	l := presentLive(sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}, pods)
	newNodeReads(&running{client: cs}).annotate(context.Background(), &l, pods)
	if l.Node != "b,a" || !l.NodeUnreachableSince.Equal(late) {
		t.Fatalf("answer %+v, want nodes b,a since %v", l, late)
	}
}

// The attacker's pods: bound to more node names than one call may read,
// they cost at most maxNodeReads reads, and the answers past the bound say
// their node could not be read (a deferral), never anything else.
func TestNodeReachability_ReadsBoundedPerCall(t *testing.T) {
	t.Parallel()
	cs := fake.NewClientset()
	nodes := newNodeReads(&running{client: cs})
	var errs int
	for i := range maxNodeReads + 20 {
		p := reduce(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%d", i)},
			Spec: corev1.PodSpec{NodeName: fmt.Sprintf("made-up-%d", i)}, Status: corev1.PodStatus{Phase: corev1.PodRunning}})
		l := presentLive(sdk.Attempt{RunID: "r", TaskID: fmt.Sprintf("t%d", i), Try: 1}, []*pod{p})
		nodes.annotate(context.Background(), &l, []*pod{p})
		if l.State != sdk.Alive || l.Node != "" {
			t.Fatalf("answer %+v", l)
		}
		if l.NodeError != "" {
			errs++
		}
	}
	if n := len(cs.Actions()); n != maxNodeReads || errs != 20 {
		t.Fatalf("%d node reads and %d node errors, want %d and 20", n, errs, maxNodeReads)
	}
}

// Many pods of one attempt on lost nodes: the detail names a few of them.
func TestNodeReachability_DetailBounded(t *testing.T) {
	t.Parallel()
	var objs []runtime.Object
	var pods []*pod
	for i := range 40 {
		name := fmt.Sprintf("lost-%02d", i)
		objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown,
				LastTransitionTime: metav1.NewTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))}}}})
		pods = append(pods, reduce(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p-" + name},
			Spec: corev1.PodSpec{NodeName: name}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}))
	}
	l := presentLive(sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}, pods)
	newNodeReads(&running{client: fake.NewClientset(objs...)}).annotate(context.Background(), &l, pods)
	if !strings.HasSuffix(l.Node, ",and 35 more") || !strings.Contains(l.Detail, "and 35 more pods") || len(l.Detail) > 2000 {
		t.Fatalf("node %q, detail (%d bytes) %q", l.Node, len(l.Detail), l.Detail)
	}
}

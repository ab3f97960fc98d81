package kubetest_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/testkit/kubetest"
)

// The binder binds each unbound pod to the node Place picks, sets the
// configured labels first, leaves a pod Place declines unbound, and binds
// nothing to a node once it is removed.
func TestBinderBindsUnboundPodsWhereItIsTold(t *testing.T) {
	t.Parallel()
	c := kubetest.Current(t)
	cs, ns := c.Client(t), c.NewNamespace(t)
	a, b := c.AddNode(t, "").Name, c.AddNode(t, "").Name
	place := func(p *corev1.Pod, nodes []string) string {
		switch p.Name {
		case "to-first":
			return nodes[0]
		case "declined":
			return ""
		}
		return nodes[len(nodes)-1]
	}
	binder, err := kubetest.StartBinder(t.Context(), kubetest.BinderConfig{Client: cs, Namespace: ns, Nodes: []string{a, b},
		Place: place, Labels: map[string]string{"owner": "binder-test"}})
	if err != nil {
		t.Fatal(err)
	}
	defer binder.Stop()
	bound := func(p *corev1.Pod) bool { return p != nil && p.Spec.NodeName != "" }

	first := waitPod(t, cs, createPod(t, cs, ns, "to-first", "", nil), bound)
	newest := waitPod(t, cs, createPod(t, cs, ns, "to-newest", "", nil), bound)
	if first.Spec.NodeName != a || newest.Spec.NodeName != b {
		t.Fatalf("bound to %s and %s, want %s and %s", first.Spec.NodeName, newest.Spec.NodeName, a, b)
	}
	if first.Labels["owner"] != "binder-test" || first.Labels["app"] != "kubetest" {
		t.Fatalf("labels %v: the binder's label is missing or the pod's own was lost", first.Labels)
	}

	binder.RemoveNode(b)
	if got := binder.Nodes(); len(got) != 1 || got[0] != a {
		t.Fatalf("nodes after RemoveNode(%s): %v", b, got)
	}
	after := waitPod(t, cs, createPod(t, cs, ns, "after-removal", "", nil), bound)
	if after.Spec.NodeName != a {
		t.Fatalf("bound to %s after %s was removed, want %s", after.Spec.NodeName, b, a)
	}
	declined := createPod(t, cs, ns, "declined", "", nil)
	// The pod made after the declined one is bound: a round has passed
	// over both.
	waitPod(t, cs, createPod(t, cs, ns, "to-newest-2", "", nil), bound)
	got, err := cs.CoreV1().Pods(ns).Get(t.Context(), declined.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.NodeName != "" {
		t.Fatalf("a pod Place declined was bound to %s", got.Spec.NodeName)
	}
}

package helm_test

import (
	"context"
	"os"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/dexaflow/reaper/testkit/eventually"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// TestDeployKubeKeepsReaperdOutOfTheTaskNamespace: the plain manifest
// deploy/kube/rbac.yaml puts reaperd's ServiceAccount, Lease and Lease Role
// in reaperd's namespace and only the pods Role in the task namespace.
// Applied to the real API server (its two namespaces renamed to the test's,
// as its header tells an operator to), reaperd's ServiceAccount may read
// and tear down pods in the task namespace and take its Lease at home, and
// nothing of the kind the other way round.
func TestDeployKubeKeepsReaperdOutOfTheTaskNamespace(t *testing.T) {
	src, err := os.ReadFile("../kube/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c := kubetest.Current(t)
	home, tasks := c.NewNamespace(t), c.NewNamespace(t)
	rename := map[string]string{"reaper": home, "reaper-tasks": tasks}
	var objs []*unstructured.Unstructured
	for _, o := range decodeAll(t, "deploy/kube/rbac.yaml", src) {
		switch o.GetKind() {
		case "Namespace":
			if _, ok := rename[o.GetName()]; !ok {
				t.Fatalf("the manifest makes namespace %s", o.GetName())
			}
			continue // the test's own
		case "ClusterRole", "ClusterRoleBinding":
			o.SetName(o.GetName() + "-" + home) // cluster-wide: one per test
			if ref, ok, _ := unstructured.NestedString(o.Object, "roleRef", "name"); ok {
				_ = unstructured.SetNestedField(o.Object, ref+"-"+home, "roleRef", "name")
			}
		}
		want := map[string]string{"ServiceAccount": "reaper", "Lease": "reaper", "Role": "", "RoleBinding": ""}[o.GetKind()]
		if o.GetKind() == "ServiceAccount" && o.GetName() == "reaper-task" {
			// The task pods' own identity, bound to no role: it must live
			// where the pods run.
			want = "reaper-tasks"
		}
		if want != "" && o.GetNamespace() != want {
			t.Errorf("%s %s in %q, want reaperd's namespace", o.GetKind(), o.GetName(), o.GetNamespace())
		}
		if o.GetNamespace() != "" {
			o.SetNamespace(rename[o.GetNamespace()])
		}
		subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
		for _, s := range subjects {
			m := s.(map[string]any)
			if m["namespace"] != "reaper" {
				t.Errorf("%s %s binds %v, want reaperd's ServiceAccount in its own namespace", o.GetKind(), o.GetName(), m)
			}
			m["namespace"] = home
		}
		if len(subjects) > 0 {
			_ = unstructured.SetNestedSlice(o.Object, subjects, "subjects")
		}
		objs = append(objs, o)
	}
	for _, o := range objs {
		if o.GetKind() == "Role" {
			rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
			for _, r := range rules {
				res := r.(map[string]any)["resources"].([]any)[0]
				if wantNS := map[any]string{"pods": tasks, "events": tasks, "leases": home}[res]; o.GetNamespace() != wantNS {
					t.Errorf("the %s rule lives in %s, want %s", res, o.GetNamespace(), wantNS)
				}
			}
		}
	}
	apply(t, c, objs)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cs := c.Client(t)
		_ = cs.RbacV1().ClusterRoleBindings().Delete(ctx, "reaperd-nodes-"+home, metav1.DeleteOptions{})
		_ = cs.RbacV1().ClusterRoles().Delete(ctx, "reaperd-nodes-"+home, metav1.DeleteOptions{})
	})

	cs := c.Client(t)
	user := "system:serviceaccount:" + home + ":reaperd"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first := access{ns: tasks, verb: "list", resource: "pods"}
	if !eventually.Until(time.Minute, func() bool { return allowed(ctx, t, cs, user, home, first) },
		eventually.Every(100*time.Millisecond)) {
		t.Fatalf("reaperd's ServiceAccount never got %s", first)
	}
	for _, a := range []access{
		{ns: tasks, verb: "watch", resource: "pods"},
		{ns: tasks, verb: "delete", resource: "pods"},
		{ns: tasks, verb: "patch", resource: "pods"},
		{ns: tasks, verb: "create", group: "events.k8s.io", resource: "events"},
		{ns: tasks, verb: "patch", group: "events.k8s.io", resource: "events"},
		{ns: home, verb: "update", group: "coordination.k8s.io", resource: "leases", name: "reaperd"},
		{ns: "", verb: "get", resource: "nodes"},
	} {
		if !allowed(ctx, t, cs, user, home, a) {
			t.Errorf("denied %s", a)
		}
	}
	for _, a := range []access{
		{ns: home, verb: "list", resource: "pods"},
		{ns: home, verb: "create", group: "events.k8s.io", resource: "events"},
		{ns: home, verb: "get", resource: "secrets"},
		{ns: tasks, verb: "get", resource: "secrets"},
		{ns: tasks, verb: "update", group: "coordination.k8s.io", resource: "leases", name: "reaperd"},
	} {
		if allowed(ctx, t, cs, user, home, a) {
			t.Errorf("allowed %s", a)
		}
	}
}

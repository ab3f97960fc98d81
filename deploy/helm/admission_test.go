package helm_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/testkit/eventually"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// as is a client of the API server impersonating service account sa of
// namespace ns (the admin may impersonate).
func as(t *testing.T, c *kubetest.Cluster, ns, sa string) kubernetes.Interface {
	t.Helper()
	rc := rest.CopyConfig(c.AdminConfig())
	rc.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + sa,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// grantPods lets the subjects (ServiceAccounts, as namespace/name) create,
// read, update and patch pods in ns, and add ephemeral containers (what a
// tenant of the namespace typically holds; reaperd's runner holds create
// the same way).
func grantPods(t *testing.T, cs kubernetes.Interface, ns string, subjects ...string) {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "pod-writer"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create", "get", "list", "update", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"pods/ephemeralcontainers"}, Verbs: []string{"update", "patch"}},
	}}
	if _, err := cs.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "pod-writer"},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "pod-writer"}}
	for _, s := range subjects {
		sns, name, _ := strings.Cut(s, "/")
		rb.Subjects = append(rb.Subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: sns})
	}
	if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// policyEnv is the chart's admission policy applied to the API server, a
// tenant and reaperd.
type policyEnv struct {
	release, tasks  string
	admin           kubernetes.Interface
	tenant, reaperd kubernetes.Interface
	objs            []*unstructured.Unstructured
}

// applyPolicy renders the chart for a release in a namespace of its own
// with args, applies every object (the policy and its binding removed when
// the test ends), makes a tenant ServiceAccount of the task namespace with
// pod rights there (grantPods), gives reaperd's ServiceAccount the same,
// and waits until the policy refuses the tenant a forged task pod.
func applyPolicy(t *testing.T, args ...string) *policyEnv {
	t.Helper()
	return applyPolicyIn(t, kubetest.Current(t).NewNamespace(t), args...)
}

// applyPolicyIn is applyPolicy for the release namespace release.
func applyPolicyIn(t *testing.T, release string, args ...string) *policyEnv {
	t.Helper()
	c := kubetest.Current(t)
	admin := c.Client(t)
	ctx := context.Background()
	objs := render(t, release, args...)
	name := strings.TrimSuffix((release + "-reaper-task-pods")[:min(63, len(release)+len("-reaper-task-pods"))], "-")
	policy := find(t, objs, "ValidatingAdmissionPolicy", name)
	binding := find(t, objs, "ValidatingAdmissionPolicyBinding", name)
	t.Cleanup(func() {
		_ = admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, binding.GetName(), metav1.DeleteOptions{})
		_ = admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(ctx, policy.GetName(), metav1.DeleteOptions{})
	})
	tasks, _, _ := unstructured.NestedString(binding.Object, "spec", "matchResources", "namespaceSelector", "matchLabels",
		"kubernetes.io/metadata.name")
	apply(t, c, objs)
	if _, err := admin.CoreV1().ServiceAccounts(tasks).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	grantPods(t, admin, tasks, tasks+"/tenant", release+"/reaper")
	e := &policyEnv{release: release, tasks: tasks, admin: admin, objs: objs,
		tenant: as(t, c, tasks, "tenant"), reaperd: as(t, c, release, "reaper")}
	waitPolicy(t, e.tenant, tasks)
	return e
}

// taskPod is a pod carrying attempt a's labels and raw task id annotation,
// as the kube runner makes it.
func taskPod(name string, a sdk.Attempt) *corev1.Pod {
	l, ann := kube.AttemptLabels(a)
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l, Annotations: ann},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: kube.TaskContainer, Image: "agent"}}}}
}

// refusedByPolicy: the API server's admission refused the request with the
// chart's policy's words.
func refusedByPolicy(err error) bool {
	return err != nil && (apierrors.IsForbidden(err) || apierrors.IsInvalid(err)) && strings.Contains(err.Error(), "only reaperd")
}

// waitPolicy waits (bounded: the API server loads a new policy on its own
// time) until the policy refuses a dry-run create of a forged pod as cs.
func waitPolicy(t *testing.T, cs kubernetes.Interface, ns string) {
	t.Helper()
	var err error
	probes := 0
	if !eventually.Until(time.Minute, func() bool {
		_, err = cs.CoreV1().Pods(ns).Create(context.Background(), taskPod(fmt.Sprintf("probe-%d", probes), sdk.Attempt{RunID: "probe", TaskID: "probe", Try: 1}),
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		probes++
		return refusedByPolicy(err)
	}, eventually.Every(100*time.Millisecond)) {
		t.Fatalf("the admission policy never took effect: last answer %v", err)
	}
}

// TestChartAdmissionPolicyLetsOnlyReaperdMakeOrRelabelTaskPods: the chart's
// rendered ValidatingAdmissionPolicy and binding, applied to the real API
// server (which serves admissionregistration.k8s.io/v1 policies), refuse a
// tenant with pods/create a forged task pod and any change of a task pod's
// attempt labels or raw task id annotation, and let reaperd's service
// account create its pods; ordinary pods and other labels are left alone.
func TestChartAdmissionPolicyLetsOnlyReaperdMakeOrRelabelTaskPods(t *testing.T) {
	c := kubetest.Current(t)
	admin := c.Client(t)
	ctx := context.Background()
	res, err := admin.Discovery().ServerResourcesForGroupVersion("admissionregistration.k8s.io/v1")
	if err != nil {
		t.Fatalf("the API server's admission policies: %v", err)
	}
	served := false
	for _, r := range res.APIResources {
		served = served || r.Name == "validatingadmissionpolicies"
	}
	if !served {
		t.Fatal("the test API server does not serve validatingadmissionpolicies")
	}

	e := applyPolicy(t)
	if e.tasks == e.release {
		t.Fatalf("the default task namespace is the release's (%s)", e.release)
	}
	ns, tenant, reaperd := e.tasks, e.tenant, e.reaperd

	a := sdk.Attempt{RunID: "run-1", TaskID: "load_a", Try: 1, Epoch: 1}
	t.Run("AForgedTaskPodIsRefusedToATenant", func(t *testing.T) {
		_, err := tenant.CoreV1().Pods(ns).Create(ctx, taskPod("forged", a), metav1.CreateOptions{})
		if !refusedByPolicy(err) {
			t.Fatalf("a tenant's forged task pod: %v, want refused by the policy", err)
		}
		if _, err := admin.CoreV1().Pods(ns).Get(ctx, "forged", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("the refused pod exists: %v", err)
		}
	})
	var own *corev1.Pod
	t.Run("ReaperdCreatesItsTaskPods", func(t *testing.T) {
		var err error
		if own, err = reaperd.CoreV1().Pods(ns).Create(ctx, taskPod("task-1", a), metav1.CreateOptions{}); err != nil {
			t.Fatalf("reaperd's own task pod refused: %v", err)
		}
	})
	if own == nil {
		t.FailNow()
	}
	t.Run("ATenantsOrdinaryPodIsLeftAlone", func(t *testing.T) {
		p := taskPod("plain", a)
		p.Labels, p.Annotations = map[string]string{"app": "mine"}, nil
		if _, err := tenant.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("an ordinary pod refused: %v", err)
		}
		// Labelling it as a task pod afterwards is refused.
		_, err := tenant.CoreV1().Pods(ns).Patch(ctx, "plain", types.MergePatchType,
			[]byte(`{"metadata":{"labels":{"leoflow.io/run-id":"run-1"}}}`), metav1.PatchOptions{})
		if !refusedByPolicy(err) {
			t.Fatalf("adding the run-id label to a pod: %v, want refused", err)
		}
	})
	t.Run("ALabelOrAnnotationChangeOnATaskPodIsRefusedToATenant", func(t *testing.T) {
		for _, patch := range []string{
			`{"metadata":{"labels":{"leoflow.io/attempt-epoch":"2"}}}`,
			`{"metadata":{"labels":{"leoflow.io/try-number":null}}}`,
			`{"metadata":{"labels":{"leoflow.io/run-id":"run-2"}}}`,
			`{"metadata":{"annotations":{"leoflow.io/raw-task-id":"load-a"}}}`,
		} {
			_, err := tenant.CoreV1().Pods(ns).Patch(ctx, own.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			if !refusedByPolicy(err) {
				t.Fatalf("tenant patch %s: %v, want refused by the policy", patch, err)
			}
		}
		got, err := admin.CoreV1().Pods(ns).Get(ctx, own.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		wantL, wantA := kube.AttemptLabels(a)
		for k, v := range wantL {
			if got.Labels[k] != v {
				t.Fatalf("label %s is %q after the refusals, want %q", k, got.Labels[k], v)
			}
		}
		if got.Annotations[kube.AnnotationRawTaskID] != wantA[kube.AnnotationRawTaskID] {
			t.Fatalf("annotation %q after the refusals", got.Annotations[kube.AnnotationRawTaskID])
		}
		// Another label is the tenant's to change.
		if _, err := tenant.CoreV1().Pods(ns).Patch(ctx, own.Name, types.MergePatchType,
			[]byte(`{"metadata":{"labels":{"team":"a"}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatalf("an unrelated label change refused: %v", err)
		}
	})
	t.Run("ThePolicyIsAValuesSwitch", func(t *testing.T) {
		for _, o := range render(t, ns, "--set", "admissionPolicy.enabled=false") {
			if strings.HasPrefix(o.GetKind(), "ValidatingAdmissionPolicy") {
				t.Fatalf("admissionPolicy.enabled=false still renders %s %s", o.GetKind(), o.GetName())
			}
		}
	})
}

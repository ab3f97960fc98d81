package helm_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/dexaflow/reaper/testkit/eventually"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// apply creates or updates every object on the API server by server-side
// apply, as helm install would send them.
func apply(t *testing.T, c *kubetest.Cluster, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	disc, err := discovery.NewDiscoveryClientForConfig(c.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	dyn, err := dynamic.NewForConfig(c.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		if gvk.Kind == "Namespace" {
			deleteNamespaceAtCleanup(t, c, o.GetName())
		}
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("map %s: %v", gvk, err)
		}
		_, err = dyn.Resource(m.Resource).Namespace(o.GetNamespace()).Apply(ctx, o.GetName(), o,
			metav1.ApplyOptions{FieldManager: "helm-chart-test", Force: true})
		if err != nil {
			t.Fatalf("apply %s %s/%s: %v", gvk.Kind, o.GetNamespace(), o.GetName(), err)
		}
	}
}

// deleteNamespaceAtCleanup deletes a namespace the chart made (the task
// namespace) when the test ends, as kubetest does with its own.
func deleteNamespaceAtCleanup(t *testing.T, c *kubetest.Cluster, name string) {
	t.Helper()
	cs := c.Client(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := cs.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete the task namespace %s: %v", name, err)
		}
	})
}

// TestChartAppliesToTheAPIServerAndItsReplicasArePlaced: every rendered
// object, with the default and with other values, is accepted by a real API
// server (schema, RBAC escalation checks), and the Deployment's controller
// makes the two pods from its template.
func TestChartAppliesToTheAPIServerAndItsReplicasArePlaced(t *testing.T) {
	c := kubetest.Current(t)
	ns := c.NewNamespace(t)
	objs := render(t, ns)
	apply(t, c, objs)

	// The other values too (no ServiceMonitor: the test cluster has not its
	// CRD).
	custom := render(t, c.NewNamespace(t), "--values", customValues,
		"--set", "taskNamespace.name="+c.NewNamespace(t), "--set", "serviceMonitor.enabled=false")
	apply(t, c, custom)
	// With the kube runner, so the attempt API's Service and the replicas'
	// port and Secret volumes too.
	runner := render(t, c.NewNamespace(t), append(attemptAPISecrets, "--set", "config.runner.enabled=true",
		"--set", "config.runner.kube.image=task:1", "--set", "attemptApi.tls.caKey=ca.crt")...)
	apply(t, c, runner)

	if !c.HasControllerManager() {
		return
	}
	cs := c.Client(t)
	sel := labels.Set{"app.kubernetes.io/name": "reaper", "app.kubernetes.io/instance": "reaper"}.String()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var pods []corev1.Pod
	if !eventually.Until(time.Minute, func() bool {
		list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			t.Fatalf("list the chart's pods: %v", err)
		}
		pods = list.Items
		return len(pods) == 2
	}, eventually.Every(100*time.Millisecond)) {
		t.Fatalf("the Deployment made %d pods, want 2", len(pods))
	}
	for _, p := range pods {
		if p.Spec.ServiceAccountName != "reaper" {
			t.Errorf("pod %s: service account %q", p.Name, p.Spec.ServiceAccountName)
		}
		checkDSNFromSecret(t, p.Spec, configOf(t, objs, "reaper"), "reaper-database", "dsn")
	}
}

// access is one call the ServiceAccount might make.
type access struct {
	ns, verb, group, resource, sub, name string
}

func (a access) String() string {
	r := a.resource
	if a.group != "" {
		r += "." + a.group
	}
	if a.sub != "" {
		r += "/" + a.sub
	}
	if a.name != "" {
		r += " " + a.name
	}
	return fmt.Sprintf("%s %s in %q", a.verb, r, a.ns)
}

// allowed asks the API server's authorizer whether user may make the call.
func allowed(ctx context.Context, t *testing.T, cs kubernetes.Interface, user, saNS string, a access) bool {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   user,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + saNS, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: a.ns, Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.sub, Name: a.name,
		},
	}}
	got, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SubjectAccessReview %s: %v", a, err)
	}
	return got.Status.Allowed
}

// TestChartServiceAccountIsAllowedExactlyTheCallsReaperdMakes asks the real
// authorizer, for the chart's ServiceAccount: the calls of the kube
// substrate on the task namespace's pods and of the leader elector on its
// Lease are allowed; secrets, pod creation (without the runner), exec, status writes, other
// namespaces and anything cluster-wide but get on nodes are not. Task pods in the release's
// namespace or in one of their own; with leader "postgres", no Lease at all;
// with the kube runner, pod creation too.
func TestChartServiceAccountIsAllowedExactlyTheCallsReaperdMakes(t *testing.T) {
	c := kubetest.Current(t)
	cs := c.Client(t)
	for _, layout := range []struct{ split, postgres, runner bool }{
		{false, false, false}, {true, false, false}, {false, true, false}, {true, false, true},
	} {
		split := layout.split
		t.Run(fmt.Sprintf("tasks_in_own_namespace=%v,leader_postgres=%v,runner=%v", split, layout.postgres, layout.runner), func(t *testing.T) {
			release := c.NewNamespace(t)
			// The default: the chart's own task namespace; else the
			// release's, acknowledged.
			tasks, other := release+"-tasks", c.NewNamespace(t)
			var args []string
			if !split {
				tasks = release
				args = []string{"--set", "taskNamespace.name=" + tasks, "--set", "taskNamespace.allowReleaseNamespace=true"}
			}
			if layout.postgres {
				args = append(args, "--set", "config.leader.kind=postgres")
			}
			if layout.runner {
				args = append(append(args, "--set", "config.runner.enabled=true", "--set", "config.runner.kube.image=task:1"),
					attemptAPISecrets...)
			}
			apply(t, c, render(t, release, args...))
			user := "system:serviceaccount:" + release + ":reaper"

			var allow, deny []access
			// patch covers the teardown's stop in place and the sweep's
			// release of the outcome record finalizer (a JSON patch of the
			// pod): no verb was added for the finalizer.
			for _, v := range []string{"get", "list", "watch", "patch", "delete"} {
				allow = append(allow, access{ns: tasks, verb: v, resource: "pods"})
			}
			// The Events on the task pods: create, and patch for a
			// repeat's series; nothing else of them, and nowhere else.
			for _, v := range []string{"create", "patch"} {
				allow = append(allow, access{ns: tasks, verb: v, group: "events.k8s.io", resource: "events"})
			}
			for _, v := range []string{"get", "list", "watch", "update", "delete", "deletecollection"} {
				deny = append(deny, access{ns: tasks, verb: v, group: "events.k8s.io", resource: "events"})
			}
			deny = append(deny, access{ns: tasks, verb: "create", resource: "events"},
				access{ns: other, verb: "create", group: "events.k8s.io", resource: "events"})
			// The Lease by name, get and update: the chart makes it, since
			// no rule can hold a create to one name.
			for _, v := range []string{"get", "update"} {
				lease := access{ns: release, verb: v, group: "coordination.k8s.io", resource: "leases", name: "reaper"}
				if layout.postgres {
					deny = append(deny, lease) // the lease is the board's row
				} else {
					allow = append(allow, lease)
				}
				deny = append(deny, access{ns: release, verb: v, group: "coordination.k8s.io", resource: "leases", name: "another"})
			}
			deny = append(deny, access{ns: release, verb: "create", group: "coordination.k8s.io", resource: "leases"},
				access{ns: release, verb: "create", group: "coordination.k8s.io", resource: "leases", name: "reaper"})
			// The one cluster-wide grant: the node of a pod that hints at a
			// lost node, read one at a time (pod_lost_node_unreachable).
			allow = append(allow, access{ns: "", verb: "get", resource: "nodes"})
			// The kube runner's dispatch, and the attempt API's review of a
			// pod's projected token (the proof of a bootstrap exchange).
			// Never a token of its own making for any ServiceAccount.
			runnerCalls := []access{{ns: tasks, verb: "create", resource: "pods"},
				{ns: "", verb: "create", group: "authentication.k8s.io", resource: "tokenreviews"}}
			if layout.runner {
				allow = append(allow, runnerCalls...)
			} else {
				deny = append(deny, runnerCalls...)
			}
			deny = append(deny, access{ns: tasks, verb: "create", resource: "serviceaccounts", sub: "token"},
				access{ns: "", verb: "create", group: "authorization.k8s.io", resource: "subjectaccessreviews"})
			deny = append(deny, []access{
				{ns: tasks, verb: "update", resource: "pods"},
				{ns: tasks, verb: "deletecollection", resource: "pods"},
				{ns: tasks, verb: "create", resource: "pods", sub: "exec"},
				{ns: tasks, verb: "get", resource: "pods", sub: "log"},
				{ns: tasks, verb: "update", resource: "pods", sub: "status"},
				{ns: tasks, verb: "patch", resource: "pods", sub: "status"},
				{ns: tasks, verb: "create", resource: "pods", sub: "eviction"},
				{ns: tasks, verb: "get", resource: "secrets"},
				{ns: tasks, verb: "list", resource: "secrets"},
				{ns: release, verb: "get", resource: "secrets"},
				{ns: release, verb: "list", resource: "configmaps"},
				{ns: release, verb: "delete", group: "coordination.k8s.io", resource: "leases"},
				{ns: release, verb: "list", group: "coordination.k8s.io", resource: "leases"},
				{ns: release, verb: "patch", group: "apps", resource: "deployments"},
				{ns: other, verb: "list", resource: "pods"},
				{ns: other, verb: "delete", resource: "pods"},
				{ns: other, verb: "update", group: "coordination.k8s.io", resource: "leases"},
				{ns: "", verb: "list", resource: "pods"},
				{ns: "", verb: "list", resource: "nodes"},
				{ns: "", verb: "watch", resource: "nodes"},
				{ns: "", verb: "update", resource: "nodes"},
				{ns: "", verb: "patch", resource: "nodes"},
				{ns: "", verb: "delete", resource: "nodes"},
				{ns: "", verb: "update", resource: "nodes", sub: "status"},
				{ns: "", verb: "list", resource: "namespaces"},
			}...)
			if split {
				deny = append(deny,
					access{ns: release, verb: "list", resource: "pods"},
					access{ns: release, verb: "create", group: "events.k8s.io", resource: "events"},
					access{ns: tasks, verb: "update", group: "coordination.k8s.io", resource: "leases", name: "reaper"})
			}

			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			// The authorizer sees new bindings through its informers: wait
			// for the first allowed call before judging.
			if !eventually.Until(time.Minute, func() bool { return allowed(ctx, t, cs, user, release, allow[0]) },
				eventually.Every(100*time.Millisecond)) {
				t.Fatalf("the chart's ServiceAccount never got %s", allow[0])
			}
			for _, a := range allow {
				if !allowed(ctx, t, cs, user, release, a) {
					t.Errorf("denied %s: reaperd makes this call", a)
				}
			}
			for _, a := range deny {
				if allowed(ctx, t, cs, user, release, a) {
					t.Errorf("allowed %s: reaperd does not need it", a)
				}
			}
			if layout.runner {
				checkTaskServiceAccount(ctx, t, cs, tasks)
			}
		})
	}
}

// checkTaskServiceAccount: the chart made the kube runner's task
// ServiceAccount in the task namespace, mounting no token by default, and
// it may do nothing at all: its one use is the projected token for the
// attempt API's audience.
func checkTaskServiceAccount(ctx context.Context, t *testing.T, cs kubernetes.Interface, tasks string) {
	t.Helper()
	sa, err := cs.CoreV1().ServiceAccounts(tasks).Get(ctx, "reaper-task", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the task ServiceAccount: %v", err)
	}
	if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Errorf("the task ServiceAccount mounts a token by default (%v)", sa.AutomountServiceAccountToken)
	}
	task := "system:serviceaccount:" + tasks + ":reaper-task"
	for _, a := range []access{
		{ns: tasks, verb: "get", resource: "pods"},
		{ns: tasks, verb: "list", resource: "pods"},
		{ns: tasks, verb: "create", resource: "pods"},
		{ns: tasks, verb: "get", resource: "secrets"},
		{ns: tasks, verb: "create", resource: "serviceaccounts", sub: "token"},
		{ns: "", verb: "create", group: "authentication.k8s.io", resource: "tokenreviews"},
	} {
		if allowed(ctx, t, cs, task, tasks, a) {
			t.Errorf("the task ServiceAccount is allowed %s: it must hold no role", a)
		}
	}
}

// TestChartInstallsUpgradesAndRollsBackWithHelm runs what docs/operate.md
// tells an operator to run, with Helm itself against the API server:
// install, upgrade with --reuse-values, rollback; the ConfigMap follows
// each revision.
func TestChartInstallsUpgradesAndRollsBackWithHelm(t *testing.T) {
	c := kubetest.Current(t)
	ns := c.NewNamespace(t)
	cs := c.Client(t)
	run := func(args ...string) {
		t.Helper()
		out, err := helm(t, append(args, "--namespace", ns, "--kubeconfig", c.Kubeconfig())...)
		if err != nil {
			t.Fatalf("helm %v: %v\n%s", args, err, out)
		}
	}
	dryRun := func() string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "reaper", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the release's ConfigMap: %v", err)
		}
		for _, line := range strings.Split(cm.Data["reaper.hcl"], "\n") {
			if v, ok := strings.CutPrefix(line, "dry_run    = "); ok {
				return v
			}
		}
		t.Fatalf("no dry_run in the ConfigMap:\n%s", cm.Data["reaper.hcl"])
		return ""
	}

	deleteNamespaceAtCleanup(t, c, ns+"-tasks")
	run("install", "reaper", chartDir, "--set", "config.dryRun=true", "--set", "image.tag=v1")
	if got := dryRun(); got != "true" {
		t.Fatalf("after install: dry_run = %s", got)
	}
	run("upgrade", "reaper", chartDir, "--reuse-values", "--set", "config.dryRun=false")
	if got := dryRun(); got != "false" {
		t.Fatalf("after upgrade: dry_run = %s", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := cs.AppsV1().Deployments(ns).Get(ctx, "reaper", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if img := d.Spec.Template.Spec.Containers[0].Image; img != "reaper:v1" {
		t.Errorf("--reuse-values lost image.tag: %s", img)
	}
	run("rollback", "reaper", "1")
	if got := dryRun(); got != "true" {
		t.Fatalf("after rollback: dry_run = %s", got)
	}
	run("uninstall", "reaper")
	if _, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "reaper", metav1.GetOptions{}); err == nil {
		t.Errorf("the ConfigMap outlived helm uninstall")
	}
	// The task namespace the chart made stays, with whatever task pods
	// still run in it (docs/operate.md, "Uninstall").
	if n, err := cs.CoreV1().Namespaces().Get(ctx, ns+"-tasks", metav1.GetOptions{}); err != nil || n.DeletionTimestamp != nil {
		t.Errorf("the task namespace after helm uninstall: %v (%v), want it kept", n, err)
	}
}

// TestChartNetworkPolicyAdmitsTheTaskPodsAndTheMonitoringNamespaceOnly: the
// chart's NetworkPolicy selects reaperd's pods and lets in, on the
// telemetry port, the pods of the monitoring namespace, and on the attempt
// API's port (when it is served) the task pods and warm workers of the
// task namespace, by their labels; egress is not restricted. The real API
// server accepts it as rendered.
func TestChartNetworkPolicyAdmitsTheTaskPodsAndTheMonitoringNamespaceOnly(t *testing.T) {
	c := kubetest.Current(t)
	release, tasks := c.NewNamespace(t), c.NewNamespace(t)
	objs := render(t, release, append(attemptAPISecrets, "--set", "config.runner.enabled=true",
		"--set", "config.runner.kube.image=task:1", "--set", "taskNamespace.name="+tasks, "--set", "taskNamespace.create=false")...)
	apply(t, c, objs)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	np, err := c.Client(t).NetworkingV1().NetworkPolicies(release).Get(ctx, "reaper", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the API server has no NetworkPolicy: %v", err)
	}
	dep := find(t, objs, "Deployment", "reaper")
	podLabels, _, _ := unstructured.NestedStringMap(dep.Object, "spec", "template", "metadata", "labels")
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil || !sel.Matches(labels.Set(podLabels)) {
		t.Fatalf("the policy's podSelector %v does not select reaperd's pods %v (%v)", np.Spec.PodSelector, podLabels, err)
	}
	if len(np.Spec.PolicyTypes) != 1 || np.Spec.PolicyTypes[0] != "Ingress" {
		t.Errorf("policyTypes %v, want Ingress only (egress left open)", np.Spec.PolicyTypes)
	}
	rules := map[string][]string{} // port -> peers, as words
	for _, r := range np.Spec.Ingress {
		if len(r.Ports) != 1 || r.Ports[0].Port == nil {
			t.Fatalf("ingress rule %+v: want one named port", r)
		}
		var peers []string
		for _, p := range r.From {
			if p.IPBlock != nil {
				t.Errorf("an ipBlock peer on %s: %+v", r.Ports[0].Port, p.IPBlock)
			}
			word := "ns=" + p.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"]
			if p.PodSelector != nil {
				for _, e := range p.PodSelector.MatchExpressions {
					word += " " + e.Key + " " + string(e.Operator)
				}
			}
			peers = append(peers, word)
		}
		rules[r.Ports[0].Port.String()] = peers
	}
	want := map[string][]string{
		"metrics":     {"ns=monitoring"},
		"attempt-api": {"ns=" + tasks + " leoflow.io/run-id Exists", "ns=" + tasks + " leoflow.io/warm-pool Exists"},
	}
	if fmt.Sprint(rules) != fmt.Sprint(want) {
		t.Errorf("ingress\n got %v\nwant %v", rules, want)
	}
	// Without the attempt API only telemetry is let in; with another
	// monitoring namespace, that one.
	off := convertNP(t, find(t, render(t, "ns", "--set", "networkPolicy.telemetryNamespace=observability"), "NetworkPolicy", "reaper"))
	if len(off.Spec.Ingress) != 1 || off.Spec.Ingress[0].From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "observability" {
		t.Errorf("attempt API off: ingress %+v, want telemetry from observability alone", off.Spec.Ingress)
	}
	if strings.Contains(kinds(render(t, "ns", "--set", "networkPolicy.enabled=false")), "NetworkPolicy/") {
		t.Errorf("a NetworkPolicy rendered while disabled")
	}
}

// TestChartTaskEgressPolicyLetsTheTaskPodsReachNamesAndTheAttemptAPIOnly:
// off by default; on, a policy in the task namespace selects every pod of
// it (a pod without a task's labels too) and lets out DNS, the attempt API
// on reaperd's pods (when it is served) and the operator's extraEgress
// rules, nothing else. The real API server accepts it as rendered. Its
// enforcement is proven in test/install.
func TestChartTaskEgressPolicyLetsTheTaskPodsReachNamesAndTheAttemptAPIOnly(t *testing.T) {
	if strings.Contains(kinds(render(t, "ns")), "reaper-task-egress") {
		t.Errorf("a task egress policy rendered by default")
	}
	c := kubetest.Current(t)
	release, tasks := c.NewNamespace(t), c.NewNamespace(t)
	objs := render(t, release, append(attemptAPISecrets, "--set", "config.runner.enabled=true",
		"--set", "config.runner.kube.image=task:1", "--set", "taskNamespace.name="+tasks, "--set", "taskNamespace.create=false",
		"--set", "networkPolicy.taskEgress.enabled=true",
		"--set-json", `networkPolicy.taskEgress.extraEgress=[{"to":[{"ipBlock":{"cidr":"0.0.0.0/0","except":["10.0.5.10/32"]}}]}]`)...)
	apply(t, c, objs)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	np, err := c.Client(t).NetworkingV1().NetworkPolicies(tasks).Get(ctx, "reaper-task-egress", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the API server has no task egress policy in the task namespace: %v", err)
	}
	if len(np.Spec.PodSelector.MatchLabels)+len(np.Spec.PodSelector.MatchExpressions) != 0 {
		t.Errorf("podSelector %+v, want every pod of the task namespace", np.Spec.PodSelector)
	}
	if fmt.Sprint(np.Spec.PolicyTypes) != "[Egress]" {
		t.Errorf("policyTypes %v, want Egress only", np.Spec.PolicyTypes)
	}
	var rules []string
	for _, r := range np.Spec.Egress {
		var words []string
		for _, p := range r.Ports {
			words = append(words, fmt.Sprintf("%s/%s", p.Port, *p.Protocol))
		}
		for _, p := range r.To {
			switch {
			case p.IPBlock != nil:
				words = append(words, fmt.Sprintf("cidr %s except %v", p.IPBlock.CIDR, p.IPBlock.Except))
			default:
				words = append(words, fmt.Sprintf("ns=%s pods=%v", p.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"],
					p.PodSelector.MatchLabels))
			}
		}
		rules = append(rules, strings.Join(words, " "))
	}
	dep := find(t, objs, "Deployment", "reaper")
	podLabels, _, _ := unstructured.NestedStringMap(dep.Object, "spec", "template", "metadata", "labels")
	want := []string{
		"53/UDP 53/TCP",
		fmt.Sprintf("9465/TCP ns=%s pods=map[app.kubernetes.io/instance:reaper app.kubernetes.io/name:reaper]", release),
		"cidr 0.0.0.0/0 except [10.0.5.10/32]",
	}
	if fmt.Sprint(rules) != fmt.Sprint(want) {
		t.Errorf("egress\n got %q\nwant %q", rules, want)
	}
	sel := labels.SelectorFromSet(np.Spec.Egress[1].To[0].PodSelector.MatchLabels)
	if !sel.Matches(labels.Set(podLabels)) {
		t.Errorf("the attempt API peer %v does not select reaperd's pods %v", sel, podLabels)
	}
	// Without the attempt API, names only.
	off := convertNP(t, find(t, render(t, "ns", "--set", "networkPolicy.taskEgress.enabled=true"), "NetworkPolicy", "reaper-task-egress"))
	if len(off.Spec.Egress) != 1 || len(off.Spec.Egress[0].To) != 0 || off.Namespace != "ns-tasks" {
		t.Errorf("attempt API off: %s egress %+v, want names alone in ns-tasks", off.Namespace, off.Spec.Egress)
	}
}

func convertNP(t *testing.T, o *unstructured.Unstructured) *networkingv1.NetworkPolicy {
	t.Helper()
	return convert[networkingv1.NetworkPolicy](t, o)
}

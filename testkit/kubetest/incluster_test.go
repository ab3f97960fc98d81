package kubetest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/dexaflow/reaper/testkit/eventually"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// A cluster for in-cluster workloads places a Deployment's pod with its
// scheduler (nothing binds it), routes a Service's ClusterIP to it with
// kube-proxy, answers the Service's name with its cluster DNS, and routes
// the kubernetes Service to the API server; its Stop leaves no process,
// mount, netns, bridge or kube-proxy chain behind.
func TestInClusterHostsWorkloadsAndStopLeavesNothingBehind(t *testing.T) {
	if why := kubetest.HostCheck(); why != "" {
		c, err := kubetest.Start(t.Context(), kubetest.Options{BaseDir: t.TempDir(), InCluster: true})
		if err == nil {
			_ = c.Stop()
			t.Fatal("an in-cluster cluster started on a machine that cannot host its node")
		}
		if os.Getenv(kubetest.EnvRequireRealNode) == "1" {
			t.Fatalf("the real node is required (%s=1): %s", kubetest.EnvRequireRealNode, why)
		}
		t.Skipf("no real node: %s", why)
	}
	begin := time.Now()
	c, err := kubetest.Start(t.Context(), kubetest.Options{BaseDir: t.TempDir(), InCluster: true})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = c.Stop()
		}
	}()
	n := c.NeedRealNode(t)
	t.Logf("in-cluster cluster up in %s (node Ready %s after its start)", time.Since(begin).Round(time.Millisecond), n.Ready.Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	const image = "reaper.local/kubetest-incluster:v1"
	if err := n.ImportTaskImage(ctx, image, staticStandIn(t)); err != nil {
		t.Fatal(err)
	}
	const probeImage = "reaper.local/kubetest-netprobe:v1"
	probe := filepath.Join(t.TempDir(), "netprobe")
	build := exec.CommandContext(ctx, "go", "build", "-o", probe, "github.com/dexaflow/reaper/testkit/netprobe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build netprobe: %v\n%s", err, out)
	}
	if err := n.ImportImage(ctx, probeImage, []string{"-file", probe + "=/netprobe", "-entrypoint", "/netprobe"}); err != nil {
		t.Fatal(err)
	}
	cs := c.Client(t)
	const ns = "incluster" // removed with the cluster, which this test stops itself
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The ServiceAccount admission plugin is on: a pod waits for its
	// namespace's default ServiceAccount.
	if !eventually.Until(time.Minute, func() bool {
		_, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	}, eventually.Every(100*time.Millisecond)) {
		t.Fatal("the namespace's default ServiceAccount never appeared")
	}

	labels := map[string]string{"app": "web"}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To[int32](1),
		Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "web", Image: image, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", "mkdir -p /tmp/www && echo served-by-web > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www"},
				Ports:   []corev1.ContainerPort{{ContainerPort: 8080}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
					HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1}}}}},
	}}
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.ServiceSpec{
		Selector: labels, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var web corev1.Pod
	if !eventually.Until(2*time.Minute, func() bool {
		list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil || len(list.Items) != 1 {
			return false
		}
		web = list.Items[0]
		return podReady(web)
	}, eventually.Every(200*time.Millisecond)) {
		t.Fatalf("the Deployment's pod is not Ready: %+v\n%s", web.Status, n.ContainerLogs(ns, web.Name))
	}
	if web.Spec.NodeName != n.Name {
		t.Fatalf("the Deployment's pod is on %q, want the real node %s (placed by the scheduler)", web.Spec.NodeName, n.Name)
	}

	// A client pod, placed by the scheduler too, checking with Go's
	// resolver (the one reaperd and its agents use): the Service by its
	// short name (the pod's search path), by its full name and by its
	// ClusterIP, and the API server through the kubernetes Service's name.
	client, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "client"}, Spec: corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever,
		Containers: []corev1.Container{{Name: "client", Image: probeImage, ImagePullPolicy: corev1.PullNever,
			Command: []string{"/netprobe",
				"resolve:web=" + svc.Spec.ClusterIP,
				fmt.Sprintf("resolve:web.%s.svc.%s=%s", ns, kubetest.ClusterDomain, svc.Spec.ClusterIP),
				"resolve:kubernetes.default.svc=" + kubetest.KubernetesServiceIP,
				"get:http://web/=served-by-web",
				fmt.Sprintf("get:http://web.%s.svc/=served-by-web", ns),
				fmt.Sprintf("get:http://%s/=served-by-web", svc.Spec.ClusterIP),
				"dial:kubernetes.default.svc:443",
			}}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	end, err := kubetest.WaitPod(ctx, cs, client, func(p *corev1.Pod) bool {
		return p != nil && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed)
	})
	if err != nil {
		t.Fatal(err)
	}
	if end.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("the client pod %s:\n%s", end.Status.Phase, n.ContainerLogs(ns, "client"))
	}

	// NetworkPolicies are enforced: ingress to the web pod only from pods
	// labelled role=client.
	if on, why := c.NetworkPolicies(); !on {
		if os.Getenv(kubetest.EnvRequireRealNode) == "1" {
			t.Fatalf("no NetworkPolicy enforcer (required with the real node): %s", why)
		}
		t.Logf("NetworkPolicies not checked: %s", why)
	} else {
		np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: labels},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}}}}}},
		}}
		if _, err := cs.NetworkingV1().NetworkPolicies(ns).Create(ctx, np, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for i, tc := range []struct {
			labels map[string]string
			check  string
		}{
			{nil, "nodial:" + web.Status.PodIP + ":8080"},
			{nil, "nodial:" + svc.Spec.ClusterIP + ":80"},
			{map[string]string{"role": "client"}, "dial:" + web.Status.PodIP + ":8080"},
			{map[string]string{"role": "client"}, "get:http://web/=served-by-web"},
		} {
			// The rules follow the policy within a sync: a refusal is
			// asked again until it holds.
			if !eventually.Until(30*time.Second, func() bool {
				name := fmt.Sprintf("np-%d-%d", i, time.Now().UnixNano()%100000)
				p, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: tc.labels},
					Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
						Name: "probe", Image: probeImage, ImagePullPolicy: corev1.PullNever,
						Command: []string{"/netprobe", tc.check}}}}}, metav1.CreateOptions{})
				if err != nil {
					t.Fatal(err)
				}
				end, err := kubetest.WaitPod(ctx, cs, p, func(p *corev1.Pod) bool {
					return p != nil && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed)
				})
				return err == nil && end.Status.Phase == corev1.PodSucceeded
			}, eventually.Every(time.Second)) {
				t.Errorf("NetworkPolicy check %q from a pod labelled %v did not hold", tc.check, tc.labels)
			}
		}
	}

	dir := c.Dir()
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped = true
	if left := kubetest.NodeLeftovers(dir); len(left) > 0 {
		t.Errorf("after Stop the in-cluster cluster left:\n%s", strings.Join(left, "\n"))
	}
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

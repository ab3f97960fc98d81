package install_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/testkit/helmrelease"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// The chart's NetworkPolicy, with the test cluster's enforcer: the
// attempt API takes connections from the task pods (every run of the tier
// reports through it) and from no other pod, the telemetry port from the
// pods of the namespace the values name (monitoring by default) and no
// other. The policy is ingress to reaperd's pods only: what the task pods
// may reach beyond them (the database among it) is the operator's own
// policy to write.

// probeImage runs netprobe (testkit/netprobe) as its entrypoint.
const probeImage = "reaper.local/install-netprobe:v1"

// phaseNetworkPolicy probes a replica's two ports from pods in the task
// namespace, in another namespace and in the telemetry namespace.
func (r *release) phaseNetworkPolicy(ctx context.Context, t *testing.T, _ *ledger) {
	if on, why := r.Cluster.NetworkPolicies(); !on {
		if os.Getenv(kubetest.EnvRequireRealNode) == "1" {
			t.Fatalf("no NetworkPolicy enforcer: %s", why)
		}
		t.Skipf("no NetworkPolicy enforcer: %s", why)
	}
	probe := filepath.Join(binDir, "netprobe")
	build := exec.CommandContext(ctx, "go", "build", "-o", probe, "github.com/dexaflow/reaper/testkit/netprobe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build netprobe: %v\n%s", err, out)
	}
	if err := r.Node.ImportImage(ctx, probeImage, []string{"-file", probe + "=/netprobe", "-entrypoint", "/netprobe"}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"monitoring", "elsewhere"} {
		if _, err := r.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
			metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Client.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	}
	r.waitServiceAccount(ctx, "monitoring")
	r.waitServiceAccount(ctx, "elsewhere")
	pods, err := r.Replicas(ctx)
	r.check(err)
	ip := pods[0].Status.PodIP
	api, telemetry := ip+":9465", ip+":"+helmrelease.TelemetryPort
	service := fmt.Sprintf("%s-attempt-api.%s.svc:443", helmrelease.Name, helmrelease.Namespace)
	for _, tc := range []struct {
		ns     string
		checks []string
	}{
		{helmrelease.TaskNamespace, []string{"nodial:" + api, "nodial:" + telemetry, "nodial:" + service}},
		{"elsewhere", []string{"nodial:" + api, "nodial:" + telemetry, "nodial:" + service}},
		{"monitoring", []string{"dial:" + telemetry, "nodial:" + api}},
	} {
		r.probe(ctx, tc.ns, tc.checks)
	}
}

// waitServiceAccount waits for a namespace's default ServiceAccount (a pod
// waits for it).
func (r *release) waitServiceAccount(ctx context.Context, ns string) {
	r.t.Helper()
	for ctx.Err() == nil {
		if _, err := r.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// probe runs netprobe with checks in a pod of ns (no labels, the
// namespace's default ServiceAccount) and fails unless every check holds.
func (r *release) probe(ctx context.Context, ns string, checks []string) {
	r.t.Helper()
	p, err := r.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "netprobe-"},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
			Name: "probe", Image: probeImage, ImagePullPolicy: corev1.PullNever, Command: append([]string{"/netprobe"}, checks...)}}}},
		metav1.CreateOptions{})
	if err != nil {
		r.t.Fatalf("create a probe pod in %s: %v", ns, err)
	}
	end, err := kubetest.WaitPod(ctx, r.Client, p, func(p *corev1.Pod) bool {
		return p != nil && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed)
	})
	if err != nil {
		r.t.Fatal(err)
	}
	if end.Status.Phase != corev1.PodSucceeded {
		r.t.Errorf("from namespace %s, %v did not hold:\n%s", ns, checks, r.Node.ContainerLogs(ns, p.Name))
	}
}

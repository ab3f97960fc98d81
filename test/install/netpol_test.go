package install_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/testkit/helmrelease"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// The chart's NetworkPolicies, with the test cluster's enforcer: the
// attempt API takes connections from the task pods (every run of the tier
// reports through it) and from no other pod, the telemetry port from the
// pods of the namespace the values name (monitoring by default) and no
// other. With networkPolicy.taskEgress on, a pod of the task namespace
// reaches names, the attempt API (a run's tasks report through it) and
// what extraEgress lets out, and not the database, the API server or
// telemetry, while a pod elsewhere still reaches the database.

// probeImage runs netprobe (testkit/netprobe) as its entrypoint.
const probeImage = "reaper.local/install-netprobe:v1"

// phaseNetworkPolicy probes a replica's two ports from pods in the task
// namespace, in another namespace and in the telemetry namespace.
func (r *release) phaseNetworkPolicy(ctx context.Context, t *testing.T, lg *ledger) {
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
	r.taskEgress(ctx, lg, telemetry)
}

// taskEgress upgrades the release with networkPolicy.taskEgress on, its
// extraEgress letting out the ledger alone, then probes from the task
// namespace and elsewhere and runs a run through it. Nothing of reaperd's
// pods changes, so the upgrade rolls no replica.
func (r *release) taskEgress(ctx context.Context, lg *ledger, telemetry string) {
	r.t.Helper()
	ledgerAddr := strings.TrimPrefix(lg.url, "http://")
	_, ledgerPort, err := net.SplitHostPort(ledgerAddr)
	r.check(err)
	extra := fmt.Sprintf(`[{"to":[{"ipBlock":{"cidr":"%s/32"}}],"ports":[{"port":%s,"protocol":"TCP"}]}]`,
		kubetest.NodeGateway, ledgerPort)
	out, err := r.Upgrade(ctx, firstVersion, "--set", "networkPolicy.taskEgress.enabled=true",
		"--set-json", "networkPolicy.taskEgress.extraEgress="+extra, "--wait", "--timeout", "2m")
	if err != nil {
		r.t.Fatalf("helm upgrade with the task egress policy: %v\n%s", err, out)
	}
	pg, err := pgconn.ParseConfig(r.PodDSN())
	r.check(err)
	db := net.JoinHostPort(pg.Host, fmt.Sprint(pg.Port))
	apiURL, err := url.Parse(r.Cluster.AdminConfig().Host)
	r.check(err)
	service := fmt.Sprintf("%s-attempt-api.%s.svc.cluster.local", helmrelease.Name, helmrelease.Namespace)
	svc, err := r.Client.CoreV1().Services(helmrelease.Namespace).Get(ctx, helmrelease.Name+"-attempt-api", metav1.GetOptions{})
	r.check(err)
	// The enforcer takes a new pod in a moment after it starts: the first
	// refusal waits for it (blocked), the others then run once.
	r.probe(ctx, helmrelease.TaskNamespace, []string{"blocked:" + db, "dial:" + ledgerAddr,
		"resolve:" + service + "=" + svc.Spec.ClusterIP, "nodial:" + db, "nodial:" + apiURL.Host,
		"nodial:10.96.0.1:443", "nodial:" + telemetry})
	r.probe(ctx, "elsewhere", []string{"dial:" + db, "dial:" + apiURL.Host})
	// The task pods, under the policy, reach the attempt API by name and
	// the ledger, and succeed.
	const runID = "install-egress"
	r.submitLedger(ctx, lg, runID, "a", "b")
	lg.release(runID)
	r.expectSuccess(ctx, runID, 2*time.Minute)
	r.expectOneExecution(lg, runID, "a", "b")
	r.check(r.WaitReleased(ctx))
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

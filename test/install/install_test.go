package install_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/testkit/eventually"
)

// firstVersion is the version the tier's image is stamped with.
const firstVersion = "0.0.1-install"

// TestInstalledRelease installs the chart from the image with the values a
// user would set and lives with it as its users do, one phase after the
// other on the one release:
//
//   - install: both replicas are placed by the scheduler and Ready by
//     their own probes, and one holds the Lease;
//   - run: a run submitted from the machine is dispatched by the
//     in-cluster kube runner as task pods whose agents reach the attempt
//     API through its Service by name, and every task succeeds;
//   - the chart's NetworkPolicy, enforced: the attempt API and the
//     telemetry port refuse pods other than the task pods and the
//     telemetry namespace's;
//   - faults (the leading replica's pod deleted, its reaperd killed in its
//     container, a task pod deleted, an agent killed in its container, the
//     node's kubelet frozen past the node's grace): no attempt that lived
//     is reaped, no task runs twice at once (the ledger), no run is left
//     wedged;
//   - day two: helm upgrade to a second image with a migration of its own
//     while tasks run (never two leaders, the tasks untouched and run once,
//     the migration applied once), helm rollback to the first (the
//     migration is additive: the older binary serves on), and a replica
//     below a raised migration floor (it says why in its log and its
//     readiness and is not Ready);
//   - what users get wrong: the DSN Secret with a wrong password, then
//     missing (the replica says so in its readiness and log, is not Ready
//     and does not crash-loop), and an upgrade to an image tag that does
//     not exist (the upgrade fails, the new replica names the image, the
//     other serves on; helm rollback mends it);
//   - uninstall: no replica, Lease, admission policy or finalizer is left.
func TestInstalledRelease(t *testing.T) {
	r := newRelease(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	defer func() {
		if t.Failed() {
			r.dump(context.Background())
		}
	}()
	r.install(ctx, firstVersion)
	lg := startLedger(t)
	phases := []struct {
		name string
		run  func(context.Context, *testing.T, *ledger)
	}{
		{"run", r.phaseRun},
		{"the chart's NetworkPolicy", r.phaseNetworkPolicy},
		{"leader pod deleted", r.phaseLeaderLost(false)},
		{"leader killed in its container", r.phaseLeaderLost(true)},
		{"task pod deleted", r.phaseTaskPodDeleted},
		{"agent killed in its container", r.phaseAgentKilled},
		{"kubelet frozen past the node grace", r.phaseKubeletFrozen},
		{"upgrade to a second image and migration", r.phaseUpgrade},
		{"rollback across the additive migration", r.phaseRollback},
		{"a binary below the migration floor", r.phaseBelowFloor},
		{"the DSN Secret wrong, then missing", r.phaseBadDSN},
		{"an image tag that does not exist", r.phaseBadImageTag},
		{"uninstall", func(ctx context.Context, t *testing.T, _ *ledger) { r.uninstall(ctx) }},
	}
	for _, ph := range phases {
		if !t.Run(ph.name, func(t *testing.T) { r.t = t; ph.run(ctx, t, lg) }) {
			r.t = t
			t.FailNow()
		}
	}
	r.t = t
	if d := lg.doubleExecutions(); len(d) > 0 {
		t.Errorf("double executions: %v", d)
	}
}

// install builds the image stamped version, imports it into the node and
// installs the chart with it, waiting for both replicas to be Ready.
func (r *release) install(ctx context.Context, version string) {
	t := r.t
	t.Helper()
	begin := time.Now()
	tar := buildImage(ctx, t, version)
	if err := r.node.ImportArchive(ctx, tar); err != nil {
		t.Fatal(err)
	}
	t.Logf("image %s built and imported into the node in %s", version, time.Since(begin).Round(time.Second))

	begin = time.Now()
	out, err := r.helm(ctx, "install", releaseName, r.chart(), "--namespace", releaseNS,
		"--values", r.values(version), "--wait", "--timeout", "4m")
	if err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	// helm's --wait holds a Deployment ready with maxUnavailable replicas
	// not: wait for both, by their own probes.
	r.waitReplicasReady(ctx)
	t.Logf("helm install: both replicas Ready %s after it began", time.Since(begin).Round(100*time.Millisecond))

	pods := r.replicas(ctx)
	if len(pods) != 2 {
		t.Fatalf("%d reaperd pods, want 2", len(pods))
	}
	for _, p := range pods {
		if p.Spec.NodeName != r.node.Name {
			t.Errorf("pod %s placed on %q, want the real node %s (by the scheduler)", p.Name, p.Spec.NodeName, r.node.Name)
		}
		if !ready(p) {
			t.Errorf("pod %s is not Ready: %v", p.Name, p.Status.Conditions)
		}
	}
	if pod := r.leader(ctx, ""); pod.Name == "" {
		t.Fatal("no replica holds the Lease")
	}
	// The plugins cannot read the DSN file in the container either: the
	// Landlock confinement works under the node's default seccomp profile.
	for _, p := range r.replicas(ctx) {
		if v := r.metric(ctx, p, "reaper_plugin_secrets_hidden"); v != "1" {
			t.Errorf("pod %s: reaper_plugin_secrets_hidden = %q, want 1 (the plugins are not kept from reaperd's secrets)", p.Name, v)
		}
	}
}

// metric reads one unlabelled metric of a replica from its telemetry port,
// on the pod's address (the machine routes to the pod network).
func (r *release) metric(ctx context.Context, p corev1.Pod, name string) string {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(p.Status.PodIP, "9464")+"/metrics", nil)
	if err != nil {
		r.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatalf("read pod %s's metrics: %v", p.Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatalf("read pod %s's metrics: %v", p.Name, err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// leader waits for a replica other than the one holding the identity not
// to hold the Lease, and returns it and the identity it holds it with.
func (r *release) leader(ctx context.Context, not string) corev1.Pod {
	r.t.Helper()
	var pod corev1.Pod
	eventually.Until(2*time.Minute, func() bool {
		h := r.leaseHolder(ctx)
		if h == "" || h == not {
			return false
		}
		for _, p := range r.replicas(ctx) {
			if strings.HasPrefix(h, p.Name) && p.DeletionTimestamp == nil {
				pod = p
				return true
			}
		}
		return false
	}, eventually.Every(200*time.Millisecond))
	return pod
}

// phaseRun: a run of four tasks succeeds, each in a pod the runner
// recorded; the sweep then releases every pod it held.
func (r *release) phaseRun(ctx context.Context, t *testing.T, _ *ledger) {
	begin := time.Now()
	const runID = "install-1"
	r.submit(ctx, runID, 4, "echo hello; sleep 1")
	r.expectSuccess(ctx, runID, 3*time.Minute)
	t.Logf("submit to every task succeeded: %s", time.Since(begin).Round(100*time.Millisecond))
	r.checkPodsWereTheRunners(ctx, runID)
	r.waitReleased(ctx)
}

// expectSuccess waits for the run to succeed with every task.
func (r *release) expectSuccess(ctx context.Context, runID string, within time.Duration) {
	r.t.Helper()
	state, tasks := r.waitRun(ctx, runID, within)
	if state != "success" {
		r.t.Fatalf("run %s: %q (tasks %v), want success (a wedged run if still running)", runID, state, tasks)
	}
	for id, st := range tasks {
		if st != "success" {
			r.t.Errorf("run %s task %s: %s, want success", runID, id, st)
		}
	}
}

// waitReleased waits for the sweep to release every task pod it held.
func (r *release) waitReleased(ctx context.Context) {
	r.t.Helper()
	if !eventually.Until(time.Minute, func() bool { return len(r.heldTaskPods(ctx)) == 0 }, eventually.Every(250*time.Millisecond)) {
		r.t.Fatalf("task pods still held by the outcome record finalizer after their runs ended: %v", r.heldTaskPods(ctx))
	}
}

// uninstall runs helm uninstall and checks what it leaves.
func (r *release) uninstall(ctx context.Context) {
	begin := time.Now()
	if out, err := r.helm(ctx, "uninstall", releaseName, "--namespace", releaseNS, "--wait", "--timeout", "2m"); err != nil {
		r.t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	r.checkUninstalled(ctx)
	r.t.Logf("helm uninstall --wait: %s", time.Since(begin).Round(100*time.Millisecond))
}

func ready(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// checkPodsWereTheRunners checks that every task's attempt ran in a pod of
// the task namespace the board recorded (the in-cluster runner created it
// and wrote its UID).
func (r *release) checkPodsWereTheRunners(ctx context.Context, runID string) {
	r.t.Helper()
	rows, err := r.board.Query(ctx, `SELECT task_id, coalesce(pod_uid, '') FROM task_instances WHERE run_id = $1`, runID)
	if err != nil {
		r.t.Fatalf("read the pods of run %s: %v", runID, err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var task, uid string
		if err := rows.Scan(&task, &uid); err != nil {
			r.t.Fatal(err)
		}
		if uid == "" {
			r.t.Errorf("task %s has no pod recorded", task)
		}
		n++
	}
	if n == 0 {
		r.t.Fatalf("run %s has no tasks", runID)
	}
}

// checkUninstalled checks what helm uninstall must leave: no reaperd pod,
// no Lease, no admission policy or binding of the release, no task pod
// held by the outcome record finalizer.
func (r *release) checkUninstalled(ctx context.Context) {
	r.t.Helper()
	if !eventually.Until(time.Minute, func() bool { return len(r.replicas(ctx)) == 0 }, eventually.Every(200*time.Millisecond)) {
		r.t.Errorf("reaperd pods left after uninstall: %d", len(r.replicas(ctx)))
	}
	if h := r.leaseHolder(ctx); h != "" {
		r.t.Errorf("the Lease is left, held by %q", h)
	}
	if _, err := r.cs.CoordinationV1().Leases(releaseNS).Get(ctx, releaseName, metav1.GetOptions{}); err == nil {
		r.t.Errorf("the Lease %s is left after uninstall", releaseName)
	}
	sel := metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + releaseName}
	if ps, err := r.cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(ctx, sel); err != nil || len(ps.Items) != 0 {
		r.t.Errorf("admission policies left after uninstall: %d %v", len(ps.Items), err)
	}
	if bs, err := r.cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().List(ctx, sel); err != nil || len(bs.Items) != 0 {
		r.t.Errorf("admission policy bindings left after uninstall: %d %v", len(bs.Items), err)
	}
	for _, p := range r.heldTaskPods(ctx) {
		r.t.Errorf("task pod %s still held by %s after uninstall", p, kube.FinalizerOutcomeRecord)
	}
}

// heldTaskPods lists the task pods that carry the outcome record
// finalizer.
func (r *release) heldTaskPods(ctx context.Context) []string {
	r.t.Helper()
	pods, err := r.cs.CoreV1().Pods(taskNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		r.t.Fatal(err)
	}
	var held []string
	for _, p := range pods.Items {
		if slices.Contains(p.Finalizers, kube.FinalizerOutcomeRecord) {
			held = append(held, p.Name)
		}
	}
	return held
}

package install_test

import (
	"context"
	"testing"
	"time"

	"github.com/dexaflow/reaper/testkit/helmrelease"
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
//   - the chart's NetworkPolicies, enforced: the attempt API and the
//     telemetry port refuse pods other than the task pods and the
//     telemetry namespace's; with the task egress policy on, a pod of the
//     task namespace is refused the database, the API server and
//     telemetry, and a run's tasks still succeed;
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
	r.check(r.ImportImage(ctx, helmrelease.ImageOptions{Version: version}))
	took, err := r.Install(ctx, version)
	r.check(err)
	t.Logf("helm install: both replicas Ready %s after it began", took.Round(100*time.Millisecond))

	pods, err := r.Replicas(ctx)
	r.check(err)
	if len(pods) != 2 {
		t.Fatalf("%d reaperd pods, want 2", len(pods))
	}
	for _, p := range pods {
		if p.Spec.NodeName != r.Node.Name {
			t.Errorf("pod %s placed on %q, want the real node %s (by the scheduler)", p.Name, p.Spec.NodeName, r.Node.Name)
		}
		if !helmrelease.Ready(p) {
			t.Errorf("pod %s is not Ready: %v", p.Name, p.Status.Conditions)
		}
	}
	if _, _, err := r.Leader(ctx, ""); err != nil {
		t.Fatalf("no replica holds the Lease: %v", err)
	}
	// The plugins cannot read the DSN file in the container either: the
	// Landlock confinement works under the node's default seccomp profile.
	for _, p := range pods {
		mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		v, err := helmrelease.Metric(mctx, p.Status.PodIP, "reaper_plugin_secrets_hidden")
		cancel()
		if err != nil {
			t.Fatalf("read pod %s's metrics: %v", p.Name, err)
		}
		if v != "1" {
			t.Errorf("pod %s: reaper_plugin_secrets_hidden = %q, want 1 (the plugins are not kept from reaperd's secrets)", p.Name, v)
		}
	}
}

// phaseRun: a run of four tasks succeeds, each in a pod the runner
// recorded; the sweep then releases every pod it held.
func (r *release) phaseRun(ctx context.Context, t *testing.T, _ *ledger) {
	begin := time.Now()
	const runID = "install-1"
	r.check(r.Submit(ctx, runID, 4, "echo hello; sleep 1"))
	r.expectSuccess(ctx, runID, 3*time.Minute)
	t.Logf("submit to every task succeeded: %s", time.Since(begin).Round(100*time.Millisecond))
	r.checkPodsWereTheRunners(ctx, runID)
	r.check(r.WaitReleased(ctx))
}

// expectSuccess waits for the run to succeed with every task.
func (r *release) expectSuccess(ctx context.Context, runID string, within time.Duration) {
	r.t.Helper()
	state, tasks, err := r.WaitRun(ctx, runID, within)
	if state != helmrelease.RunSuccess {
		r.t.Fatalf("run %s: %q (tasks %v), want success (a wedged run if still running): %v", runID, state, tasks, err)
	}
	for id, st := range tasks {
		if st != helmrelease.RunSuccess {
			r.t.Errorf("run %s task %s: %s, want success", runID, id, st)
		}
	}
}

// uninstall runs helm uninstall and checks what it leaves.
func (r *release) uninstall(ctx context.Context) {
	begin := time.Now()
	left, err := r.Uninstall(ctx)
	r.check(err)
	for _, left := range left {
		r.t.Errorf("left after uninstall: %s", left)
	}
	r.t.Logf("helm uninstall --wait: %s", time.Since(begin).Round(100*time.Millisecond))
}

// checkPodsWereTheRunners checks that every task's attempt ran in a pod of
// the task namespace the board recorded (the in-cluster runner created it
// and wrote its UID).
func (r *release) checkPodsWereTheRunners(ctx context.Context, runID string) {
	r.t.Helper()
	pods, err := r.RecordedPods(ctx, runID)
	r.check(err)
	for task, uid := range pods {
		if uid == "" {
			r.t.Errorf("task %s has no pod recorded", task)
		}
	}
	if len(pods) == 0 {
		r.t.Fatalf("run %s has no tasks", runID)
	}
}

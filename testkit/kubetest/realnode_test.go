package kubetest_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/testkit/kubetest"
)

// fakeT records what NeedRealNode does with a test.
type fakeT struct{ skipped, failed string }

func (f *fakeT) Helper()                          {}
func (f *fakeT) Skipf(format string, args ...any) { f.skipped = format }
func (f *fakeT) Fatalf(format string, _ ...any)   { f.failed = format }

// A machine that cannot host a real node (simulated with
// RealNodeUnavailable) starts the cluster without one; a test that needs
// it skips with the reason, and with REAPER_REQUIRE_REAL_NODE=1 fails.
func TestRealNodeUnavailableIsASkipWithItsReasonUnlessRequired(t *testing.T) {
	c, err := kubetest.Start(t.Context(), kubetest.Options{BaseDir: t.TempDir(), NoControllerManager: true,
		RealNode: true, RealNodeUnavailable: "no runc on PATH (simulated)"})
	if err != nil {
		t.Fatalf("a machine without a real node must still start the cluster: %v", err)
	}
	defer c.Stop()
	n, why := c.RealNode()
	if n != nil || why != "no runc on PATH (simulated)" {
		t.Fatalf("RealNode() = %v, %q; want none with the reason", n, why)
	}
	t.Setenv(kubetest.EnvRequireRealNode, "")
	var skip fakeT
	c.NeedRealNode(&skip)
	if skip.skipped == "" || skip.failed != "" {
		t.Errorf("without %s: skipped %q failed %q, want a skip", kubetest.EnvRequireRealNode, skip.skipped, skip.failed)
	}
	t.Setenv(kubetest.EnvRequireRealNode, "1")
	var req fakeT
	c.NeedRealNode(&req)
	if req.failed == "" {
		t.Errorf("with %s=1 the missing node must fail the test, got skip %q", kubetest.EnvRequireRealNode, req.skipped)
	}
}

// The real node runs a pod for real (Running in its own sandbox) on a
// bridge whose address a pod's joining does not change, and the
// cluster's Stop leaves no kubelet, containerd, shim, mount under
// the cluster's directory, /kubepods cgroup, netns or bridge behind.
func TestRealNodeRunsAPodAndStopLeavesNothingBehind(t *testing.T) {
	c, err := kubetest.Start(t.Context(), kubetest.Options{BaseDir: t.TempDir(), NoControllerManager: true, RealNode: true})
	if err != nil {
		t.Fatal(err) // on a machine that can host one, a failure is a failure
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = c.Stop()
		}
	}()
	n := c.NeedRealNode(t)
	t.Logf("real node %s Ready %s after its start", n.Name, n.Ready.Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := n.ImportTaskImage(ctx, "reaper.local/kubetest-task:v1", staticStandIn(t)); err != nil {
		t.Fatal(err)
	}
	cs := c.Client(t)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "real", Namespace: "default"}, Spec: corev1.PodSpec{
		NodeName: n.Name, RestartPolicy: corev1.RestartPolicyNever,
		Containers: []corev1.Container{{Name: "task", Image: "reaper.local/kubetest-task:v1", ImagePullPolicy: corev1.PullNever,
			Command: []string{"sh", "-c", "echo recorded > /dev/termination-log; sleep 600"}}}}}
	created, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	if _, err := kubetest.WaitPod(ctx, cs, created, func(p *corev1.Pod) bool { return p != nil && p.Status.Phase == corev1.PodRunning }); err != nil {
		t.Fatal(err)
	}
	t.Logf("pod Running %s after its create", time.Since(begin).Round(time.Millisecond))
	// A pod's veth joined the bridge: its hardware address must not have
	// followed the port's (the running pods' neighbour caches would go
	// stale whenever a pod comes or goes).
	if mac, err := os.ReadFile("/sys/class/net/" + kubetest.NodeBridge + "/address"); err != nil || strings.TrimSpace(string(mac)) != kubetest.NodeBridgeMAC {
		t.Errorf("bridge %s address %q (%v) with a pod on it, want the fixed %s", kubetest.NodeBridge, mac, err, kubetest.NodeBridgeMAC)
	}
	if left := kubetest.NodeLeftovers(c.Dir()); len(left) == 0 {
		t.Fatal("a running real node shows nothing for NodeLeftovers to find: the check would prove nothing")
	}
	dir := c.Dir()
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped = true
	if left := kubetest.NodeLeftovers(dir); len(left) > 0 {
		t.Errorf("after Stop the real node left:\n%s", strings.Join(left, "\n"))
	}
}

// staticStandIn is a static executable standing for the agent in the task
// image (this pod needs only the shell): the static busybox itself.
func staticStandIn(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Skip("no /bin/busybox")
	}
	return "/bin/busybox"
}

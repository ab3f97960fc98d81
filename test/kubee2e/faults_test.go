package kubee2e_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/internal/kubetest"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube/podrecord"
)

// TestKubeFaultSuite runs every scenario side by side on the shared
// cluster (the API server outage on a cluster of its own) and prints the
// figures table.
func TestKubeFaultSuite(t *testing.T) {
	start := time.Now()
	c := kubetest.Current(t)
	t.Run("scenarios", func(t *testing.T) {
		for _, sc := range scenarios {
			t.Run(sc.name, func(t *testing.T) {
				t.Parallel()
				sc.run(t, c)
			})
		}
	})
	t.Log(book.table(time.Since(start)))
}

// scenarios are the suite's, numbered in the table by their place here.
var scenarios = []struct {
	name string
	run  func(*testing.T, *kubetest.Cluster)
}{
	{"PodDeletedUnderARunningAttemptIsReapedAndRePlaced", podDeleted},
	{"NodeLostItsPodsGoneAreReapedAndRePlaced", nodeLost},
	{"EvictionThroughTheEvictionAPIIsAnInfraFailure", evicted},
	{"PreemptionIsAnInfraFailure", preempted},
	{"OOMKilledContainerIsATaskFailureThatSpendsARetry", oomKilled},
	{"SuccessWhoseReportWasLostInAnOutageIsOverriddenNotReRun", reportLost},
	{"PodCreateRefusedFailsTheDispatchAtOnce", createRefused},
	{"APIServerStoppedPastTheThresholdsReapsNothingWhileBlind", apiServerStopped},
	{"LeaderKilledTheNewLeaderReapsOnceAfterItsGate", leaderKilled},
	{"PodCreateUnavailableFor15MinutesFailsTheDispatchWithoutARetry", createUnavailable},
}

// A running attempt's pod is deleted: the agent dies with it, the pod is
// gone, and the attempt is reaped on the infra rail and re-placed on a new
// epoch that succeeds; the bystander is untouched.
func podDeleted(t *testing.T, c *kubetest.Cluster) {
	s := newScenario(t, 1, "pod deleted under a running attempt", c)
	s.startDaemon()
	s.startDaemon()
	s.leader(30 * time.Second)
	s.submit(victim("victim"), bystander("bystander"))
	a, p := s.waitRunning("victim")
	s.waitRunning("bystander")
	f := s.harm("pod deleted", a, max(agentLost, podLostFloor))
	s.deletePod(p)
	s.waitReaped(f, time.Minute)
	s.finish()
}

// pair starts the scenario's two replicas and waits for a leader.
func (s *scenario) pair() *daemon {
	s.startDaemon()
	s.startDaemon()
	return s.leader(30 * time.Second)
}

// The node of two running attempts is deleted: the controller manager's
// Pod GC deletes its pods (DisruptionTarget DeletionByPodGC), the agents
// die with them, and both attempts are reaped on the infra rail and
// re-placed on the new node. The fault is timed from the pods' going.
func nodeLost(t *testing.T, c *kubetest.Cluster) {
	s := newScenario(t, 2, "node lost (Pod GC)", c)
	s.pair()
	s.submit(victim("a"), victim("b"))
	a, pa := s.waitRunning("a")
	b, pb := s.waitRunning("b")
	node := pa.Spec.NodeName
	s.dropNode(node)
	s.addNode()
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	if err := s.cs.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete node %s: %v", node, err)
	}
	t.Logf("deleted node %s (pods %s, %s)", node, pa.Name, pb.Name)
	if !c.HasControllerManager() {
		// No Pod GC: the node's pods go as a lost node's do.
		s.deletePod(pa)
		s.deletePod(pb)
	}
	s.podGone(pa.Name, 3*time.Minute)
	fa := s.harm("node lost: pod a gone", a, max(agentLost, podLostFloor))
	s.podGone(pb.Name, time.Minute)
	fb := s.harm("node lost: pod b gone", b, max(agentLost, podLostFloor))
	s.waitReaped(fa, time.Minute)
	s.waitReaped(fb, time.Minute)
	s.finish()
}

// A running attempt's pod is evicted through the Eviction API: it is
// settled on the infra rail (the disruption, or the pod gone) and re-placed;
// no retry is spent.
func evicted(t *testing.T, c *kubetest.Cluster) {
	s := newScenario(t, 3, "eviction (Eviction API)", c)
	s.pair()
	s.submit(victim("victim"), bystander("bystander"))
	a, p := s.waitRunning("victim")
	s.waitRunning("bystander")
	f := s.harm("pod evicted", a, max(agentLost, podLostFloor))
	s.evict(p)
	s.waitReaped(f, time.Minute)
	s.finish()
}

// A running attempt's pod is preempted (the DisruptionTarget condition of
// reason PreemptionByScheduler, then deleted, played as the scheduler
// would): an infra failure, re-placed, no retry spent.
func preempted(t *testing.T, c *kubetest.Cluster) {
	s := newScenario(t, 4, "preemption (played)", c)
	s.pair()
	s.submit(victim("victim"), bystander("bystander"))
	a, p := s.waitRunning("victim")
	s.waitRunning("bystander")
	f := s.harm("pod preempted", a, max(agentLost, podLostFloor))
	s.preempt(p)
	s.waitReaped(f, time.Minute)
	s.finish()
}

// The task container is OOMKilled (the player plays the kernel): the
// task's own failure, which spends its retry; try 2 succeeds. No reaper
// marks it: the sweep settles the finished pod.
func oomKilled(t *testing.T, c *kubetest.Cluster) {
	s := newScenario(t, 5, "OOMKilled container (played)", c)
	s.retries = 1
	s.pair()
	s.submit(taskSpec{id: "victim", victim: true, try: 2}, bystander("bystander"))
	a, p := s.waitRunning("victim")
	s.waitRunning("bystander")
	f := s.harm("container OOMKilled", a, 0)
	f.label = sdk.LabelReconcileSettled
	s.oomKill(p)
	s.waitReaped(f, time.Minute)
	s.finish()
}

// Both replicas are down (the attempt API with them) when a task
// succeeds; its agent is gone before they are back, so its report is
// lost, but its SUCCESS record is in the pod's termination message: the
// attempt ends a success, overridden or settled, never run again.
func reportLost(t *testing.T, c *kubetest.Cluster) {
	s := newScenario(t, 6, "success report lost in an outage", c)
	s.pair()
	s.submit(bystander("task"))
	a, _ := s.waitRunning("task")
	agent := s.agentOf(a)
	at := time.Now()
	for _, d := range s.daemons {
		d.kill()
	}
	t.Logf("both replicas killed; releasing the task")
	release(t, s)
	s.eventually(30*time.Second, "the task to end", func() bool { return s.execLog("task").ends == 1 })
	s.eventually(10*time.Second, "the SUCCESS record", func() bool { return hasRecord(s.dir, podrecord.Success) })
	time.Sleep(time.Second) // the agent's first report retries run into the outage
	if err := syscall.Kill(agent, syscall.SIGKILL); err != nil {
		t.Fatalf("kill the agent: %v", err)
	}
	s.harmed[a] = true // a mark is allowed; the sweep must override it
	f := &fault{what: "report lost (replicas down, agent gone)", at: at, target: a, none: true}
	s.faults = append(s.faults, f)
	s.pair()
	s.finish()
}

// A pod create the API server refuses (a ResourceQuota of no pods:
// Forbidden) fails the dispatch at once: dispatch_failed, terminal, no
// retry spent.
func createRefused(t *testing.T, c *kubetest.Cluster) {
	s := newScenario(t, 7, "pod create refused (Forbidden)", c)
	s.retries = 1
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	if _, err := s.cs.CoreV1().ResourceQuotas(s.ns).Create(ctx, &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "no-pods"},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.pair()
	s.submit(taskSpec{id: "refused", want: sdk.StateFailed})
	a := sdk.Attempt{RunID: runID, TaskID: "refused", Try: 1, Epoch: 0}
	f := s.harm("pod create refused", a, runnerTick)
	f.label = sdk.LabelDispatchFailed
	delete(s.harmed, a) // the runner's verdict, no reaper's
	s.waitReaped(f, time.Minute)
	s.finish()
}

// The API server of a cluster of the scenario's own is stopped for longer
// than every threshold while two attempts run (their agents still heartbeat
// through the attempt API, which reaperd serves): nothing is reaped while
// reaperd is blind, the Lease lapses, and once the API server is back a
// replica leads again and both tasks finish at their first attempt.
func apiServerStopped(t *testing.T, _ *kubetest.Cluster) {
	c, err := kubetest.Start(t.Context(), kubetest.Options{BaseDir: t.TempDir(), NoControllerManager: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	s := newScenario(t, 8, "API server stopped past the thresholds", c)
	s.pair()
	s.submit(bystander("a"), bystander("b"))
	s.waitRunning("a")
	s.waitRunning("b")
	at := time.Now()
	if err := c.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	blind := orphanRun + interval
	t.Logf("API server stopped for %s", blind)
	time.Sleep(blind) // the outage itself: every threshold passes inside it
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	s.faults = append(s.faults, &fault{what: "API server stopped " + blind.String(), at: at, none: true})
	ds, err := s.decisions()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if d.Applied && reapers[d.Reaper] {
			t.Errorf("reaped while blind: %s %s %s", d.Reaper, d.Label, d.Attempt)
		}
	}
	s.leader(time.Minute)
	s.finish()
}

// The leader is killed with SIGKILL as a running attempt's pod is deleted:
// the other replica takes the Lease, waits out its settling gate, and
// reaps the attempt once; nothing is reaped twice.
func leaderKilled(t *testing.T, c *kubetest.Cluster) {
	s := newScenario(t, 9, "reaperd leader killed (kill -9)", c)
	leader := s.pair()
	s.submit(victim("victim"), bystander("bystander"))
	a, p := s.waitRunning("victim")
	s.waitRunning("bystander")
	leader.kill()
	f := s.harm("leader killed, pod deleted", a, max(agentLost, podLostFloor))
	s.deletePod(p)
	next := s.leader(30 * time.Second)
	if next == leader {
		t.Fatal("the killed replica still leads")
	}
	s.waitReaped(f, time.Minute)
	s.finish()
}

// release lets every task's waiting attempt end.
func release(t *testing.T, s *scenario) {
	t.Helper()
	if err := os.WriteFile(s.release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// hasRecord reports whether a played container's termination message
// under dir holds a record of outcome.
func hasRecord(dir string, outcome podrecord.Outcome) bool {
	files, _ := filepath.Glob(filepath.Join(dir, "containers", "*", "termination-log"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if rec, ok := podrecord.Parse(string(b)); err == nil && ok && rec.Outcome == outcome {
			return true
		}
	}
	return false
}

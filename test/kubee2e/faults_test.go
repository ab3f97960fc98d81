package kubee2e_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube/podrecord"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// TestKubeFaultSuite runs every scenario side by side on the shared
// cluster (the API server outage on a cluster of its own) and prints the
// figures table.
//
// The scenarios mostly wait (for thresholds, pods, processes), so they run
// concurrently whatever -parallel says: each is a subtest run from a
// goroutine of its own (which testing allows), at most concurrentScenarios
// at once.
func TestKubeFaultSuite(t *testing.T) {
	start := time.Now()
	c := kubetest.Current(t)
	slots := make(chan struct{}, concurrentScenarios)
	var wg sync.WaitGroup
	for _, sc := range scenarios {
		wg.Add(1)
		go func() {
			defer wg.Done()
			slots <- struct{}{}
			defer func() { <-slots }()
			t.Run(sc.name, func(t *testing.T) { sc.run(t, c) })
		}()
	}
	wg.Wait()
	t.Log(book.table(time.Since(start)))
}

// concurrentScenarios bounds the scenarios running at once (each runs two
// reaperd with their plugins, agents and tasks).
const concurrentScenarios = 4

// scenarios are the suite's; each numbers its own line of the table.
var scenarios = []struct {
	name string
	run  func(*testing.T, *kubetest.Cluster)
}{
	// The longest first: they set the suite's wall time.
	{"NodeLostItsPodsGoneAreReapedAndRePlaced", nodeLost},
	{"APIServerStoppedPastTheThresholdsReapsNothingWhileBlind", apiServerStopped},
	{"RunWhoseEveryPodVanishedWithItsSchedulerGoneIsAnOrphanRun", orphanedRun},
	{"LeaderCutOffFromPostgresIsReplacedAndAppliesNothing", leaderCutOffFromPostgres},
	{"PodDeletedUnderARunningAttemptIsReapedAndRePlaced", podDeleted},
	{"EvictionThroughTheEvictionAPIIsAnInfraFailure", evicted},
	{"PreemptionIsAnInfraFailure", preempted},
	{"OOMKilledContainerIsATaskFailureThatSpendsARetry", oomKilled},
	{"SuccessWhoseReportWasLostInAnOutageIsOverriddenNotReRun", reportLost},
	{"PodCreateRefusedFailsTheDispatchAtOnce", createRefused},
	{"LeaderKilledTheNewLeaderReapsOnceAfterItsGate", leaderKilled},
	{"PodCreateUnavailableFor15MinutesFailsTheDispatchWithoutARetry", createUnavailable},
	{"WarmWorkerPodDeletedItsAttemptIsReapedAndRePlaced", warmWorkerDeleted},
	{"LeaderCutOffFromTheAPIServerIsReplacedAndReapsNothingBlind", leaderCutOffFromTheAPIServer},
	{"PostgresFrozenPastTheLeaseAppliesNothingBlindAndReapsOnceBack", postgresFrozen},
	{"FailoverToASynchronousStandbyKeepsEveryAppliedDecision", failoverSynchronous},
	{"AsyncFailoverThatLostATermFencesTheOldHolderOut", failoverAsyncLostTerm},
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
	s.binder.RemoveNode(node)
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

// A running attempt's pod is deleted: the agent dies with it, the pod is
// gone, and the attempt is reaped on the infra rail and re-placed on a new
// epoch that succeeds; the bystander is untouched.
func podDeleted(t *testing.T, c *kubetest.Cluster) {
	podHarmed(t, newScenario(t, 1, "pod deleted under a running attempt", c), "pod deleted", (*scenario).deletePod)
}

// A running attempt's pod is evicted through the Eviction API: it is
// settled on the infra rail (the disruption, or the pod gone) and re-placed;
// no retry is spent.
func evicted(t *testing.T, c *kubetest.Cluster) {
	podHarmed(t, newScenario(t, 3, "eviction (Eviction API)", c), "pod evicted", (*scenario).evict)
}

// A running attempt's pod is preempted (the DisruptionTarget condition of
// reason PreemptionByScheduler, then deleted, played as the scheduler
// would): an infra failure, re-placed, no retry spent.
func preempted(t *testing.T, c *kubetest.Cluster) {
	podHarmed(t, newScenario(t, 4, "preemption (played)", c), "pod preempted", (*scenario).preempt)
}

// podHarmed runs a victim and a bystander, harms the victim's running pod
// with harm, and checks the victim is reaped and re-placed. The fault
// counts from the pod's going: a pod deleted with its grace may still run
// its agent until then.
func podHarmed(t *testing.T, s *scenario, what string, harm func(*scenario, *corev1.Pod)) {
	t.Helper()
	s.pair()
	s.submit(victim("victim"), bystander("bystander"))
	a, p := s.waitRunning("victim")
	s.waitRunning("bystander")
	harm(s, p)
	s.podGone(p.Name, 30*time.Second)
	f := s.harm(what+" (gone)", a, max(agentLost, podLostFloor))
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

// The scheduler is gone (the replicas restarted without the runner, the
// reapers and the attempt API still up) and then every pod of the run
// vanishes; its tasks have no infra budget, so nothing will re-place them.
// Each attempt is reaped pod_lost; once the valve has passed, the run has
// nothing live and no activity, and orphanrun fails it.
func orphanedRun(t *testing.T, c *kubetest.Cluster) {
	s := newScenario(t, 11, "every pod of a run vanished (orphan run)", c)
	s.infraBudget = lifecycle.NoInfraBudget
	s.pair()
	gone := taskSpec{victim: true, want: sdk.StateFailed}
	a1, b1 := gone, gone
	a1.id, b1.id = "a", "b"
	s.submit(a1, b1)
	a, pa := s.waitRunning("a")
	b, pb := s.waitRunning("b")
	for _, d := range s.daemons {
		d.stop(20 * time.Second)
	}
	s.noRunner = true
	s.pair()
	fa := s.harm("pod a vanished", a, max(agentLost, podLostFloor))
	fb := s.harm("pod b vanished", b, max(agentLost, podLostFloor))
	s.deletePod(pa)
	s.deletePod(pb)
	s.runHarm = true
	fr := &fault{what: "run orphaned", at: time.Now(), run: true, threshold: orphanRun}
	s.faults = append(s.faults, fr)
	s.waitReaped(fa, time.Minute)
	s.waitReaped(fb, time.Minute)
	s.waitReaped(fr, 2*time.Minute)
	s.finish()
}

// A warm pool of two workers runs a victim and a bystander, one on each;
// the victim's worker pod is deleted (its attempt dies with it, unreported):
// warmworker reaps it on the infra rail, the pool is refilled, and the
// re-placed attempt succeeds on a live worker; the bystander is untouched.
func warmWorkerDeleted(t *testing.T, c *kubetest.Cluster) {
	s := newScenario(t, 12, "warm worker pod deleted", c)
	s.warmPool = 2
	s.executor = sdk.ExecutorWarm
	s.pair()
	s.submit(victim("victim"), bystander("bystander"))
	s.waitRunning("bystander")
	var ti board.TaskInstance
	s.eventually(time.Minute, "the victim to run on a worker", func() bool {
		var err error
		ti, err = s.taskRow("victim")
		return err == nil && ti.State == sdk.StateRunning && ti.WarmWorker != "" && s.execLog("victim").starts > 0
	})
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	p, err := s.cs.CoreV1().Pods(s.ns).Get(ctx, ti.WarmWorker, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the victim's worker pod %s: %v", ti.WarmWorker, err)
	}
	s.deletePod(p)
	s.podGone(p.Name, 30*time.Second)
	f := s.harm("warm worker pod deleted (gone)", ti.Attempt, max(agentLost, podLostFloor))
	s.waitReaped(f, time.Minute)
	s.finish()
}

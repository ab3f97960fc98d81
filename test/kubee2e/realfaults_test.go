package kubee2e_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube/podrecord"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// The real node's scenarios in which the node itself, a pod's network or
// the control plane fails (the faults a kubelet and a pod network make
// possible), beside the pod-level ones of realnode_test.go.

// The kubelet is killed with SIGKILL while two attempts run and is started
// again only after the tier's agent_lost has passed: the containers run on
// under containerd, their agents heartbeat throughout, the restarted
// kubelet takes them back (no container restarted), and nothing is reaped
// or run twice.
func realKubeletRestarted(t *testing.T, c *kubetest.Cluster) {
	s := newRealScenario(t, 25, "real node: kubelet killed -9, restarted", c)
	s.pair()
	s.submit(bystander("a"), bystander("b"))
	_, pa := s.waitRunning("a")
	s.waitRunning("b")
	before := containerOf(pa)
	at := time.Now()
	if err := c.KillKubelet(); err != nil {
		t.Fatal(err)
	}
	// Never leave the shared node without its kubelet.
	t.Cleanup(func() { _ = c.StartKubelet(context.Background()) })
	down := agentLost + interval
	t.Logf("kubelet killed; restarting it in %s", down)
	time.Sleep(down) // the fault itself: every pod-level threshold passes without a kubelet
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.StartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	s.faults = append(s.faults, &fault{what: "kubelet killed -9 for " + down.String(), at: at, none: true})
	// The restarted kubelet has the same container running, not a new one.
	s.eventually(30*time.Second, "the restarted kubelet to report a's container", func() bool {
		p, err := s.cs.CoreV1().Pods(s.ns).Get(context.Background(), pa.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		now := containerOf(p)
		if now.ContainerID != before.ContainerID || now.RestartCount != 0 {
			t.Errorf("a's container after the kubelet's restart: %s (restarts %d), before %s", now.ContainerID, now.RestartCount, before.ContainerID)
			return true
		}
		return now.State.Running != nil && now.Ready
	})
	s.finish()
}

// containerOf is the task container's status ("" ID when none).
func containerOf(p *corev1.Pod) corev1.ContainerStatus {
	for _, cs := range p.Status.ContainerStatuses {
		return cs
	}
	return corev1.ContainerStatus{}
}

// cutAPI makes the host refuse the pod's connections to the attempt API
// (its agent's calls all fail; the pod still reaches the ledger) until the
// returned undo, which the scenario's cleanup also calls.
func (s *scenario) cutAPI(p *corev1.Pod) func() {
	s.t.Helper()
	if p.Status.PodIP == "" {
		s.t.Fatalf("pod %s has no IP yet", p.Name)
	}
	undo, err := s.real.RejectFromPod(p.Status.PodIP, s.apiPort())
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = undo() })
	return func() {
		if err := undo(); err != nil {
			s.t.Error(err)
		}
	}
}

// apiPort is the port the scenario's attempt API listens on.
func (s *scenario) apiPort() int {
	_, port, err := net.SplitHostPort(s.apiListen)
	n, cerr := strconv.Atoi(port)
	if err != nil || cerr != nil {
		s.t.Fatalf("attempt API address %q: %v %v", s.apiListen, err, cerr)
	}
	return n
}

// runningPod waits for the attempt's pod to be Running with an IP.
func (s *scenario) runningPod(a sdk.Attempt) *corev1.Pod {
	s.t.Helper()
	var p *corev1.Pod
	s.eventually(30*time.Second, "the pod of "+a.String()+" to be Running with an IP", func() bool {
		got, err := s.podOf(a)
		p = got
		return err == nil && got.Status.Phase == corev1.PodRunning && got.Status.PodIP != ""
	})
	return p
}

// waitPodEnded waits for pod p to have ended (Succeeded or Failed) and
// returns it as it ended.
func (s *scenario) waitPodEnded(p *corev1.Pod, bound time.Duration) *corev1.Pod {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	got, err := kubetest.WaitPod(ctx, s.cs, p, func(p *corev1.Pod) bool {
		return p == nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	})
	if err != nil {
		s.t.Fatalf("the end of pod %s: %v", p.Name, err)
	}
	if got == nil {
		s.t.Fatalf("pod %s went before its end could be read", p.Name)
	}
	return got
}

// recordOf is the outcome record in a pod's termination message.
func recordOf(p *corev1.Pod) (podrecord.Record, bool) {
	term := terminated(p)
	if term == nil {
		return podrecord.Record{}, false
	}
	return podrecord.Parse(term.Message)
}

// The victim's pod is cut off from the attempt API, and then its task
// succeeds: the agent writes the SUCCESS record, but neither its
// heartbeats nor its report get through. The heartbeat reaper marks the
// attempt (provisional, on the infra rail) and stops the pod in place:
// activeDeadlineSeconds lowered, the kubelet ends the container, the pod
// is Failed/DeadlineExceeded with its object and record kept. The sweep
// then reads the SUCCESS record and overrides the mark: the task is a
// success at its first attempt, never re-placed, run once.
func realStopInPlace(t *testing.T, c *kubetest.Cluster) {
	s := newRealScenario(t, 26, "real node: stop in place, task had succeeded", c)
	a, p := s.gatedBesideABystander("victim")
	undo := s.cutAPI(p)
	f := s.harm("the agent cut off from the attempt API, then its task succeeded", a, agentLost)
	s.ledger.openGate("victim-ends")
	s.waitReaped(f, time.Minute)
	ended := s.waitPodEnded(p, time.Minute)
	undo()
	rec, ok := recordOf(ended)
	t.Logf("the victim's pod: %s/%s %q; record %+v", ended.Status.Phase, ended.Status.Reason, ended.Status.Message, rec)
	if ended.Status.Phase != corev1.PodFailed || ended.Status.Reason != "DeadlineExceeded" {
		t.Errorf("the stopped pod: %s/%s, want Failed/DeadlineExceeded (stopped in place)", ended.Status.Phase, ended.Status.Reason)
	}
	if !ok || rec.Outcome != podrecord.Success {
		t.Errorf("the stopped pod's termination message: %+v (%v), want its SUCCESS record kept", rec, ok)
	}
	s.waitOverride(a)
	s.finish()
}

// gatedBesideABystander starts the replicas and a run of task, whose first
// execution waits for the gate task+"-ends" (openGate), beside a
// bystander, and waits until both run: task's attempt and Running pod.
func (s *scenario) gatedBesideABystander(task string) (sdk.Attempt, *corev1.Pod) {
	s.t.Helper()
	s.pair()
	s.submit(taskSpec{id: task, victim: true, harm: s.ledger.waitGate(task + "-ends")}, bystander("bystander"))
	a, _ := s.waitRunning(task)
	p := s.runningPod(a)
	s.waitRunning("bystander")
	return a, p
}

// waitOverride waits for the sweep's durable-SUCCESS override of a's mark.
func (s *scenario) waitOverride(a sdk.Attempt) {
	s.t.Helper()
	s.eventually(time.Minute, "the SUCCESS record's override of "+a.String(), func() bool {
		ds, err := s.decisions()
		if err != nil {
			return false
		}
		for _, d := range ds {
			if d.Applied && d.Attempt == a && d.Label == sdk.LabelReconcileInfraOverride {
				s.t.Logf("%s: %s by %s: %s", d.At.Format("15:04:05.000"), d.Label, d.Reaper, d.Detail)
				return true
			}
		}
		return false
	})
}

// Both replicas (and the attempt API with them) are killed while a task
// runs; the task then succeeds, its agent writes the SUCCESS record and
// gives up its report after its retry, and the container ends. When the
// replicas are back the sweep settles the attempt from the record: a
// success at its first attempt, run once. The bystander's heartbeats went
// unanswered through the outage; the new leader's settling gate lets them
// arrive before any reaper judges it, so it is not reaped.
func realReportLost(t *testing.T, c *kubetest.Cluster) {
	s := newRealScenario(t, 27, "real node: success report lost (replicas down)", c)
	a, p := s.gatedBesideABystander("task")
	at := time.Now()
	for _, d := range s.daemons {
		d.kill()
	}
	t.Logf("both replicas killed; the task ends")
	s.ledger.openGate("task-ends")
	ended := s.waitPodEnded(p, tierReportRetry+time.Minute)
	rec, ok := recordOf(ended)
	t.Logf("the task's pod ended %s after the outage began: %s, record %+v", time.Since(at).Round(time.Millisecond), ended.Status.Phase, rec)
	if !ok || rec.Outcome != podrecord.Success {
		t.Errorf("the ended pod's termination message: %+v (%v), want its SUCCESS record", rec, ok)
	}
	s.harmed[a] = true // a provisional mark is allowed; the record must settle it a success
	s.faults = append(s.faults, &fault{what: "report lost (replicas down past the agent's report retry)", at: at, target: a, none: true})
	s.pair()
	s.finish()
}

// The attempt API refuses every pod's connections from before the run is
// submitted: the victim's agent never gets its RUNNING report through,
// gives up after its start retry without starting the task, and writes the
// infra marker as its record. The sweep settles it control_plane_unavailable
// on the infra rail (no retry spent); once the API is reachable again the
// re-placed attempt runs to success.
func realStartUnanswered(t *testing.T, c *kubetest.Cluster) {
	s := newRealScenario(t, 28, "real node: control plane unreachable at start", c)
	s.pair()
	undo, err := s.real.RejectFromPod(kubetest.NodeSubnet, s.apiPort())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = undo() })
	a := sdk.Attempt{RunID: runID, TaskID: "victim", Try: 1, Epoch: 0}
	// The agent gives up once its start retry has run from its start, a
	// moment after the pod's creation (the real node's start).
	f := s.harm("attempt API unreachable from the pods", a, tierStartRetry+podStart)
	f.label = sdk.LabelReconcileSettled
	s.submit(taskSpec{id: "victim", replaced: true})
	s.waitReaped(f, time.Minute)
	if err := undo(); err != nil {
		t.Fatal(err)
	}
	ds, err := s.decisions()
	if err != nil {
		t.Fatal(err)
	}
	if d := reapOf(ds, f); d != nil {
		t.Logf("settled as %s: %s", d.Label, d.Detail)
		if !strings.Contains(d.Detail+" "+fmt.Sprint(d.Evidence), sdk.ReasonControlPlaneUnavailable) {
			t.Errorf("the unanswered start was settled %s (%s), want %s on the infra rail", d.Label, d.Detail, sdk.ReasonControlPlaneUnavailable)
		}
	}
	s.finish()
	if n := s.execLog("victim").starts; n != 1 {
		t.Errorf("the victim ran %d times, want once (its first attempt never started the task)", n)
	}
}

// podStart bounds a pod's start on the real node, from its creation to its
// container running (measured: about 0.6 s idle).
const podStart = 3 * time.Second

// The victim's agent is frozen (SIGSTOP) inside its container while its
// task runs: its heartbeats stop, the heartbeat reaper marks the attempt
// and stops the pod in place, and the kubelet ends the wedged container
// (the stopped agent cannot act on SIGTERM; SIGKILL after the grace): the
// pod is Failed/DeadlineExceeded with no record. The sweep confirms the
// mark from the pod's end, and the attempt is re-placed; the bystander is
// untouched.
func realWedgedAgent(t *testing.T, c *kubetest.Cluster) {
	s := newRealScenario(t, 29, "real node: agent wedged (SIGSTOP)", c)
	s.pair()
	s.submit(victim("victim"), bystander("bystander"))
	a, _ := s.waitRunning("victim")
	p := s.runningPod(a)
	s.waitRunning("bystander")
	agent := podAgent(t, p)
	if err := syscall.Kill(agent, syscall.SIGSTOP); err != nil {
		t.Fatalf("stop the agent: %v", err)
	}
	f := s.harm("agent frozen (SIGSTOP) in its container", a, agentLost)
	s.waitReaped(f, time.Minute)
	ended := s.waitPodEnded(p, time.Minute)
	s.ledger.reopen(a)
	t.Logf("the wedged pod: %s/%s %q", ended.Status.Phase, ended.Status.Reason, ended.Status.Message)
	if ended.Status.Phase != corev1.PodFailed || ended.Status.Reason != "DeadlineExceeded" {
		t.Errorf("the wedged pod: %s/%s, want Failed/DeadlineExceeded (the kubelet's deadline)", ended.Status.Phase, ended.Status.Reason)
	}
	if rec, ok := recordOf(ended); ok {
		t.Errorf("the wedged agent left a record %+v, want none", rec)
	}
	s.finish()
}

// The real node's kubelet is frozen (SIGSTOP) while two attempts run, a
// Ready KWOK node beside it (else the controller manager, seeing every
// node not Ready, stops evicting). The containers run on and their agents
// heartbeat, so nothing is reaped while the controller marks the node not
// Ready, taints it and has the taint manager delete both pods
// (DisruptionTarget DeletionByTaintManager) that no kubelet can stop. Once
// the kubelet carries on, it stops the deleted pods' containers (the
// agents' "stopped" records), and both attempts are settled pod_disrupted
// on the infra rail, no retry spent, and re-placed. Timed from the
// kubelet's end of the pods, as an eviction is.
func realNodeLost(t *testing.T, c *kubetest.Cluster) {
	s := newRealScenario(t, 30, "real node: kubelet frozen, pods evicted", c)
	c.AddNode(t, "") // a Ready node beside the real one; the binder places nothing there
	s.pair()
	s.submit(victim("a"), victim("b"))
	a, _ := s.waitRunning("a")
	b, _ := s.waitRunning("b")
	pa, pb := s.runningPod(a), s.runningPod(b)
	if err := c.PauseKubelet(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := c.ResumeKubelet(); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(resume) // never leave the shared node frozen
	paused := time.Now()
	t.Logf("kubelet frozen; waiting for the taint manager to delete the pods")
	for _, p := range []*corev1.Pod{pa, pb} {
		ctx, cancel := context.WithTimeout(context.Background(), kubetest.NodeMonitorGrace+kubetest.NodeLostToleration+time.Minute)
		got, err := kubetest.WaitPod(ctx, s.cs, p, func(p *corev1.Pod) bool {
			return p == nil || (p.DeletionTimestamp != nil && disruptedBy(p) != "")
		})
		cancel()
		if err != nil || got == nil {
			t.Fatalf("the taint manager's delete of %s: %v (pod %v)", p.Name, err, got)
		}
		t.Logf("pod %s: deleted %s after the freeze, DisruptionTarget %s, phase %s", p.Name,
			got.DeletionTimestamp.Sub(paused).Round(time.Second), disruptedBy(got), got.Status.Phase)
		if disruptedBy(got) != "DeletionByTaintManager" {
			t.Errorf("pod %s disrupted by %s, want DeletionByTaintManager", p.Name, disruptedBy(got))
		}
	}
	// The pods are deleted and not Ready, their containers run on: the
	// agents still heartbeat, so no reaper may have acted.
	ds, err := s.decisions()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if d.Applied && settles(d) {
			t.Errorf("reaped while the node was frozen and its containers ran: %s %s %s: %s", d.Reaper, d.Label, d.Attempt, d.Detail)
		}
	}
	resume()
	for _, p := range []*corev1.Pod{pa, pb} {
		s.waitPodEnded(p, time.Minute)
	}
	fa := s.harm("pod evicted by the taint manager (ended by the kubelet)", a, max(agentLost, podLostFloor))
	fb := s.harm("pod evicted by the taint manager (ended by the kubelet)", b, max(agentLost, podLostFloor))
	s.ledger.reopen(a)
	s.ledger.reopen(b)
	for _, f := range []*fault{fa, fb} {
		s.waitReaped(f, time.Minute)
	}
	if ds, err = s.decisions(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []*fault{fa, fb} {
		if d := reapOf(ds, f); d != nil {
			what := d.Label + " " + d.Detail + " " + fmt.Sprint(d.Evidence)
			t.Logf("%s settled as %s: %s", f.target, d.Label, d.Detail)
			if d.Label == sdk.LabelPodLost || !onTheInfraRail(t, d, what) {
				t.Errorf("%s was settled as %s (%s), want %s on the infra rail", f.target, d.Label, d.Detail, sdk.ReasonPodDisrupted)
			}
		}
	}
	s.finish()
}

// disruptedBy is the reason of a pod's DisruptionTarget condition, "" when
// it has none.
func disruptedBy(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			return c.Reason
		}
	}
	return ""
}

// The real node is partitioned while an attempt runs: its kubelet frozen
// and its pods cut off from the attempt API, so the agent's heartbeats
// stop and nothing on the node can be stopped. The heartbeat reaper marks
// the attempt (provisional) and the teardown lowers the pod's deadline,
// which no kubelet acts on; the controller manager marks the node not
// Ready. Past the confirmation valve the kube runner holds the mark
// (infra_confirm_valve_held) instead of re-placing it: a re-place would
// run the task again beside the first execution the moment the node is
// back (a double execution, seen here before the hold). The real node is
// the cluster's only node, so the controller manager is in its full
// disruption mode and evicts nothing. Once the partition
// heals, the old agent is answered should_terminate and the kubelet ends
// the pod; the mark is confirmed, the attempt re-placed, the task run to
// success with no execution beside another. The valve is set past the
// node monitor grace (30 s) here, as the default ladder's agent_lost and
// valve (90 s + 2 min) are past the controller manager's default grace.
func realPartitioned(t *testing.T, c *kubetest.Cluster) {
	s := newRealScenario(t, 31, "real node: partitioned past the valve", c)
	s.valveOver, s.orphanOver = kubetest.NodeMonitorGrace+5*time.Second, 2*time.Minute
	// No KWOK node is added: with the real node the only one, its loss is
	// every node's, and the controller manager enters its full disruption
	// mode (no taint eviction). The reapers and the runner must hold on
	// their own signals.
	alone := s.onlyReadyNode()
	s.pair()
	s.submit(victim("victim"))
	a, _ := s.waitRunning("victim")
	p := s.runningPod(a)
	if err := c.PauseKubelet(); err != nil {
		t.Fatal(err)
	}
	healed := false
	heal := func(undo func() error) {
		if !healed {
			healed = true
			if err := undo(); err != nil {
				t.Error(err)
			}
			if err := c.ResumeKubelet(); err != nil {
				t.Error(err)
			}
		}
	}
	undo, err := s.real.RejectFromPod(kubetest.NodeSubnet, s.apiPort())
	if err != nil {
		_ = c.ResumeKubelet()
		t.Fatal(err)
	}
	t.Cleanup(func() { heal(undo) }) // never leave the shared node partitioned
	f := s.harm("node partitioned (kubelet frozen, pods cut off)", a, agentLost)
	s.waitReaped(f, time.Minute)
	var held *decision
	s.eventually(s.valveOver+time.Minute, "the runner to hold the mark past the valve", func() bool {
		ds, err := s.decisions()
		if err != nil {
			return false
		}
		for i, d := range ds {
			if d.Attempt == a && d.Label == sdk.LabelInfraConfirmValveHeld {
				held = &ds[i]
				return true
			}
		}
		return false
	})
	t.Logf("%s: %s: %s", held.At.Format("15:04:05.000"), held.Label, held.Detail)
	if ti, err := s.taskRow("victim"); err != nil || ti.Attempt != a {
		t.Fatalf("the held attempt moved: %+v (%v)", ti.Attempt, err)
	}
	heal(undo)
	t.Logf("partition healed %s after it began", time.Since(f.at).Round(time.Millisecond))
	ended := s.waitPodEnded(p, time.Minute)
	t.Logf("the partitioned pod: %s/%s, DisruptionTarget %q", ended.Status.Phase, ended.Status.Reason, disruptedBy(ended))
	if alone && disruptedBy(ended) != "" {
		t.Errorf("with the real node the only one the controller manager evicted its pod (%s): no disruption mode", disruptedBy(ended))
	}
	s.ledger.reopen(a)
	s.finish()
}

// onlyReadyNode reports whether the real node is the cluster's only Ready
// node (then a loss of it puts the controller manager in its full
// disruption mode), and logs which.
func (s *scenario) onlyReadyNode() bool {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	nodes, err := s.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	var others []string
	for _, n := range nodes.Items {
		if n.Name != s.real.Name && kubetest.NodeReady(&n) {
			others = append(others, n.Name)
		}
	}
	if len(others) > 0 {
		s.t.Logf("other Ready nodes %v: the controller manager stays out of its disruption mode", others)
		return false
	}
	s.t.Logf("the real node is the only one: its loss puts the controller manager in its full disruption mode")
	return true
}

// podAgent is the pid, on the host, of the reaper-agent in pod p's
// container on the real node.
func podAgent(t *testing.T, p *corev1.Pod) int {
	t.Helper()
	for _, pp := range kubetest.PodProcesses(string(p.UID)) {
		if pp.Exe == "reaper-agent" {
			return pp.PID
		}
	}
	t.Fatalf("no reaper-agent process in pod %s: %+v", p.Name, kubetest.PodProcesses(string(p.UID)))
	return 0
}

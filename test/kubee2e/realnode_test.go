package kubee2e_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// The real node's tier: the same scenarios' promises, with the task pods
// run by a real kubelet, containerd and runc (kubetest.Options.RealNode)
// instead of the player. The task image holds the agent and a static
// busybox; the agent in pod mode reports to the attempt API over the pod
// network (the API listens on the bridge's gateway with a certificate for
// that address); the outcome record is the real container's termination
// message. A task runs inside its container, so it reports each execution
// to a ledger served on the gateway, which counts the starts, ends and
// executions that overlapped (what the flock on a host file counts on the
// player's tier).

// realTaskImage is the task image the tier imports into the real node.
const realTaskImage = "reaper.local/kubee2e-task:v1"

// tierAgent is the agent as the tier's pods run it: reaper-agent with its
// start and report retries scaled down with the tier's ladder (2 minutes
// each by default), so that an agent that cannot reach the control plane
// gives up within a scenario.
const tierAgent = "/usr/local/bin/reaper-agent-tier"

const (
	tierStartRetry  = 6 * time.Second
	tierReportRetry = 12 * time.Second
)

// realImage imports the task image once per test binary.
var realImage struct {
	once sync.Once
	err  error
}

// newRealScenario prepares a scenario whose pods run on the real node, or
// skips t with the reason the machine cannot host one.
func newRealScenario(t *testing.T, num int, title string, c *kubetest.Cluster) *scenario {
	t.Helper()
	n := c.NeedRealNode(t)
	realImage.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		// The image has no libc: the agent is built static.
		agent := filepath.Join(binDir, "reaper-agent-static")
		build := exec.CommandContext(ctx, "go", "build", "-o", agent, "github.com/dexaflow/reaper/cmd/reaper-agent")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			realImage.err = fmt.Errorf("build the static agent: %w: %s", err, out)
			return
		}
		realImage.err = n.ImportTaskImage(ctx, realTaskImage, agent, kubetest.Script{Path: tierAgent, Text: fmt.Sprintf(
			"#!/bin/sh\nexec %s -start-retry=%s -report-retry=%s \"$@\"\n", kubetest.TaskAgent, tierStartRetry, tierReportRetry)})
	})
	if realImage.err != nil {
		t.Fatal(realImage.err)
	}
	return newScenarioOn(t, num, title, c, n)
}

// realRunnerBlock is the kube runner's block on the real node: the task
// image, never pulled, and the attempt API as the pods reach it.
func realRunnerBlock(tick time.Duration, apiListen, memLimit string) string {
	limit := ""
	if memLimit != "" {
		limit = fmt.Sprintf("    memory_limit      = %q\n", memLimit)
	}
	return fmt.Sprintf(`runner {
  interval = %q
  kube {
    image             = %q
    image_pull_policy = "Never"
    agent             = %q
    attempt_api       = "https://%s"
%s  }
}`, tick, realTaskImage, tierAgent, apiListen, limit)
}

// apiTLS is the attempt_api block's certificate lines: on the real node an
// operator's certificate for the gateway address, signed by the cluster's
// CA, which the agents are told to trust.
func (s *scenario) apiTLS() string {
	if s.real == nil {
		return ""
	}
	return fmt.Sprintf("  tls_cert  = %q\n  tls_key   = %q\n  tls_ca    = %q\n", s.real.APICert, s.real.APIKey, s.real.CA)
}

// freeAddrOn returns a free port on ip as host:port.
func freeAddrOn(t *testing.T, ip string) string {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatalf("find a free port on %s: %v", ip, err)
	}
	defer l.Close()
	return l.Addr().String()
}

// ledger is the HTTP server the tasks in real containers report to: each
// execution's start and end (written to the task's log as the player's
// tier writes them, so execLog and the history read both, with the
// ledger's clock and its count of the task's starts naming the
// execution), an execution that started while another of its task was
// open (a double), the release and the victim's first execution.
type ledger struct {
	url     string
	taskDir string
	release string
	mu      sync.Mutex
	open    map[string][]ledgerExec // task -> executions started and not ended
	starts  map[string]int          // task -> executions started
	first   map[string]bool         // task -> its first execution has asked
	gates   map[string]bool         // gate -> opened
}

// ledgerExec is an execution the ledger saw start: its try, epoch and
// number among its task's starts.
type ledgerExec struct {
	try, epoch string
	n          int
}

func startLedger(t *testing.T, taskDir, release string) *ledger {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(kubetest.NodeGateway, "0"))
	if err != nil {
		t.Fatalf("ledger: listen on the gateway: %v", err)
	}
	lg := &ledger{url: "http://" + l.Addr().String(), taskDir: taskDir, release: release,
		open: map[string][]ledgerExec{}, starts: map[string]int{}, first: map[string]bool{}, gates: map[string]bool{}}
	srv := &http.Server{Handler: http.HandlerFunc(lg.serve), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return lg
}

func (lg *ledger) serve(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	task := filepath.Base(q.Get("task"))
	lg.mu.Lock()
	defer lg.mu.Unlock()
	line := ""
	switch r.URL.Path {
	case "/released":
		if _, err := os.Stat(lg.release); err != nil {
			http.Error(w, "not yet", http.StatusNotFound)
		}
		return
	case "/gate":
		if !lg.gates[q.Get("name")] {
			http.Error(w, "shut", http.StatusNotFound)
		}
		return
	case "/first":
		if lg.first[task] {
			http.Error(w, "not the first", http.StatusNotFound)
			return
		}
		lg.first[task] = true
		return
	case "/start":
		if len(lg.open[task]) > 0 {
			line = fmt.Sprintf("double %s %s\n", q.Get("try"), q.Get("epoch"))
		}
		lg.starts[task]++
		x := ledgerExec{try: q.Get("try"), epoch: q.Get("epoch"), n: lg.starts[task]}
		lg.open[task] = append(lg.open[task], x)
		line += fmt.Sprintf("start %s %s %d %s\n", x.try, x.epoch, x.n, unixStamp(time.Now()))
	case "/end":
		n := "none" // an end of no open execution: the history says so
		open := lg.open[task]
		for i, x := range open {
			if x.try == q.Get("try") && x.epoch == q.Get("epoch") {
				n, lg.open[task] = strconv.Itoa(x.n), append(open[:i:i], open[i+1:]...)
				break
			}
		}
		line = fmt.Sprintf("end %s %s %s %s\n", q.Get("try"), q.Get("epoch"), n, unixStamp(time.Now()))
	default:
		http.NotFound(w, r)
		return
	}
	f, err := os.OpenFile(filepath.Join(lg.taskDir, task+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer f.Close()
	_, _ = f.WriteString(line)
}

// openGate lets the tasks waiting on the gate name (waitGate) go on.
func (lg *ledger) openGate(name string) {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	lg.gates[name] = true
}

// waitGate is a task body that waits until the gate name is open.
func (lg *ledger) waitGate(name string) string {
	return "until wget -q -O /dev/null '" + lg.url + "/gate?name=" + name + "' 2>/dev/null; do sleep 0.2; done"
}

// endReport is a shell command reporting the end of task's execution
// (for a trap: single quotes only around the whole).
func (lg *ledger) endReport(task string) string {
	return `wget -q -O /dev/null "` + lg.url + `/end?task=` + task + `&try=$REAPER_TRY&epoch=$REAPER_EPOCH"`
}

// reopen forgets the open executions of attempt a, which can never end
// (their container was killed): each is written killed now, and a later
// start is not a double of it. Only a's: a successor that has started
// meanwhile stays open.
func (lg *ledger) reopen(a sdk.Attempt) {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	try, epoch := strconv.Itoa(int(a.Try)), strconv.Itoa(int(a.Epoch))
	var b strings.Builder
	now := unixStamp(time.Now())
	var left []ledgerExec
	for _, x := range lg.open[a.TaskID] {
		if x.try != try || x.epoch != epoch {
			left = append(left, x)
			continue
		}
		fmt.Fprintf(&b, "killed %s %s %d %s\n", x.try, x.epoch, x.n, now)
	}
	appendLine(filepath.Join(lg.taskDir, a.TaskID+".log"), b.String())
	lg.open[a.TaskID] = left
}

// command is a task's shell command in a real container: report the start,
// the body, report the end. A victim's first execution (try 1, asked of
// the ledger) waits for the release, or runs harm when given; any other
// waits for the release, except a victim's later ones, which end after a
// second.
func (lg *ledger) command(ts taskSpec) string {
	get := func(path string) string {
		return "wget -q -O /dev/null '" + lg.url + path + "?task=" + ts.id + "&try='$REAPER_TRY'&epoch='$REAPER_EPOCH"
	}
	wait := "until " + get("/released") + " 2>/dev/null; do sleep 0.2; done"
	body := wait
	if ts.victim {
		first := wait
		if ts.harm != "" {
			first = ts.harm
		}
		body = `if [ "$REAPER_TRY" = 1 ] && ` + get("/first") + `; then ` + first + "; else sleep 1; fi"
	}
	// The task's status is its body's, reported after the end.
	return get("/start") + "; " + body + "; rc=$?; " + get("/end") + "; exit $rc"
}

// dumpRealPods logs the scenario's pods as the real kubelet left them.
func (s *scenario) dumpRealPods() {
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	list, err := s.cs.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		s.t.Logf("list pods: %v", err)
		return
	}
	for _, p := range list.Items {
		var cs []string
		for _, c := range p.Status.ContainerStatuses {
			cs = append(cs, fmt.Sprintf("%s %+v", c.Name, c.State))
		}
		s.t.Logf("pod %s: %s %s %s %v\n%s", p.Name, p.Status.Phase, p.Status.Reason, p.Status.Message, cs,
			s.real.ContainerLogs(s.ns, p.Name))
	}
}

// TestKubeRealNodeFaultSuite runs the real node's scenarios one at a time
// on the shared cluster's real node, with the figures table. One at a
// time: the machine's two cores are the node's too, and several of the
// scenarios stop the node's kubelet or cut a pod's network.
func TestKubeRealNodeFaultSuite(t *testing.T) {
	start := time.Now()
	c := kubetest.Current(t)
	c.NeedRealNode(t)
	slots := make(chan struct{}, 1)
	var wg sync.WaitGroup
	for _, sc := range realScenarios {
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

// realScenarios are the real node's; their lines number from 21.
var realScenarios = []struct {
	name string
	run  func(*testing.T, *kubetest.Cluster)
}{
	{"TaskPodRunsToSuccessOnTheRealNode", realSuccess},
	{"PodDeletedUnderARunningAttemptIsReapedAndRePlaced", realPodDeleted},
	{"EvictionThroughTheEvictionAPIIsPodDisruptedOnTheInfraRail", realEvicted},
	{"OOMKilledUnderARealMemoryLimitIsATaskFailureThatSpendsARetry", realOOMKilled},
	{"KubeletKilledAndRestartedUnderRunningAttemptsReapsNothing", realKubeletRestarted},
	{"StopInPlaceKeepsTheRecordAndAFinishedTaskIsOverriddenToSuccess", realStopInPlace},
	{"SuccessWhoseReportWasLostIsSettledFromItsRecord", realReportLost},
	{"ControlPlaneUnreachablePastTheStartRetryIsControlPlaneUnavailable", realStartUnanswered},
	{"WedgedAgentIsStoppedInPlaceByTheKubeletAndRePlaced", realWedgedAgent},
	{"NodeLostPodsDeletedByTheTaintManagerArePodDisruptedOnceTheKubeletEndsThem", realNodeLost},
	{"PartitionedPastTheValveIsHeldNotRunTwice", realPartitioned},
	{"PodDeletedUnderATaskThatTrapsSIGTERMIsPodDisruptedNoRetrySpent", realPodDeletedTrapTerm},
	{"TeardownRefusedPastTheValveWithTheAgentFrozenHoldsTheSuccessor", realTeardownRefusedPastTheValve},
}

// Two tasks run in real containers to SUCCESS: each settled once, run
// once, its pod Succeeded with its SUCCESS record in the termination
// message.
func realSuccess(t *testing.T, c *kubetest.Cluster) {
	s := newRealScenario(t, 21, "real node: tasks run to success", c)
	s.pair()
	s.submit(bystander("a"), bystander("b"))
	_, p := s.waitRunning("a")
	s.finish()
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	got, err := s.cs.CoreV1().Pods(s.ns).Get(ctx, p.Name, metav1.GetOptions{})
	if err == nil { // the sweep may have released and Pod GC removed it
		term := terminated(got)
		if got.Status.Phase != corev1.PodSucceeded || term == nil || term.ExitCode != 0 || !strings.Contains(term.Message, "SUCCESS") {
			t.Errorf("pod %s: phase %s, terminated %+v; want Succeeded, exit 0, a SUCCESS record", p.Name, got.Status.Phase, term)
		}
	}
}

// terminated is the task container's terminated state, nil if none.
func terminated(p *corev1.Pod) *corev1.ContainerStateTerminated {
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Terminated != nil {
			return c.State.Terminated
		}
	}
	return nil
}

// A running attempt's pod is deleted with its grace: the kubelet SIGTERMs
// the agent, the pod goes, the attempt is reaped on the infra rail and
// re-placed; the bystander is untouched.
func realPodDeleted(t *testing.T, c *kubetest.Cluster) {
	// A graceful delete SIGTERMs the agent, which writes its "stopped from
	// outside" record and exits; the kubelet writes the pod Failed and the
	// outcome record finalizer keeps the object, deletion timestamp set.
	// The record says the task was stopped, not why: the deletion decides,
	// on the infra rail (the player's tier sees the pod vanish: pod_lost).
	podDeletedUnder(t, c, 22, "real node: pod deleted under a running attempt", false)
}

// A running attempt's task traps SIGTERM and exits 0 on it, and its pod
// is deleted: the agent's record still says it was stopped (no exit code),
// so the deletion settles it on the infra rail, no retry spent (the soak
// on the real node found such a task's record carrying the exit code 0,
// read as the task's own failure).
func realPodDeletedTrapTerm(t *testing.T, c *kubetest.Cluster) {
	podDeletedUnder(t, c, 32, "real node: pod deleted, task traps SIGTERM", true)
}

// podDeletedUnder is the pod-deleted scenario; with trap, the victim's
// first execution exits 0 on SIGTERM.
func podDeletedUnder(t *testing.T, c *kubetest.Cluster, num int, title string, trap bool) {
	s := newRealScenario(t, num, title, c)
	s.pair()
	v := victim("victim")
	if trap {
		// The trap reports the execution's end itself: it is the moment
		// this execution stops, whatever the pod's object does after.
		v.harm = "trap '" + s.ledger.endReport(v.id) + "; exit 0' TERM; " + s.ledger.waitGate("never")
	}
	s.submit(v, bystander("bystander"))
	a, p := s.waitRunning("victim")
	s.waitRunning("bystander")
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	if err := s.cs.CoreV1().Pods(s.ns).Delete(ctx, p.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &p.UID}}); err != nil {
		t.Fatalf("delete pod %s: %v", p.Name, err)
	}
	// The first execution is over once the kubelet has ended the pod
	// (killed by the signal it reports no end): forget it then, not when
	// the object goes. The outcome record's finalizer keeps the object
	// until the sweep releases it, which can come after the re-placed
	// execution has started.
	ended, cancelEnded := context.WithTimeout(context.Background(), time.Minute)
	defer cancelEnded()
	if _, err := kubetest.WaitPod(ended, s.cs, p, func(p *corev1.Pod) bool {
		return p == nil || p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded
	}); err != nil {
		t.Fatalf("wait for the deleted pod's end: %v", err)
	}
	s.ledger.reopen(a)
	s.podGone(p.Name, time.Minute)
	f := s.harm("pod deleted (gone)", a, max(agentLost, podLostFloor))
	s.waitReaped(f, time.Minute)
	ds, err := s.decisions()
	if err != nil {
		t.Fatal(err)
	}
	if d := reapOf(ds, f); d != nil {
		what := d.Label + " " + d.Detail + " " + fmt.Sprint(d.Evidence)
		t.Logf("deleted pod settled as %s: %s", d.Label, d.Detail)
		if !onTheInfraRail(t, d, what) {
			t.Errorf("the deleted pod's attempt was settled as %s (%s), want the infra rail (%s or %s)",
				d.Label, d.Detail, sdk.ReasonPodDisrupted, sdk.LabelPodLost)
		}
	}
	s.finish()
}

// onTheInfraRail reports whether the decision that reaped a pod the cluster
// stopped put it on the infra rail: the sweep's pod_disrupted settlement
// (the rule under test), pod-lost's pod_lost, or the heartbeat reaper's
// provisional agent_lost mark, which the sweep confirms once the pod has
// ended. At this tier's ladder (agent_lost 5 s) a loaded machine can let the
// heartbeat reaper fire before the kubelet has written the pod's end; at a
// production ladder (90 s) the kubelet's seconds always come first. The
// settlement's words are proven where the sweep alone decides
// (TestJudgeFinished, the sweep's cluster tests).
func onTheInfraRail(t *testing.T, d *decision, what string) bool {
	t.Helper()
	if d.Label == sdk.LabelAgentLost {
		t.Logf("the heartbeat reaper's mark came before the kubelet's end of the pod (loaded machine): %s", d.Detail)
		return true
	}
	return d.Label == sdk.LabelPodLost || strings.Contains(what, sdk.ReasonPodDisrupted)
}

// A running attempt's pod is evicted through the Eviction API: the API
// server writes DisruptionTarget, the kubelet stops the container, and the
// attempt ends on the infra rail as a disruption (no retry spent),
// re-placed.
func realEvicted(t *testing.T, c *kubetest.Cluster) {
	s := newRealScenario(t, 23, "real node: eviction (Eviction API)", c)
	s.pair()
	s.submit(victim("victim"), bystander("bystander"))
	a, p := s.waitRunning("victim")
	s.waitRunning("bystander")
	s.evict(p)
	// The fault counts from the kubelet's end of the pod (its container
	// stopped with the grace, the pod written Failed), as a deleted pod's
	// counts from its going.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := kubetest.WaitPod(ctx, s.cs, p, func(p *corev1.Pod) bool {
		return p == nil || p.Status.Phase == corev1.PodFailed
	}); err != nil {
		t.Fatalf("the evicted pod's end: %v", err)
	}
	f := s.harm("pod evicted (stopped by the kubelet)", a, max(agentLost, podLostFloor))
	s.waitReaped(f, time.Minute)
	ds, err := s.decisions()
	if err != nil {
		t.Fatal(err)
	}
	if d := reapOf(ds, f); d != nil {
		what := d.Label + " " + d.Detail + " " + fmt.Sprint(d.Evidence)
		t.Logf("eviction settled as %s: %s", d.Label, d.Detail)
		if d.Label == sdk.LabelPodLost || !onTheInfraRail(t, d, what) {
			t.Errorf("the evicted attempt was settled as %s (%s), want %s on the infra rail", d.Label, d.Detail, sdk.ReasonPodDisrupted)
		}
	}
	s.ledger.reopen(a)
	s.finish()
}

// The task allocates far past its container's real memory limit: the
// kernel's OOM killer ends it, the kubelet reports OOMKilled, and the task
// fails on its own rail, spending its retry; try 2 succeeds.
func realOOMKilled(t *testing.T, c *kubetest.Cluster) {
	s := newRealScenario(t, 24, "real node: OOMKilled under a memory limit", c)
	s.retries = 1
	s.memLimit = "96Mi"
	s.pair()
	s.submit(taskSpec{id: "victim", victim: true, try: 2, harm: "dd if=/dev/zero of=/dev/null bs=400M count=1"}, bystander("bystander"))
	// The first try's attempt is known before it runs: its kill can come
	// and go (and try 2 start) inside one poll of the board.
	a := sdk.Attempt{RunID: runID, TaskID: "victim", Try: 1, Epoch: 0}
	// The agent may outlive the kill and report the failure itself, or
	// die with the container and leave it to the sweep: either way the
	// task's own rail, try 2 next.
	s.harmed[a] = true
	s.eventually(time.Minute, "the victim's second try", func() bool {
		ti, err := s.taskRow("victim")
		return err == nil && ti.Try == 2
	})
	// The agent reports before the kubelet writes the container's end:
	// wait for it (the pod may be gone already, released by the sweep).
	var term *corev1.ContainerStateTerminated
	s.eventually(30*time.Second, "the first try's container to be written terminated", func() bool {
		p, err := s.podOf(a)
		if err != nil {
			return true
		}
		term = terminated(p)
		return term != nil
	})
	if term != nil && term.Reason != "OOMKilled" {
		t.Errorf("the first try's container: terminated %+v, want OOMKilled", term)
	}
	if term != nil {
		t.Logf("the first try's container: %s, exit %d", term.Reason, term.ExitCode)
	}
	s.ledger.reopen(a)
	s.finish()
}

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// The kube demo on the real node: a real kubelet, the machine's containerd
// and runc (kubetest.Options.RealNode). The task image holds the agent
// (built static: the image has no libc) and a static busybox; the agents
// reach the attempt API over the pod network, at the bridge's gateway,
// with a certificate for that address signed by the cluster's CA. A task
// inside a container cannot write a host file, so each execution reports
// itself to a small ledger served on the gateway: a ping every half second
// while it runs and its end, from which the summary counts complete runs
// and executions of one task that overlapped.
//
// The faults are done for real: the pod deleted (the kubelet SIGTERMs the
// agent), the eviction through the Eviction API, the agent killed inside
// its container (found by its cgroup), the leader killed, every pod of a
// run frozen and deleted, and the node lost: its kubelet frozen, so that
// the controller manager marks the node NotReady, taints it and has the
// taint manager delete its pods, while their containers run on.

// Where the kube demo's pods run (the -node flag).
const (
	nodeAuto   = "auto" // the real node where the machine can host one, else the player
	nodeReal   = "real" // the real node, or fail saying why
	nodePlayer = "kwok" // KWOK nodes and the kubelet player
)

const (
	// demoTaskImage is the task image the demo imports into the real node.
	demoTaskImage = "reaper.local/demo-task:v1"
	// staticAgent is the agent built with CGO_ENABLED=0, beside the demo
	// (make demo-kube builds it), for the task image.
	staticAgent = "reaper-agent-static"
)

// noRealNode is setUp's error when the demo was told to run on the real
// node and this machine cannot host one.
type noRealNode struct{ why string }

func (e *noRealNode) Error() string { return "no real node on this machine: " + e.why }

// nodeReport is what runKubeOn tells of where the pods ran.
type nodeReport struct {
	real bool   // on the real node
	why  string // why not, when the demo fell back to the player
}

// realNodeExtra is the time the real node's faults add to the runs: the
// node lost waits for the controller manager's node monitor grace and the
// pods' toleration of the node's taints.
const realNodeExtra = kubetest.NodeMonitorGrace + kubetest.NodeLostToleration + 45*time.Second

// setUpRealNode imports the task image and starts the ledger.
func (w *kubeWorld) setUpRealNode(ctx context.Context) error {
	n := w.real
	say("real node %s Ready in %.1fs: kubelet %s, containerd and runc of this machine, a CNI bridge %s (%s)",
		n.Name, n.Ready.Seconds(), kubetest.KubernetesVersion, kubetest.NodeBridge, kubetest.NodeSubnet)
	begin := time.Now()
	if err := n.ImportTaskImage(ctx, demoTaskImage, w.staticAgentPath()); err != nil {
		return err
	}
	say("imported the task image %s (reaper-agent, a static busybox) in %.1fs", demoTaskImage, time.Since(begin).Seconds())
	var err error
	if w.ledger, err = startLedger(); err != nil {
		return err
	}
	w.undo = append(w.undo, w.ledger.close)
	say("tasks report their executions to a ledger at %s (they cannot write the host's files)", w.ledger.url)
	return nil
}

func (w *kubeWorld) staticAgentPath() string { return w.bin + string(os.PathSeparator) + staticAgent }

// realTaskCommand wraps a task's command for a real container: a pinger
// reports the execution to the ledger every half second while the command
// runs, then its end and exit code. held: the attempt's first execution
// holds (runs on until a fault takes it); later ones run the command.
func (w *kubeWorld) realTaskCommand(cmd string, held bool) string {
	q := `run=$REAPER_RUN_ID&task=$REAPER_TASK_ID&try=$REAPER_TRY&epoch=$REAPER_EPOCH`
	get := func(path, more string) string {
		return `wget -q -O /dev/null "` + w.ledger.url + path + `?` + q + more + `"`
	}
	body := cmd
	if held {
		body = `if [ "$REAPER_TRY" = 1 ] && [ "$REAPER_EPOCH" = 0 ]; then sleep 900; else ` + cmd + `; fi`
	}
	return `( while :; do ` + get("/ping", "") + `; sleep 0.5; done ) & p=$!; ` + body +
		`; rc=$?; kill $p; ` + get("/end", "&rc=$rc") + `; exit $rc`
}

// realRunner is the kube runner's block on the real node: the imported
// image, never pulled, the agent in it, the attempt API at the front on
// the gateway.
func (w *kubeWorld) realRunner() string {
	return fmt.Sprintf(`runner {
  kube {
    image             = %q
    image_pull_policy = "Never"
    agent             = %q
    termination_grace = "2s"
    attempt_api       = %q
  }
}`, demoTaskImage, kubetest.TaskAgent, w.front.url())
}

// realTLS is the attempt API's certificate on the real node: the node's
// operator certificate for the gateway (and loopback), which the agents
// are told to trust through the cluster's CA.
func (w *kubeWorld) realTLS() string {
	return fmt.Sprintf("  tls_cert  = %q\n  tls_key   = %q\n  tls_ca    = %q\n", w.real.APICert, w.real.APIKey, w.real.CA)
}

// podProcesses lists the host processes of a pod's containers: the
// player's container process (it leads its session), or on the real
// node the processes in the pod's cgroups but its sandbox's pause.
func (w *kubeWorld) podProcesses(p corev1.Pod) []kubetest.PodProcess {
	if w.real == nil {
		pid, _, ok := w.player.Process(p.Name)
		if !ok {
			return nil
		}
		return []kubetest.PodProcess{{PID: pid, Exe: "reaper-agent"}}
	}
	var out []kubetest.PodProcess
	for _, pp := range kubetest.PodProcesses(string(p.UID)) {
		if pp.Exe != "pause" {
			out = append(out, pp)
		}
	}
	return out
}

// agentOf is the agent process of the pod called name.
func (w *kubeWorld) agentOf(ctx context.Context, name string) (int, error) {
	if w.real == nil {
		pid, _, ok := w.player.Process(name)
		if !ok {
			return 0, errors.New("its container has not started")
		}
		return pid, nil
	}
	p, err := w.cs.CoreV1().Pods(kubeNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	for _, pp := range w.podProcesses(*p) {
		if pp.Exe == "reaper-agent" {
			return pp.PID, nil
		}
	}
	return 0, errors.New("no reaper-agent process in its container yet")
}

// nodeLoss is the real node's node-lost fault as it unfolds: the kubelet
// frozen, the taint manager's deletes awaited, the kubelet resumed.
type nodeLoss struct {
	frozen  time.Time
	pods    []corev1.Pod // the node fault's pods when the kubelet froze
	resumed bool
}

// loseRealNode freezes the real node's kubelet (SIGSTOP) once every other
// task has finished and the node fault's first attempts run: only their
// pods run on the node then. The node stops reporting; its containers run
// on, their agents heartbeating over the pod network.
func (w *kubeWorld) loseRealNode(ctx context.Context, nodeTasks []board.TaskInstance) (string, error) {
	var pods []corev1.Pod
	var names []string
	for _, ti := range nodeTasks {
		name, err := w.podName(ctx, ti.Attempt)
		if err != nil {
			return "", err
		}
		p, err := w.cs.CoreV1().Pods(kubeNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		pods = append(pods, *p)
		names = append(names, ti.Attempt.String())
	}
	w.records(ctx) // the finished pods' records, before the taint manager deletes pods of the node
	// No pod is bound to the node until it is back: the taint manager
	// would delete one bound while the node is still tainted.
	w.nodeHeld.Store(true)
	if err := w.cluster.PauseKubelet(); err != nil {
		w.nodeHeld.Store(false)
		return "", err
	}
	w.undo = append(w.undo, w.resumeKubelet) // never leave the node frozen
	w.loss = &nodeLoss{frozen: time.Now(), pods: pods}
	for _, p := range pods {
		if a, ok := kube.PodAttempt(p.Labels, p.Annotations); ok {
			w.harmed[a] = faultNodeLost
		}
	}
	return fmt.Sprintf("node %s lost: its kubelet frozen (SIGSTOP) under %d running pods (%s); their containers run on",
		w.real.Name, len(pods), strings.Join(names, ", ")), nil
}

func (w *kubeWorld) resumeKubelet() {
	if w.loss != nil && !w.loss.resumed {
		w.loss.resumed = true
		_ = w.cluster.ResumeKubelet()
	}
}

// watchNodeLoss follows the node lost: once the taint manager has deleted
// every pod of the frozen node (DisruptionTarget DeletionByTaintManager),
// it checks that no reaper acted on them meanwhile (their agents still
// heartbeat) and resumes the kubelet, which ends their containers.
func (w *kubeWorld) watchNodeLoss(ctx context.Context) {
	l := w.loss
	if l == nil {
		return
	}
	if l.resumed {
		w.watchNodeBack(ctx)
		return
	}
	waited := time.Since(l.frozen)
	var reasons []string
	for _, p := range l.pods {
		got, err := w.cs.CoreV1().Pods(kubeNamespace).Get(ctx, p.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			reasons = append(reasons, "gone")
		case err != nil || got.DeletionTimestamp == nil:
			if waited < realNodeExtra {
				return // not yet
			}
			reasons = append(reasons, "not deleted")
		default:
			reasons = append(reasons, disruptedBy(got))
		}
	}
	ds, err := w.appliedDecisions(ctx, w.runIDs()...)
	if err == nil {
		for _, d := range ds {
			if w.harmed[d.attempt] == faultNodeLost && d.label != sdk.LabelInfraReplace && d.label != sdk.LabelTaskRetry {
				w.early = append(w.early, fmt.Sprintf("%s marked %s while its node was unreachable and its agent heartbeat", d.attempt, d.label))
			}
		}
	}
	meanwhile := "nothing reaped meanwhile, their agents still heartbeat"
	if len(w.early) > 0 {
		meanwhile = fmt.Sprintf("%d reaped meanwhile though their agents heartbeat", len(w.early))
	}
	say("%6.1fs  NODE       %s NotReady and tainted; its pods deleted after %.0fs (%s); %s",
		w.at(), w.real.Name, waited.Seconds(), strings.Join(reasons, ", "), meanwhile)
	w.resumeKubelet()
	say("%6.1fs  NODE       kubelet resumed: it ends the deleted pods' containers", w.at())
}

// watchNodeBack lets the binder place pods on the node again once it is
// Ready and its NoExecute taints are gone.
func (w *kubeWorld) watchNodeBack(ctx context.Context) {
	if !w.nodeHeld.Load() {
		return
	}
	n, err := w.cs.CoreV1().Nodes().Get(ctx, w.real.Name, metav1.GetOptions{})
	if err != nil || !kubetest.NodeReady(n) {
		return
	}
	for _, t := range n.Spec.Taints {
		if t.Effect == corev1.TaintEffectNoExecute {
			return
		}
	}
	w.nodeHeld.Store(false)
	say("%6.1fs  NODE       %s Ready again and untainted: pods are bound to it again (held meanwhile)", w.at(), w.real.Name)
}

// placeReal is the binder's placement on the real node: every pod there,
// none while the node is held.
func (w *kubeWorld) placeReal(_ *corev1.Pod, nodes []string) string {
	if w.nodeHeld.Load() {
		return ""
	}
	return nodes[0]
}

// dropFinalizers removes a pod's finalizers.
func (w *kubeWorld) dropFinalizers(ctx context.Context, p corev1.Pod) error {
	patch := []byte(`{"metadata":{"finalizers":null}}`)
	_, err := w.cs.CoreV1().Pods(kubeNamespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing the finalizers of pod %s: %w", p.Name, err)
	}
	return nil
}

// disruptedBy is the reason of a pod's DisruptionTarget condition.
func disruptedBy(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			return c.Reason
		}
	}
	return "no DisruptionTarget"
}

// othersFinished reports whether every task but the node fault's has
// finished.
func (w *kubeWorld) othersFinished(tis []board.TaskInstance) bool {
	for _, ti := range tis {
		if w.sc.faults[ti.RunID+"/"+ti.TaskID] == faultNodeLost {
			continue
		}
		if !sdk.IsTerminalState(ti.State) {
			return false
		}
	}
	return true
}

// leftovers says what the real node left on the machine once the cluster
// has stopped (nothing, after a clean stop); checked is false when the
// machine's node is another cluster's since (its programs and cgroups
// are then that cluster's).
func leftovers(clusterDir string) (left []string, checked bool) {
	if b, err := os.ReadFile(kubetest.NodeOwner); err == nil && strings.TrimSpace(string(b)) != clusterDir {
		return nil, false
	}
	return kubetest.NodeLeftovers(clusterDir), true
}

// reportLeftovers says what the real node of the cluster in clusterDir
// left on the machine once the cluster has stopped, and reports whether it
// left nothing (or whether that cannot be told: the machine's node is
// another cluster's since).
func reportLeftovers(clusterDir string) bool {
	switch left, checked := leftovers(clusterDir); {
	case !checked:
		say("the machine's real node is another cluster's now: what this one left is not told apart from it")
	case len(left) > 0:
		say("the real node left behind: %s", strings.Join(left, "; "))
		return false
	default:
		say("the real node left nothing behind: no kubelet, containerd, shim, kube-proxy or firewall rule, mount, /kubepods cgroup, netns or bridge")
	}
	return true
}

// ledger is the HTTP server on the gateway the tasks in real containers
// report their executions to.
type ledger struct {
	url   string
	srv   *http.Server
	done  chan struct{}
	mu    sync.Mutex
	execs map[sdk.Attempt]*execution
}

// execution is what the ledger heard of one attempt's execution.
type execution struct {
	first, last time.Time
	ended       bool
	rc          int
}

func startLedger() (*ledger, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(kubetest.NodeGateway, "0"))
	if err != nil {
		return nil, fmt.Errorf("the ledger: listen on the gateway: %w", err)
	}
	l := &ledger{url: "http://" + ln.Addr().String(), done: make(chan struct{}), execs: map[sdk.Attempt]*execution{}}
	l.srv = &http.Server{Handler: http.HandlerFunc(l.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() { defer close(l.done); _ = l.srv.Serve(ln) }()
	return l, nil
}

func (l *ledger) close() {
	_ = l.srv.Close()
	<-l.done
}

func (l *ledger) serve(rw http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	try, err1 := strconv.Atoi(q.Get("try"))
	epoch, err2 := strconv.Atoi(q.Get("epoch"))
	if err1 != nil || err2 != nil || (r.URL.Path != "/ping" && r.URL.Path != "/end") {
		http.NotFound(rw, r)
		return
	}
	a := sdk.Attempt{RunID: q.Get("run"), TaskID: q.Get("task"), Try: int32(try), Epoch: int32(epoch)}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.execs[a]
	if e == nil {
		e = &execution{first: now}
		l.execs[a] = e
	}
	e.last = now
	if r.URL.Path == "/end" {
		e.ended = true
		e.rc, _ = strconv.Atoi(q.Get("rc"))
	}
}

// completeRuns counts, per task, the executions that ran to their end
// with exit code 0.
func (l *ledger) completeRuns() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for a, e := range l.execs {
		if e.ended && e.rc == 0 {
			out[a.RunID+"/"+a.TaskID]++
		}
	}
	return out
}

// doubles lists the pairs of executions of one task that ran at once: one
// heard from while the other had been heard from before and again after.
func (l *ledger) doubles() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	byTask := map[string][]sdk.Attempt{}
	for a := range l.execs {
		byTask[a.RunID+"/"+a.TaskID] = append(byTask[a.RunID+"/"+a.TaskID], a)
	}
	var out []string
	for _, as := range byTask {
		for i := range as {
			for j := i + 1; j < len(as); j++ {
				x, y := l.execs[as[i]], l.execs[as[j]]
				if x.first.Before(y.last) && y.first.Before(x.last) {
					out = append(out, fmt.Sprintf("%s and %s ran at once", as[i], as[j]))
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// signalAll sends sig to every process listed.
func signalAll(procs []kubetest.PodProcess, sig syscall.Signal) {
	for _, p := range procs {
		_ = syscall.Kill(p.PID, sig)
	}
}

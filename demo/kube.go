package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/runner/kuberunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/substrate/kube/podrecord"
	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/kubetest/kubelet"
)

// The kube demo's fixed names.
const (
	kubeNamespace = "demo"
	nodeStay      = "kwok-demo-1" // where every pod goes, but those of the node fault's tasks
	nodeLost      = "kwok-demo-2" // the node the demo deletes
	leaseName     = "reaperd"
)

// Fault kinds of the kube demo.
const (
	faultPodDeleted = "pod"     // the attempt's pod deleted under it
	faultNodeLost   = "node"    // the node deleted, with every pod on it
	faultEvicted    = "evict"   // an eviction through the Eviction API
	faultAgentKill  = "agent"   // kill -9 the agent inside its pod
	faultLeaderKill = "leader"  // kill -9 the leading reaperd
	faultOrphanRun  = "orphans" // every pod of a run deleted
)

// kubeScenario is what the kube demo runs: its runs, what it does to which
// task, and how long it gives the runs to finish. The test runs a shorter
// one.
type kubeScenario struct {
	name string              // the session's directory name under $TMPDIR (with the uid)
	bin  string              // where reaperd, the plugins and reaper-agent are
	runs map[string][]string // run id -> one command per task (t1, t2, ...)
	// faults: run/task -> the fault injected once that task's first attempt
	// has been running for after; the node fault takes every task named
	// with it at once, the orphan run fault every task of its run.
	faults map[string]string
	after  time.Duration
	// leaderAfter: the leading reaperd is killed once the task named by
	// faults[...] = faultLeaderKill has been running this long.
	leaderAfter time.Duration
	ladder      string // the ladder, leader and maintenance blocks
	deadline    time.Duration
	// node is where the pods run: nodeAuto, nodeReal or nodePlayer.
	node string
	// unavailable, when set, is taken as the reason the machine cannot
	// host a real node (kubetest.Options.RealNodeUnavailable: a test of
	// the fallback).
	unavailable string
}

// kubeDemo is `make demo-kube`'s scenario.
func kubeDemo(bin string) kubeScenario {
	long, short := "sleep 20", "sleep 4"
	return kubeScenario{
		name: "reaper-demo-kube",
		bin:  bin,
		runs: map[string][]string{
			"demo":   {long, long, long, long, long, long, short, short, short, short},
			"demo-b": {long, long},
		},
		faults: map[string]string{
			"demo/t1": faultPodDeleted,
			"demo/t2": faultNodeLost, "demo/t3": faultNodeLost,
			"demo/t4": faultEvicted,
			"demo/t5": faultAgentKill,
			"demo/t6": faultLeaderKill,
			"demo-b":  faultOrphanRun,
		},
		after:       3 * time.Second,
		leaderAfter: 8 * time.Second,
		// The Lite demo's ladder, with the kube edition's thresholds
		// shortened too.
		ladder: demoLadder(`  pod_lost_floor         = "5s"
  infra_confirm_valve    = "8s"
  task_termination_grace = "2s"
`),
		deadline: 4 * time.Minute,
		node:     nodeAuto,
	}
}

// kubeWorld is what the kube demo runs besides the session: the cluster,
// its client, the replicas, the attempt API's front, and the player or
// the real node with its ledger.
type kubeWorld struct {
	*session
	sc       kubeScenario
	cluster  *kubetest.Cluster
	cs       kubernetes.Interface
	replicas []*replica
	front    *front
	player   *kubelet.Player    // nil on the real node
	journals string             // the agents' journals (the player's)
	real     *kubetest.RealNode // nil on the player
	ledger   *ledger            // the real node's tasks' executions
	where    nodeReport
	deadline time.Duration // the runs' deadline, the real node's faults' time added

	harmed   map[sdk.Attempt]string            // the attempts a fault took, and which
	faulted  map[string]bool                   // faults keys already injected
	loss     *nodeLoss                         // the real node's node lost, once begun
	early    []string                          // attempts reaped while their node was unreachable
	seen     map[sdk.Attempt]podrecord.Outcome // the pods' outcome records read so far
	nodeHeld atomic.Bool                       // the binder binds nothing to the real node
}

func runKube(ctx context.Context, sc kubeScenario) int {
	code, _, err := runKubeOn(ctx, sc)
	if err != nil {
		return fail(err)
	}
	return code
}

// runKubeOn runs the kube demo and says where its pods ran. An error is a
// set-up that failed: a *noRealNode when told to run on the real node
// where the machine cannot host one.
func runKubeOn(ctx context.Context, sc kubeScenario) (int, nodeReport, error) {
	switch sc.node {
	case nodePlayer:
		say("kube demo: the pods run on the kubelet player (-node %s)", nodePlayer)
	case nodeReal:
		say("kube demo: the pods run on the real node (kubelet, containerd, runc), or the demo fails saying why (-node %s)", nodeReal)
	default:
		say("kube demo: the pods run on the real node (kubelet, containerd, runc) where this machine can host one, else on the kubelet player (-node %s forces it)", nodePlayer)
	}
	s, err := open(ctx, sc.name, sc.bin)
	if err != nil {
		return 1, nodeReport{}, err
	}
	defer s.close()
	w := &kubeWorld{session: s, sc: sc, harmed: map[sdk.Attempt]string{}, faulted: map[string]bool{},
		seen: map[sdk.Attempt]podrecord.Outcome{}, deadline: sc.deadline}
	if err := w.setUp(ctx); err != nil {
		return 1, w.where, err
	}
	code := w.run(ctx)
	clusterDir := w.cluster.Dir()
	s.close()
	if w.real != nil && !reportLeftovers(clusterDir) {
		code = 1
	}
	return code, w.where, nil
}

// setUp starts the cluster (with the real node where asked for and
// possible), the attempt API's front, two reaperd replicas and the kubelet
// player or the real node's ledger, and submits the runs.
func (w *kubeWorld) setUp(ctx context.Context) error {
	wantReal, why := w.sc.node != nodePlayer, "asked for with -node "+nodePlayer
	if _, err := os.Stat(w.staticAgentPath()); wantReal && err != nil {
		why = "no " + staticAgent + " beside the demo for the task image (make demo-kube builds it, CGO_ENABLED=0)"
		if w.sc.node == nodeReal {
			return &noRealNode{why}
		}
		wantReal = false
	}
	also := ""
	if wantReal {
		also = " and a real node where this machine can host one (one per machine: a start waits while another runs)"
	}
	say("starting the local control plane: etcd, kube-apiserver, KWOK (+ kube-controller-manager)%s ...", also)
	say("  (the first time, its binaries are built from source: about 11 minutes, progress below)")
	opts := kubetest.Options{Dir: filepath.Join(w.dir, "cluster"), RealNode: wantReal,
		RealNodeUnavailable: w.sc.unavailable, Build: kubetest.BuildOptions{Progress: os.Stdout}}
	c, err := kubetest.Start(ctx, opts)
	if err != nil && wantReal && w.sc.node == nodeAuto && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		// The machine's one real node stayed another cluster's past the
		// wait (kubetest.NodeWait), or did not come up in time.
		why = "it did not come up in time: " + err.Error()
		say("no real node (%s); starting the control plane for the player instead ...", why)
		wantReal, opts.RealNode = false, false
		c, err = kubetest.Start(ctx, opts)
	}
	if err != nil {
		return err
	}
	w.undo = append(w.undo, func() { _ = c.Stop() })
	w.cluster = c
	if w.cs, err = kubernetes.NewForConfig(c.AdminConfig()); err != nil {
		return fmt.Errorf("the API client: %w", err)
	}
	parts := "kube-apiserver " + kubetest.KubernetesVersion + ", etcd, KWOK"
	if c.HasControllerManager() {
		parts += ", kube-controller-manager"
	}
	if _, err := w.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kubeNamespace}},
		metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating namespace %s: %w", kubeNamespace, err)
	}
	// The task pods run as the runner's task ServiceAccount, as the chart
	// creates it.
	if err := kubetest.CreateServiceAccount(ctx, w.cs, kubeNamespace, kuberunner.ServiceAccountDefault); err != nil {
		return err
	}
	if wantReal {
		n, nwhy := c.RealNode()
		if n == nil && w.sc.node == nodeReal {
			return &noRealNode{nwhy}
		}
		w.real, why = n, nwhy
	}
	w.where = nodeReport{real: w.real != nil, why: why}
	kwokNodes := []string{nodeStay, nodeLost}
	if w.real != nil {
		// One Ready KWOK node beside the real one, empty: with every node
		// not Ready the controller manager would stop evicting.
		kwokNodes = kwokNodes[:1]
		w.deadline += realNodeExtra
		// A real pod takes seconds to start on a loaded machine, and the
		// node lost holds new pods until the node is back: a longer
		// dispatch_lost than the player's (demoLadder's 10s).
		w.sc.ladder = strings.Replace(w.sc.ladder, `dispatch_lost  = "10s"`, `dispatch_lost  = "30s"`, 1)
	}
	for _, n := range kwokNodes {
		if _, err := c.CreateNode(ctx, n); err != nil {
			return err
		}
	}
	say("cluster up at %s (%s); KWOK nodes %s", c.Host(), parts, strings.Join(kwokNodes, " and "))
	frontAt := "127.0.0.1"
	if w.real != nil {
		say("NODE: the pods run on the real node %s (a real kubelet, containerd and runc); KWOK node %s stands Ready beside it, empty",
			w.real.Name, nodeStay)
		if err := w.setUpRealNode(ctx); err != nil {
			return err
		}
		frontAt = kubetest.NodeGateway
	} else {
		say("NODE: the pods run on the kubelet player, on KWOK nodes (no real node: %s)", why)
	}

	// Every replica serves the attempt API; the pods reach whichever is
	// up through one address, as they would through a Service.
	if w.front, err = startFront(frontAt); err != nil {
		return err
	}
	w.undo = append(w.undo, w.front.close)
	cfgPath := filepath.Join(w.dir, "reaperd.hcl")
	if err := w.prepare(ctx, cfgPath, w.config()); err != nil {
		return err
	}
	for i := 1; i <= 2; i++ {
		name := "reaperd-" + strconv.Itoa(i)
		r, err := w.startReaperd(cfgPath, name)
		if err != nil {
			return err
		}
		select {
		case <-r.ready:
		case <-ctx.Done():
			return ctx.Err()
		}
		if r.apiURL() == "" {
			return fmt.Errorf("%s did not start; its log is in %s", name, w.keepLogs())
		}
		w.front.add(r.apiURL())
		w.replicas = append(w.replicas, r)
	}
	say("started reaperd-1 and reaperd-2 on the Lease %s/%s (interval 2s, pod_lost_floor 5s, settling grace 8s)",
		kubeNamespace, leaseName)

	if w.real != nil {
		// The cluster has no kube-scheduler: the binder plays it, every
		// pod to the real node.
		binder, err := kubetest.StartBinder(ctx, kubetest.BinderConfig{Client: w.cs, Namespace: kubeNamespace,
			Nodes: []string{w.real.Name}, Place: w.placeReal})
		if err != nil {
			return err
		}
		w.undo = append(w.undo, binder.Stop)
		say("the real kubelet runs each pod's agent in a container; the demo binds pods to the node (no kube-scheduler)")
	} else if err := w.startPlayer(ctx); err != nil {
		return err
	}
	return w.submit(ctx)
}

// startPlayer starts the kubelet player and the binder placing the pods
// on the KWOK nodes.
func (w *kubeWorld) startPlayer(ctx context.Context) error {
	w.journals = filepath.Join(w.dir, "journals")
	if err := os.MkdirAll(w.journals, 0o700); err != nil {
		return err
	}
	player, err := kubelet.Start(ctx, kubelet.Config{
		Client: w.cs, Namespace: kubeNamespace, Dir: filepath.Join(w.dir, "containers"),
		Commands: map[string]string{kuberunner.AgentPathDefault: filepath.Join(w.bin, "reaper-agent")},
		Env:      []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), agent.JournalDirEnv + "=" + w.journals},
		MaxGrace: 2 * time.Second,
		Logger:   hclog.New(&hclog.LoggerOptions{Output: w.logFile("kubelet-player.log"), Level: hclog.Info}),
	})
	if err != nil {
		return err
	}
	w.undo = append(w.undo, player.Stop)
	w.player = player
	// The cluster has no kube-scheduler: the binder plays it, and gives
	// each pod to the player (its owner label) before binding it.
	binder, err := kubetest.StartBinder(ctx, kubetest.BinderConfig{Client: w.cs, Namespace: kubeNamespace,
		Nodes: []string{nodeStay, nodeLost}, Place: placePod(w.sc.faults),
		Labels: map[string]string{kubelet.LabelOwner: kubelet.OwnerValue}})
	if err != nil {
		return err
	}
	w.undo = append(w.undo, binder.Stop)
	say("the kubelet player runs each pod's agent as a local process; the demo binds pods to nodes (no kube-scheduler)")
	return nil
}

// submit submits the runs; on the real node each task reports its
// executions to the ledger, and the node fault's tasks hold their first
// execution until the node is lost.
func (w *kubeWorld) submit(ctx context.Context) error {
	writer := lifecycle.New(w.pool, lifecycle.Options{})
	for _, id := range w.runIDs() {
		run := lifecycle.NewRun{RunID: id, DagID: "demo-kube", State: sdk.RunRunning}
		for i, cmd := range w.sc.runs[id] {
			task := "t" + strconv.Itoa(i+1)
			if w.real != nil {
				cmd = w.realTaskCommand(cmd, w.sc.faults[id+"/"+task] == faultNodeLost)
			}
			run.Tasks = append(run.Tasks, lifecycle.NewTask{TaskID: task, Executor: sdk.ExecutorKube,
				Retries: 1, Command: cmd})
		}
		if err := writer.CreateRun(ctx, run, time.Now()); err != nil {
			return fmt.Errorf("submitting run %s: %w", id, err)
		}
		say("submitted run %q: %d tasks (%s)", id, len(run.Tasks), summarizeCommands(w.sc.runs[id]))
	}
	if w.real != nil && w.hasNodeFault() {
		say("on the real node the node fault's tasks run until their node is lost, once every other task has finished")
	}
	say("")
	return nil
}

// config is the replicas' configuration (the same file for both).
func (w *kubeWorld) config() string {
	kc := w.cluster.Kubeconfig()
	runner, tls := fmt.Sprintf(`runner {
  kube {
    image             = "reaper-demo-task"
    termination_grace = "2s"
    attempt_api       = %q
  }
}`, w.front.url()), ""
	if w.real != nil {
		runner, tls = w.realRunner(), w.realTLS()
	}
	return fmt.Sprintf(`edition    = "kube"
plugin_dir = %q
store {
  dsn = %q
}
leader "kubernetes" {
  namespace  = %q
  name       = %q
  kubeconfig = %q
  lease      = "4s"
}
%s
telemetry {
  listen = "127.0.0.1:0"
}
substrate "kube" {
  namespace  = %q
  kubeconfig = %q
}
%s
attempt_api {
  listen    = "127.0.0.1:0"
  state_dir = %q
%s}
reaper "dispatchlost" {}
reaper "podlost" {}
reaper "agentlost" {}
reaper "warmworker" {}
reaper "orphanrun" {}
`, w.bin, w.dsn, kubeNamespace, leaseName, kc, w.sc.ladder, kubeNamespace, kc, runner, filepath.Join(w.dir, "attempt-api"), tls)
}

func (w *kubeWorld) logFile(name string) *os.File {
	f, err := os.Create(filepath.Join(w.dir, name))
	if err != nil {
		return os.Stderr
	}
	w.undo = append(w.undo, func() { _ = f.Close() })
	return f
}

func (w *kubeWorld) runIDs() []string {
	ids := make([]string, 0, len(w.sc.runs))
	for id := range w.sc.runs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func summarizeCommands(cmds []string) string {
	n := map[string]int{}
	var order []string
	for _, c := range cmds {
		if n[c] == 0 {
			order = append(order, c)
		}
		n[c]++
	}
	parts := make([]string, len(order))
	for i, c := range order {
		parts[i] = fmt.Sprintf("%d x %s", n[c], c)
	}
	return strings.Join(parts, ", ")
}

// run watches the runs, injects the faults and ends with the summary.
func (w *kubeWorld) run(ctx context.Context) int {
	alive := func() bool { return w.live() > 0 }
	inject := func(tis []board.TaskInstance) {
		w.inject(ctx, tis)
		// The pods' records as they finish: a finished pod may be gone
		// by the summary (the taint manager deletes the pods of a lost
		// node, finished ones included, once the sweep released them).
		w.records(ctx)
	}
	if code := w.watch(ctx, w.runIDs(), w.deadline, alive, inject); code != 0 {
		return code
	}
	code := w.summary(ctx)
	w.explain(ctx, "demo", "t2") // why was t2, on the lost node, reaped?
	return code
}

// live counts the replicas still running.
func (w *kubeWorld) live() int {
	n := 0
	for _, r := range w.replicas {
		select {
		case <-r.done:
		default:
			n++
		}
	}
	return n
}

// inject injects every fault whose moment has come.
func (w *kubeWorld) inject(ctx context.Context, tis []board.TaskInstance) {
	byRun := map[string][]board.TaskInstance{}
	for _, ti := range tis {
		byRun[ti.RunID] = append(byRun[ti.RunID], ti)
	}
	firstRunning := func(ti board.TaskInstance, after time.Duration) bool {
		return ti.State == sdk.StateRunning && ti.Try == 1 && ti.Epoch == 0 && !ti.RunningAt.IsZero() &&
			time.Since(ti.RunningAt) > after
	}
	var nodeTasks []board.TaskInstance
	nodeReady := true
	for _, ti := range tis {
		key := ti.RunID + "/" + ti.TaskID
		fault, ok := w.sc.faults[key]
		if !ok || w.faulted[key] {
			continue
		}
		switch fault {
		case faultNodeLost:
			nodeTasks = append(nodeTasks, ti)
			nodeReady = nodeReady && firstRunning(ti, w.sc.after)
		case faultLeaderKill:
			if firstRunning(ti, w.sc.leaderAfter) {
				msg, err := w.killLeader()
				w.note(key, msg, err)
			}
		default:
			if firstRunning(ti, w.sc.after) {
				msg, err := w.harm(ctx, fault, ti.Attempt)
				w.note(key, msg, err)
			}
		}
	}
	if w.real != nil {
		w.watchNodeLoss(ctx)
	}
	if len(nodeTasks) > 0 && nodeReady && (w.real == nil || w.othersFinished(tis)) {
		loseNode := w.loseNode
		if w.real != nil {
			loseNode = func(ctx context.Context) (string, error) { return w.loseRealNode(ctx, nodeTasks) }
		}
		msg, err := loseNode(ctx)
		for _, ti := range nodeTasks {
			w.faulted[ti.RunID+"/"+ti.TaskID] = err == nil
		}
		w.report(msg, err)
	}
	for run, tis := range byRun {
		if w.sc.faults[run] != faultOrphanRun || w.faulted[run] {
			continue
		}
		ready := len(tis) > 0
		for _, ti := range tis {
			ready = ready && firstRunning(ti, w.sc.after)
		}
		if ready {
			msg, err := w.deleteRunPods(ctx, run)
			w.faulted[run] = err == nil
			w.report(msg, err)
		}
	}
}

func (w *kubeWorld) note(key string, msg string, err error) {
	w.faulted[key] = err == nil
	w.report(msg, err)
}

// podName is the name of attempt a's pod, as the kube runner recorded it
// with the pod's UID (a pod's name carries a part drawn at each create, so
// it cannot be computed from the attempt).
func (w *kubeWorld) podName(ctx context.Context, a sdk.Attempt) (string, error) {
	rec, err := lifecycle.New(w.pool, lifecycle.Options{}).RecordedPod(ctx, a)
	if err != nil {
		return "", err
	}
	if rec.Name == "" {
		return "", fmt.Errorf("no pod recorded for %s yet", a)
	}
	return rec.Name, nil
}

// harm injects a fault into one attempt's pod.
func (w *kubeWorld) harm(ctx context.Context, fault string, a sdk.Attempt) (string, error) {
	pods := w.cs.CoreV1().Pods(kubeNamespace)
	name, err := w.podName(ctx, a)
	if err != nil {
		return "", err
	}
	switch fault {
	case faultPodDeleted:
		if err := pods.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			return "", err
		}
		w.harmed[a] = fault
		return fmt.Sprintf("pod %s of %s deleted under its running attempt", name, a), nil
	case faultEvicted:
		if err := pods.EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: kubeNamespace}}); err != nil {
			return "", err
		}
		w.harmed[a] = fault
		return fmt.Sprintf("pod %s of %s evicted through the Eviction API", name, a), nil
	case faultAgentKill:
		pid, err := w.agentOf(ctx, name)
		if err != nil {
			return "", err
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			return "", err
		}
		w.harmed[a] = fault
		return fmt.Sprintf("kill -9 agent %d inside pod %s of %s (the container's main process)", pid, name, a), nil
	}
	return "", fmt.Errorf("unknown fault %q", fault)
}

// loseNode deletes the node the node fault's tasks run on, and every pod
// bound to it, at once: a node and its machine gone. The machine's
// processes (the pods' containers) are frozen first, so that no agent on it
// gets to say anything, as none would.
func (w *kubeWorld) loseNode(ctx context.Context) (string, error) {
	pods, err := w.cs.CoreV1().Pods(kubeNamespace).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + nodeLost})
	if err != nil {
		return "", err
	}
	w.freeze(pods.Items)
	if err := w.cs.CoreV1().Nodes().Delete(ctx, nodeLost, metav1.DeleteOptions{}); err != nil {
		return "", err
	}
	var names []string
	for _, p := range pods.Items {
		if err := w.forceDelete(ctx, p); err != nil {
			return "", err
		}
		if a, ok := kube.PodAttempt(p.Labels, p.Annotations); ok {
			w.harmed[a] = faultNodeLost
			names = append(names, a.String())
		}
	}
	return fmt.Sprintf("node %s deleted with its %d pods (%s)", nodeLost, len(pods.Items), strings.Join(names, ", ")), nil
}

// deleteRunPods makes every pod of run vanish at once: their containers
// frozen, then the pods deleted, so that no agent of the run reports.
func (w *kubeWorld) deleteRunPods(ctx context.Context, run string) (string, error) {
	pods, err := w.cs.CoreV1().Pods(kubeNamespace).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelRunID + "=" + run})
	if err != nil {
		return "", err
	}
	w.freeze(pods.Items)
	how := ""
	if w.real != nil {
		how = ": frozen and deleted, their outcome record finalizer removed as a purge out of band would"
	}
	for _, p := range pods.Items {
		if w.real != nil {
			// A real node's pod outlives its delete until its record is
			// read (the outcome record finalizer): it vanishes only when
			// that is removed too, as a purge out of band would.
			if err := w.dropFinalizers(ctx, p); err != nil {
				return "", err
			}
		}
		if err := w.forceDelete(ctx, p); err != nil {
			return "", err
		}
		if a, ok := kube.PodAttempt(p.Labels, p.Annotations); ok {
			w.harmed[a] = faultOrphanRun
		}
	}
	return fmt.Sprintf("every pod of run %s vanished (%d%s): the run has nothing left alive", run, len(pods.Items), how), nil
}

// freeze stops (SIGSTOP) every process of the pods' containers: the
// player's, each the session its container's process leads, or the real
// node's, in the pods' cgroups. The player or the kubelet kills them once
// it sees the pods deleted.
func (w *kubeWorld) freeze(pods []corev1.Pod) {
	if w.real != nil { // every process in the pods' cgroups
		for _, p := range pods {
			signalAll(w.podProcesses(p), unix.SIGSTOP)
		}
		return
	}
	sessions := map[int]bool{}
	for _, p := range pods {
		if pid, _, ok := w.player.Process(p.Name); ok {
			sessions[pid] = true
		}
	}
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if sid, err := unix.Getsid(pid); err == nil && sessions[sid] {
			_ = unix.Kill(pid, unix.SIGSTOP)
		}
	}
}

func (w *kubeWorld) forceDelete(ctx context.Context, p corev1.Pod) error {
	zero := int64(0)
	err := w.cs.CoreV1().Pods(kubeNamespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero,
		Preconditions: &metav1.Preconditions{UID: &p.UID}})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// killLeader kills the leading replica with SIGKILL.
func (w *kubeWorld) killLeader() (string, error) {
	for _, r := range w.replicas {
		select {
		case <-r.done:
			continue
		default:
		}
		if !r.leading.Load() {
			continue
		}
		pid := r.cmd.Process.Pid
		if err := r.cmd.Process.Kill(); err != nil {
			return "", err
		}
		return fmt.Sprintf("kill -9 %s (pid %d), the leader: the other replica takes the Lease once it lapses (4s)", r.name, pid), nil
	}
	return "", errors.New("no replica leads yet")
}

// placePod is the demo's scheduling: the node fault's tasks' first
// attempts go to the node that will be lost, every other pod to the one
// that stays.
func placePod(faults map[string]string) func(*corev1.Pod, []string) string {
	return func(p *corev1.Pod, _ []string) string {
		if a, ok := kube.PodAttempt(p.Labels, p.Annotations); ok && faults[a.RunID+"/"+a.TaskID] == faultNodeLost &&
			a.Try == 1 && a.Epoch == 0 {
			return nodeLost
		}
		return nodeStay
	}
}

// summary prints what happened, from the board, its audit, the pods'
// outcome records and the agents' journals, and checks it: every fault's
// attempt settled by a reaper or the sweep, every task succeeded, and no
// attempt a fault did not take was touched.
func (w *kubeWorld) summary(ctx context.Context) int {
	tis, ds, err := w.outcome(ctx, w.runIDs()...)
	if err != nil {
		return fail(err)
	}
	harmedTask := map[string]bool{}
	for a := range w.harmed {
		harmedTask[a.RunID+"/"+a.TaskID] = true
	}
	var reaped, settled, replaced, retried, overridden int
	var touched []string
	judged := map[sdk.Attempt]bool{} // a reaper or the sweep decided on it
	retriedA := map[sdk.Attempt]bool{}
	// markedBy: the reaper's mark a runner's decision acted on, for the
	// attempts whose mark has no decision of its own in the audit (below).
	markedBy := map[sdk.Attempt]string{}
	for _, d := range ds {
		if isReap(d.mark) {
			markedBy[d.attempt] = d.mark
		}
		switch {
		case isReap(d.label):
			reaped++
			judged[d.attempt] = true
			if d.attempt.TaskID == "" && w.sc.faults[d.attempt.RunID] != faultOrphanRun {
				touched = append(touched, fmt.Sprintf("run %s failed by %s", d.attempt.RunID, d.label))
			} else if _, ok := w.harmed[d.attempt]; !ok && d.attempt.TaskID != "" {
				touched = append(touched, fmt.Sprintf("%s marked %s", d.attempt, d.label))
			}
		case d.label == sdk.LabelReconcileSettled:
			settled++
			judged[d.attempt] = true
			if _, ok := w.harmed[d.attempt]; !ok {
				touched = append(touched, fmt.Sprintf("%s settled by the sweep", d.attempt))
			}
		case d.label == sdk.LabelReconcileInfraOverride:
			overridden++
		case d.label == sdk.LabelInfraReplace:
			replaced++
		case d.label == sdk.LabelTaskRetry:
			retried++
			retriedA[d.attempt] = true
		}
	}
	// A harmed attempt is answered by a reaper's mark, the sweep's
	// settlement, or (a pod deleted or evicted while its agent ran: the
	// player sends SIGTERM as a kubelet would) its own agent's report.
	// A leader killed with SIGKILL between a reaper's mark and the audit
	// of its decision leaves the mark on the board without its decision
	// row (the audit is written after the mark, docs/operate.md): the
	// attempt was answered, by that mark, and the summary says whose
	// decision the audit lost rather than calling the attempt unanswered.
	byAgent := 0
	var unanswered, unaudited []string
	for a := range w.harmed {
		switch {
		case judged[a]:
		case retriedA[a]:
			byAgent++
		case markedBy[a] != "":
			reaped++
			unaudited = append(unaudited, fmt.Sprintf("%s (%s)", a, markedBy[a]))
		default:
			unanswered = append(unanswered, a.String())
		}
	}
	sort.Strings(unanswered)
	sort.Strings(unaudited)
	succeeded := 0
	records := w.records(ctx)
	ran, ranFrom := w.journalRuns(), "its agents' journals show"
	var doubles []string
	if w.real != nil {
		ran, ranFrom, doubles = w.ledger.completeRuns(), "the ledger heard", w.ledger.doubles()
		touched = append(touched, w.early...)
	}
	for _, ti := range tis {
		if ti.State == sdk.StateSuccess {
			succeeded++
		}
		key := ti.RunID + "/" + ti.TaskID
		if harmedTask[key] {
			continue
		}
		// An attempt no fault took: one attempt, ended by its own agent
		// with a SUCCESS record, its task run once to the end.
		switch {
		case ti.Try != 1 || ti.Epoch != 0:
			touched = append(touched, fmt.Sprintf("%s needed more than one attempt", ti.Attempt))
		case records[ti.Attempt] != podrecord.Success:
			touched = append(touched, fmt.Sprintf("%s: its pod's record says %q", ti.Attempt, records[ti.Attempt]))
		case ran[key] != 1:
			touched = append(touched, fmt.Sprintf("%s: %s %d complete runs of the task", ti.Attempt, ranFrom, ran[key]))
		}
	}
	counts := []count{
		{"tasks", len(tis)}, {"attempts", attempts(tis)}, {"faults injected", w.injected},
		{"attempts taken by a fault", len(w.harmed)},
		{"reaped", reaped}, {"settled by the sweep", settled}, {"ended by their agent (SIGTERM)", byAgent},
		{"re-placed", replaced}, {"retried", retried},
		{"overridden", overridden}, {"succeeded", succeeded}, {"live attempts touched", len(touched)},
	}
	if w.real != nil {
		counts = append(counts, count{"double executions (the ledger)", len(doubles)})
	}
	w.printSummary(counts)
	ok := len(touched) == 0 && len(unanswered) == 0 && len(doubles) == 0 && succeeded == len(tis) && w.injected == w.faultCount()
	for _, t := range touched {
		say("  touched: %s", t)
	}
	for _, d := range doubles {
		say("  double execution: %s", d)
	}
	if len(unanswered) > 0 {
		say("  taken but never reaped or settled: %s", strings.Join(unanswered, ", "))
	}
	if len(unaudited) > 0 {
		say("  reaped, the mark's own decision lost with the killed leader (its re-placement names it): %s",
			strings.Join(unaudited, ", "))
	}
	if !ok {
		say("\nsomething went wrong: see the lines above and the logs in %s", w.keepLogs())
		return 1
	}
	if w.real != nil {
		say("\nevery fault was settled, every task succeeded, no live attempt was touched and no task ran twice at once.")
		return 0
	}
	say("\nevery fault was settled, every task succeeded, and no live attempt was touched.")
	return 0
}

// hasNodeFault reports whether the scenario loses a node.
func (w *kubeWorld) hasNodeFault() bool {
	for _, f := range w.sc.faults {
		if f == faultNodeLost {
			return true
		}
	}
	return false
}

// faultCount is how many faults the scenario injects (the node fault's
// tasks are one fault).
func (w *kubeWorld) faultCount() int {
	n, node := 0, false
	for _, f := range w.sc.faults {
		if f == faultNodeLost {
			node = true
			continue
		}
		n++
	}
	if node {
		n++
	}
	return n
}

// records reads the outcome record each finished task pod's agent left in
// its termination message, by the attempt it names, with those read
// before (of pods deleted since).
func (w *kubeWorld) records(ctx context.Context) map[sdk.Attempt]podrecord.Outcome {
	out := w.seen
	pods, err := w.cs.CoreV1().Pods(kubeNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		say("demo: listing the pods: %v", err)
		return out
	}
	for _, p := range pods.Items {
		for _, c := range p.Status.ContainerStatuses {
			if c.Name != kube.TaskContainer || c.State.Terminated == nil {
				continue
			}
			if rec, ok := podrecord.Parse(c.State.Terminated.Message); ok {
				out[rec.Attempt()] = rec.Outcome
			}
		}
	}
	return out
}

// journalRuns counts, per task, the attempts whose agent journal shows the
// task run to its end with exit code 0.
func (w *kubeWorld) journalRuns() map[string]int {
	out := map[string]int{}
	files, _ := filepath.Glob(filepath.Join(w.journals, "*.journal"))
	for _, f := range files {
		entries, err := agent.ReadJournal(f)
		if err != nil {
			continue
		}
		for _, e := range entries {
			if e.Event == agent.JournalTaskEnd && e.ExitCode != nil && *e.ExitCode == 0 {
				out[e.RunID+"/"+e.TaskID]++
			}
		}
	}
	return out
}

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/testkit/helmrelease"
	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// The helm demo (make demo-helm): the kube edition installed the way a
// user installs it, by its Helm chart from its image (testkit/helmrelease,
// the install tier's walk), into a local cluster that hosts in-cluster
// workloads (kubetest.Options.InCluster: kube-scheduler, kube-proxy,
// CoreDNS and the real node). A run of tasks is submitted with reaperctl;
// once they run, the leading replica's pod is deleted and then a task's
// pod; the other replica takes the Lease, the task is placed again, every
// task succeeds. Then helm uninstall, and the cluster and PostgreSQL are
// stopped: nothing is left behind.

// helmRun is the run the helm demo submits.
const helmRun = "demo"

// helmScenario is what the helm demo runs.
type helmScenario struct {
	name    string // the session's directory name under $TMPDIR (with the uid)
	bin     string // where reaperd and reaperctl are
	version string // the image's version, its tag
	tasks   int    // the run's tasks
	command string // each task's command
	// after: the faults begin once every task's first attempt has been
	// running this long.
	after    time.Duration
	deadline time.Duration // for the run
	// unavailable, when set, is taken as the reason the machine cannot
	// host the real node (a test of the failure).
	unavailable string
}

// helmDemo is `make demo-helm`'s scenario.
func helmDemo(bin, version string) helmScenario {
	return helmScenario{name: "reaper-demo-helm", bin: bin, version: version, tasks: 4, command: "sleep 20",
		after: 3 * time.Second, deadline: 4 * time.Minute}
}

// helmWorld is the helm demo as it runs.
type helmWorld struct {
	*session
	sc      helmScenario
	cluster *kubetest.Cluster
	rel     *helmrelease.Release
	figures []figure

	// The faults, one after the other (stage): the leading replica's pod
	// deleted, then, once another replica holds the Lease, a task's pod.
	stage       int
	leaderGone  time.Time // when the leading replica's pod was deleted
	oldHolder   string    // the Lease's holder then
	harmedTask  string    // the task whose pod was deleted
	harmedPod   string
	submittedAt time.Time
}

// figure is a measured duration the demo ends with.
type figure struct {
	label string
	d     time.Duration
}

func (w *helmWorld) figure(label string, d time.Duration) {
	w.figures = append(w.figures, figure{label, d.Round(100 * time.Millisecond)})
}

func runHelm(ctx context.Context, sc helmScenario) int {
	code, err := runHelmOn(ctx, sc)
	if err != nil {
		return fail(err)
	}
	return code
}

// runHelmOn runs the helm demo. An error is a step that failed (a
// *noRealNode, before anything, where the machine cannot host the real
// node).
func runHelmOn(ctx context.Context, sc helmScenario) (int, error) {
	why := sc.unavailable
	if why == "" {
		why = kubetest.HostCheck()
	}
	if why != "" {
		return 1, fmt.Errorf("the chart's pods run on the test cluster's real node: %w", &noRealNode{why})
	}
	say("helm demo: reaper's kube edition installed the way a user installs it, by its Helm chart (%s) from its image", helmrelease.ChartDir)
	say("  the image built by tools/image (make image) and imported into the node's containerd, as a pull would put it there;")
	say("  a throwaway PostgreSQL outside the cluster, on the pod network's gateway %s, as a managed database would be;", kubetest.NodeGateway)
	say("  the Secrets, reaperd migrate from this machine, helm install with a values file, runs submitted with reaperctl;")
	say("  the cluster: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, CoreDNS and one real node")
	say("  (kubelet, containerd, runc) on this machine. Then the leading replica's pod and a task pod are deleted under a")
	say("  running run; at the end helm uninstall, the cluster and PostgreSQL stopped, and nothing left behind.")
	say("  (kubectl's steps are done through the API server with client-go, and shown as the kubectl command;")
	say("  helm, reaperd and reaperctl run as shown.)")
	s, err := openDir(sc.name, sc.bin)
	if err != nil {
		return 1, err
	}
	defer s.close()
	w := &helmWorld{session: s, sc: sc}
	code, err := w.play(ctx)
	if err != nil {
		if w.rel != nil {
			w.dumpRelease()
		}
		return 1, fmt.Errorf("%w (logs in %s)", err, w.keepLogs())
	}
	say("")
	say("stopping the cluster and PostgreSQL ...")
	begin := time.Now()
	clusterDir := w.cluster.Dir()
	s.close()
	w.figure("the cluster and PostgreSQL stopped", time.Since(begin))
	if !reportLeftovers(clusterDir) {
		code = 1
	}
	w.figure("the whole demo", time.Since(w.start))
	w.printFigures()
	return code, nil
}

// play runs the demo's steps; an error is one that could not be taken.
func (w *helmWorld) play(ctx context.Context) (int, error) {
	if err := w.startCluster(ctx); err != nil {
		return 1, err
	}
	if err := w.prepare(ctx); err != nil {
		return 1, err
	}
	if err := w.install(ctx); err != nil {
		return 1, err
	}
	code, err := w.run(ctx)
	if err != nil {
		return 1, err
	}
	if code != 0 {
		w.dumpRelease()
		_ = w.keepLogs()
	}
	if err := w.uninstall(ctx); err != nil {
		return 1, err
	}
	return code, nil
}

// startCluster starts the cluster that hosts in-cluster workloads, with
// its real node.
func (w *helmWorld) startCluster(ctx context.Context) error {
	say("")
	say("starting the cluster: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, CoreDNS, a real node")
	say("  and, where this machine has ipset, a NetworkPolicy enforcer ...")
	say("  (the first time, their binaries are built from source, with progress; one real node per machine: the start")
	say("  waits while another cluster holds it)")
	begin := time.Now()
	stop := helmrelease.Progress(os.Stdout, "starting the cluster")
	c, err := kubetest.Start(ctx, kubetest.Options{Dir: filepath.Join(w.dir, "cluster"), InCluster: true,
		RealNodeUnavailable: w.sc.unavailable, Build: kubetest.BuildOptions{Progress: os.Stdout}})
	stop()
	if err != nil {
		return err
	}
	w.undo = append(w.undo, func() { _ = c.Stop() })
	w.cluster = c
	n, why := c.RealNode()
	if n == nil {
		return &noRealNode{why}
	}
	w.figure("cluster start (its build included, if any)", time.Since(begin))
	say("cluster up in %s: kube-apiserver %s at %s; real node %s Ready (kubelet, containerd, runc; pods on %s, bridge %s);",
		time.Since(begin).Round(100*time.Millisecond), kubetest.KubernetesVersion, c.Host(), n.Name, kubetest.NodeSubnet, kubetest.NodeBridge)
	say("  kube-scheduler places the pods, kube-proxy routes the Services (%s), CoreDNS answers for %s",
		kubetest.ServiceRange, kubetest.ClusterDomain)
	if ok, why := c.NetworkPolicies(); ok {
		say("  kube-router's policy controller enforces NetworkPolicies: the chart's among them")
	} else {
		say("  NetworkPolicies are not enforced: %s", why)
	}
	return nil
}

// prepare starts PostgreSQL on the gateway and takes the steps before helm
// install: the task image, reaperd migrate, the namespace, the Secrets,
// the product's image.
func (w *helmWorld) prepare(ctx context.Context) error {
	say("starting a throwaway PostgreSQL on %s, the pod network's gateway, open to the pods' subnet %s by password ...",
		kubetest.NodeGateway, kubetest.NodeSubnet)
	srv, err := w.startDatabase(ctx, pgtest.Options{Listen: []string{kubetest.NodeGateway}, AllowFrom: []string{kubetest.NodeSubnet}})
	if err != nil {
		return err
	}
	root, err := helmrelease.FindRoot()
	if err != nil {
		return err
	}
	say("")
	say("$ export KUBECONFIG=%s", w.cluster.Kubeconfig())
	rel, err := helmrelease.Prepare(ctx, helmrelease.Config{Cluster: w.cluster, DB: srv, Root: root, Bin: w.bin,
		Dir: filepath.Join(w.dir, "release"), Say: say})
	if err != nil {
		return err
	}
	w.undo = append(w.undo, func() { _ = rel.Close() })
	w.rel = rel
	w.useBoard(srv.DSN(rel.Database), rel.Board)
	w.cfg = rel.HostConfig // reaperctl explain's

	say("building the image %s:%s with tools/image, as make image does, and importing it into the node ...",
		helmrelease.ImageRepository, w.sc.version)
	say("  (on your cluster: pushed to a registry the nodes pull from; a cold build compiles every command: minutes)")
	begin := time.Now()
	if err := rel.ImportImage(ctx, helmrelease.ImageOptions{Version: w.sc.version, Progress: os.Stdout}); err != nil {
		return err
	}
	w.figure("image built and imported", time.Since(begin))
	return nil
}

// install runs helm install, waits for both replicas to be Ready and
// follows their logs.
func (w *helmWorld) install(ctx context.Context) error {
	say("")
	took, err := w.rel.Install(ctx, w.sc.version)
	if err != nil {
		return err
	}
	say("$ kubectl -n %s rollout status deployment/%s", helmrelease.Namespace, helmrelease.Name)
	w.figure("helm install to both replicas Ready", took)
	leader, _, err := w.rel.Leader(ctx, "")
	if err != nil {
		return err
	}
	say("both replicas Ready by their own probes %s after helm install began; %s holds the Lease %s/%s",
		took.Round(100*time.Millisecond), leader.Name, helmrelease.Namespace, helmrelease.Name)
	pods, err := w.rel.Replicas(ctx)
	if err != nil {
		return err
	}
	showPods(helmrelease.Namespace, pods)
	w.followReplicas(ctx)
	return nil
}

// run submits the run, injects the faults while it runs, and ends with
// the task pods, their Events, the summary and its verdict.
func (w *helmWorld) run(ctx context.Context) (int, error) {
	say("")
	w.submittedAt = time.Now()
	if err := w.rel.Submit(ctx, helmRun, w.sc.tasks, w.sc.command); err != nil {
		return 1, err
	}
	say("submitted run %q: %d tasks (%s), each a pod the in-cluster kube runner creates in %s", helmRun, w.sc.tasks,
		w.sc.command, helmrelease.TaskNamespace)
	say("")
	inject := func(tis []board.TaskInstance) { w.inject(ctx, tis) }
	if code := w.watch(ctx, []string{helmRun}, w.sc.deadline, func() bool { return true }, inject); code != 0 {
		return code, nil
	}
	w.figure("reaperctl submit to every task succeeded", time.Since(w.submittedAt))
	if err := w.rel.WaitReleased(ctx); err != nil {
		return 1, err
	}
	pods, err := w.rel.TaskPods(ctx, helmRun)
	if err != nil {
		return 1, err
	}
	say("")
	showPods(helmrelease.TaskNamespace, pods)
	if err := w.showEvents(ctx); err != nil {
		return 1, err
	}
	if w.harmedTask != "" {
		w.explain(ctx, helmRun, w.harmedTask) // why was it placed again?
	}
	return w.summary(ctx), nil
}

// inject takes the faults, one stage after the other, as the run's tasks
// allow: once every task's first attempt has run a while, the leading
// replica's pod is deleted; once another replica holds the Lease, a
// running task's pod is deleted; then the task is seen placed again.
func (w *helmWorld) inject(ctx context.Context, tis []board.TaskInstance) {
	switch w.stage {
	case 0:
		if len(tis) != w.sc.tasks {
			return
		}
		for _, ti := range tis {
			if ti.State != sdk.StateRunning || ti.Try != 1 || ti.Epoch != 0 || ti.RunningAt.IsZero() ||
				time.Since(ti.RunningAt) < w.sc.after {
				return
			}
		}
		if pods, err := w.rel.TaskPods(ctx, helmRun); err == nil {
			say("%6.1fs  PODS       every task runs in a pod of its own, placed by kube-scheduler:", w.at())
			showPods(helmrelease.TaskNamespace, pods)
		}
		pod, holder, err := w.rel.Leading(ctx)
		if err != nil || pod.Name == "" {
			return
		}
		leader := pod.Name
		if err := w.rel.Client.CoreV1().Pods(helmrelease.Namespace).Delete(ctx, leader, metav1.DeleteOptions{}); err != nil {
			w.report("", err)
			return
		}
		w.oldHolder, w.leaderGone, w.stage = holder, time.Now(), 1
		w.report(fmt.Sprintf("kubectl -n %s delete pod %s: the leading replica, holding the Lease", helmrelease.Namespace, leader), nil)
	case 1:
		leader, holder, err := w.rel.Leading(ctx)
		if err != nil || leader.Name == "" || holder == w.oldHolder {
			return
		}
		took := time.Since(w.leaderGone)
		w.figure("leader's pod deleted to the other replica holding the Lease", took)
		say("%6.1fs  LEASE      %s holds the Lease %s after the leader's pod was deleted; the Deployment replaces that pod",
			w.at(), leader.Name, took.Round(100*time.Millisecond))
		task := ""
		for _, ti := range tis {
			if ti.State == sdk.StateRunning && (task == "" || ti.TaskID < task) {
				task = ti.TaskID
			}
		}
		if task == "" {
			w.stage = 3 // the run ended meanwhile: no task pod to take
			return
		}
		pod, err := w.rel.RunningTaskPod(ctx, helmRun, task)
		if err == nil {
			err = w.rel.Client.CoreV1().Pods(helmrelease.TaskNamespace).Delete(ctx, pod.Name, metav1.DeleteOptions{})
		}
		w.stage = 2
		if err != nil {
			w.report("", err)
			w.stage = 3
			return
		}
		w.harmedTask, w.harmedPod = task, pod.Name
		w.report(fmt.Sprintf("kubectl -n %s delete pod %s: the pod of %s/%s, under its running attempt",
			helmrelease.TaskNamespace, pod.Name, helmRun, task), nil)
	case 2:
		for _, ti := range tis {
			if ti.TaskID != w.harmedTask || ti.Epoch == 0 && ti.Try == 1 || ti.State != sdk.StateRunning {
				continue
			}
			pods, err := w.rel.TaskPods(ctx, helmRun)
			if err != nil {
				return
			}
			for _, p := range pods {
				a, ok := kube.PodAttempt(p.Labels, p.Annotations)
				if ok && a == ti.Attempt && p.Status.Phase == corev1.PodRunning {
					say("%6.1fs  PLACED     %s runs again in pod %s on %s (placed by kube-scheduler)", w.at(), ti.Attempt, p.Name, p.Spec.NodeName)
					w.stage = 3
				}
			}
		}
	}
}

// followReplicas follows the log of every replica that runs, as kubectl
// logs -f does, into the session's event lines (leadership, decisions,
// re-places) and a file each; close stops it.
func (w *helmWorld) followReplicas(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	w.undo = append(w.undo, func() { cancel(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		followed := map[types.UID]bool{}
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			pods, _ := w.rel.Replicas(ctx)
			for _, p := range pods {
				if followed[p.UID] || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Running == nil {
					continue
				}
				followed[p.UID] = true
				wg.Add(1)
				go func() { defer wg.Done(); w.followPod(ctx, p) }()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
}

// followPod follows one replica's log until it ends or ctx does.
func (w *helmWorld) followPod(ctx context.Context, p corev1.Pod) {
	stream, err := w.rel.Client.CoreV1().Pods(helmrelease.Namespace).GetLogs(p.Name,
		&corev1.PodLogOptions{Container: "reaperd", Follow: true}).Stream(ctx)
	if err != nil {
		return
	}
	defer stream.Close()
	w.follow(stream, &replica{name: p.Name, done: make(chan struct{}), ready: make(chan struct{})},
		filepath.Join(w.dir, p.Name+".log"))
}

// showPods prints pods as kubectl get pods -o wide does, in short.
func showPods(ns string, pods []corev1.Pod) {
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	say("$ kubectl -n %s get pods -o wide", ns)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tREADY\tSTATUS\tRESTARTS\tIP\tNODE")
	for _, p := range pods {
		status := string(p.Status.Phase)
		if p.DeletionTimestamp != nil {
			status = "Terminating"
		}
		ready, restarts := 0, int32(0)
		for _, c := range p.Status.ContainerStatuses {
			if c.Ready {
				ready++
			}
			restarts += c.RestartCount
		}
		fmt.Fprintf(tw, "%s\t%d/%d\t%s\t%d\t%s\t%s\n", p.Name, ready, len(p.Spec.Containers), status, restarts, p.Status.PodIP, p.Spec.NodeName)
	}
	_ = tw.Flush()
}

// showEvents prints the task namespace's Events as kubectl get events
// does, pod by pod, oldest first: the scheduler's, the kubelet's and
// reaperd's.
func (w *helmWorld) showEvents(ctx context.Context) error {
	events, err := w.rel.TaskEvents(ctx)
	if err != nil {
		return err
	}
	say("")
	say("$ kubectl -n %s get events", helmrelease.TaskNamespace)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TYPE\tREASON\tOBJECT\tFROM\tMESSAGE")
	for _, e := range events {
		from := e.ReportingController
		if from == "" {
			from = e.DeprecatedSource.Component
		}
		note := strings.ReplaceAll(e.Note, "\n", " ")
		if len(note) > 110 {
			note = note[:107] + "..."
		}
		fmt.Fprintf(tw, "%s\t%s\t%s/%s\t%s\t%s\n", e.Type, e.Reason, strings.ToLower(e.Regarding.Kind), e.Regarding.Name, from, note)
	}
	_ = tw.Flush()
	return nil
}

// summary prints what happened, from the board and its audit, and checks
// it: both faults taken, the harmed task placed again, every task
// succeeded, and no other attempt touched.
func (w *helmWorld) summary(ctx context.Context) int {
	tis, ds, err := w.outcome(ctx, helmRun)
	if err != nil {
		return fail(err)
	}
	var reaped, settled, replaced, retried int
	var touched []string
	for _, d := range ds {
		switch {
		case isReap(d.label):
			reaped++
		case strings.HasPrefix(d.label, "reconcile_"):
			settled++
		case d.label == sdk.LabelInfraReplace:
			replaced++
			continue
		case d.label == sdk.LabelTaskRetry:
			retried++
			continue
		default:
			continue // the operator's submit, and what touches no attempt
		}
		if d.attempt.TaskID != w.harmedTask {
			touched = append(touched, fmt.Sprintf("%s: %s by %s", d.attempt, d.label, d.reaper))
		}
	}
	succeeded, answered := 0, false
	for _, ti := range tis {
		if ti.State == sdk.StateSuccess {
			succeeded++
		}
		switch {
		case ti.TaskID == w.harmedTask:
			answered = ti.Try > 1 || ti.Epoch > 0
		case ti.Try != 1 || ti.Epoch != 0:
			touched = append(touched, fmt.Sprintf("%s needed more than one attempt", ti.Attempt))
		}
	}
	w.printSummary([]count{
		{"tasks", len(tis)}, {"attempts", attempts(tis)}, {"faults injected", w.injected},
		{"reaped", reaped}, {"settled by the sweep", settled}, {"re-placed", replaced}, {"retried", retried},
		{"succeeded", succeeded}, {"live attempts touched", len(touched)},
	})
	for _, t := range touched {
		say("  touched: %s", t)
	}
	switch {
	case w.injected != 2:
		say("\nonly %d of the 2 faults were injected", w.injected)
	case !answered:
		say("\nthe task whose pod was deleted (%s) was not placed again", w.harmedTask)
	case succeeded != len(tis) || len(touched) > 0:
	default:
		say("\nthe other replica took the Lease, the deleted task pod's attempt was settled and placed again, every task")
		say("succeeded, and no live attempt was touched.")
		return 0
	}
	say("\nsomething went wrong: see the lines above and the logs in %s", w.keepLogs())
	return 1
}

// uninstall waits for the sweep to release the task pods, runs helm
// uninstall, checks what it left and deletes the namespaces.
func (w *helmWorld) uninstall(ctx context.Context) error {
	say("")
	held, err := w.rel.HeldTaskPods(ctx)
	if err != nil {
		return err
	}
	if len(held) == 0 {
		say("the sweep released every task pod it held (the outcome record finalizer): nothing for the uninstall's finalizer step")
	}
	begin := time.Now()
	left, err := w.rel.Uninstall(ctx)
	if err != nil {
		return err
	}
	if len(left) > 0 {
		return errors.New("helm uninstall left " + strings.Join(left, "; "))
	}
	w.figure("helm uninstall", time.Since(begin))
	say("helm uninstall left nothing of reaperd's: no replica, Lease, admission policy or finalizer on a task pod")
	say("$ kubectl delete namespace %s %s", helmrelease.TaskNamespace, helmrelease.Namespace)
	return w.rel.DeleteNamespaces(ctx)
}

// dumpRelease writes the release's state (the runs, the decisions, the
// pods and their logs, the Events) to a log of the session's, kept with
// the others when the demo fails.
func (w *helmWorld) dumpRelease() {
	f, err := os.Create(filepath.Join(w.dir, "release-state.log"))
	if err != nil {
		return
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w.rel.Dump(ctx, f)
}

// printFigures prints the figures measured.
func (w *helmWorld) printFigures() {
	say("")
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FIGURES\t")
	for _, f := range w.figures {
		fmt.Fprintf(tw, "  %s\t%s\n", f.label, f.d)
	}
	_ = tw.Flush()
}

package soak

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/runner/kuberunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/kubetest/kubelet"
	"github.com/dexaflow/reaper/testkit/netfault"
)

// The kube edition of the soak (REAPER_SOAK_EDITION=kube): the same
// PostgreSQL, replicas, stream and invariants, on a local kube-apiserver
// with KWOK (and kube-controller-manager: Pod GC), the kube runner
// dispatching pods, the kubelet player running each Running pod's agent as
// a local process, and kubetest's binder binding each new pod to one of the
// live nodes (the cluster has no kube-scheduler).

// Edition switch.
const (
	editionEnv  = "REAPER_SOAK_EDITION" // "lite" (default) or "kube"
	editionLite = "lite"
	editionKube = "kube"
)

// Ladder additions of the kube edition.
const (
	podLostFloor      = 5 * time.Second
	infraConfirmValve = 10 * time.Second
	podGrace          = 2 * time.Second // task_termination_grace: the pods' grace
	kubeNodes         = 3
	// apiTimeout bounds every request the soak's harness makes: a paused
	// API server answers nothing.
	apiTimeout = 5 * time.Second
)

// Kube fault kinds.
const (
	FaultPodDelete = "delete_pod"
	FaultNodeLoss  = "delete_node"
	FaultEviction  = "evict_pod"
	FaultAPIPause  = "pause_apiserver"
	// FaultAPIPartition cuts one replica from the API server (its own
	// netfault proxy in front of kube-apiserver, its own kubeconfig naming
	// it) while the others, the nodes and the soak see it.
	FaultAPIPartition = "partition_replica_from_apiserver"
)

// kubeNemeses are the kube editions' nemeses beside the Lite ones (which
// they throw too): the report gives each its figures.
var kubeNemeses = []string{FaultAPIPartition, FaultTeardownRefused}

// kubeFaultWeights: the kube edition's draw. The Lite faults that have no
// meaning on a pod (an escaped child, a task group apart from its agent, a
// wedged agent) are left out; the Lite nemeses are in, with the partition
// from the API server.
var kubeFaultWeights = []faultWeight{
	{FaultAgentKill, 3}, {FaultPodDelete, 4}, {FaultNodeLoss, 2}, {FaultEviction, 3}, {FaultAPIPause, 1},
	{FaultLeaderKill, 2}, {FaultLeaderPause, 2}, {FaultPostgres, 1}, {FaultBurst, 1},
	{FaultPartition, 2}, {FaultFreeze, 1}, {FaultFailover, 1}, {FaultAPIPartition, 2},
}

// kubeRecoveryBound adds to the Lite bound what a pod costs: an infra mark
// re-placed unconfirmed (the valve) and a pod's grace.
const kubeRecoveryBound = recoveryBound + infraConfirmValve + podGrace

// kubeWorld is the cluster side of a kube soak.
type kubeWorld struct {
	s          *soak
	c          *kubetest.Cluster
	cs         kubernetes.Interface
	ns         string
	player     *kubelet.Player
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	apiPauseMu sync.Mutex // one API server pause at a time

	binder *kubetest.Binder // the scheduler: binds each new pod to a live node

	// apiLinks are, by replica slot (apiLinks[slot-1]), the proxies each
	// replica reaches the API server through (FaultAPIPartition cuts one);
	// apiCut the slots cut now (guarded by mu).
	apiLinks []*netfault.Proxy
	apiCut   map[int]bool

	// On the real node (realnode_test.go): the node, the attempt API's
	// address on its gateway, the journals brought out of the pods and
	// the pids they name resolved; one kubelet fault at a time.
	real      *kubetest.RealNode
	apiListen string
	journals  *journalLinker
	pids      *pidResolver
	kubeletMu sync.Mutex
	// teardownMu: one teardown refused past the valve at a time.
	teardownMu sync.Mutex

	mu      sync.Mutex // guards nodeSeq, stops, seen, apiCut
	nodeSeq int
	stops   []PodStop
	seen    map[string]bool // pod UIDs whose deletion is recorded
}

// startKube starts the cluster, its nodes, the player and the scheduler.
func (s *soak) startKube(ctx context.Context, env []string) {
	t := s.t
	c, err := kubetest.Start(ctx, kubetest.Options{BaseDir: s.dir})
	if err != nil {
		t.Fatal(err)
	}
	k := &kubeWorld{s: s, c: c, cs: c.Client(t), seen: map[string]bool{}, apiCut: map[int]bool{}}
	s.kube = k
	k.ns = "soak"
	wctx, err := k.makeNamespace(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if k.binder, err = kubetest.StartBinder(wctx, kubetest.BinderConfig{Client: k.cs, Namespace: k.ns,
		Place: placeByName, Timeout: apiTimeout}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < kubeNodes; i++ {
		if err := k.addNode(ctx); err != nil {
			t.Fatal(err)
		}
	}
	logf, err := os.OpenFile(filepath.Join(s.logDir, "kubelet-player.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logf.Close() })
	// Every pod the runner makes carries the run label: the player runs
	// them all.
	if k.player, err = kubelet.Start(wctx, kubelet.Config{
		Client: k.cs, Namespace: k.ns, Dir: filepath.Join(s.dir, "containers"), Selector: kube.LabelRunID,
		Commands: map[string]string{"reaper-agent": filepath.Join(s.bin, "reaper-agent")},
		Env:      playerEnv(env), MaxGrace: podGrace,
		Logger: hclog.New(&hclog.LoggerOptions{Name: "player", Output: logf, Level: hclog.Info}),
	}); err != nil {
		t.Fatal(err)
	}
	if err := k.watch(wctx); err != nil {
		t.Fatal(err)
	}
}

// makeNamespace creates the soak's namespace and returns the context of
// the cluster side's goroutines (k.cancel ends it).
func (k *kubeWorld) makeNamespace(ctx context.Context) (context.Context, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := k.cs.CoreV1().Namespaces().Create(cctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: k.ns}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create the soak's namespace: %w", err)
	}
	if err := kubetest.CreateServiceAccount(cctx, k.cs, k.ns, kuberunner.ServiceAccountDefault); err != nil {
		return nil, err
	}
	wctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	k.cancel = stop
	return wctx, nil
}

// playerEnv is the base environment of the played containers: the soak's
// marker, journal and temporary directory reach every agent through it.
func playerEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		for _, p := range []string{"PATH=", "HOME=", markEnv + "=", agent.JournalDirEnv + "="} {
			if strings.HasPrefix(kv, p) {
				out = append(out, kv)
			}
		}
	}
	return out
}

func (k *kubeWorld) addNode(ctx context.Context) error {
	k.mu.Lock()
	k.nodeSeq++
	name := fmt.Sprintf("soak-node-%d", k.nodeSeq)
	k.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := k.c.CreateNode(cctx, name); err != nil {
		return err
	}
	k.binder.AddNode(name)
	return nil
}

// placeByName spreads the pods over the live nodes by a hash of their
// names.
func placeByName(p *corev1.Pod, nodes []string) string {
	h := 0
	for _, b := range []byte(p.Name) {
		h = h*31 + int(b)
	}
	return nodes[(h&0x7fffffff)%len(nodes)]
}

// watch starts the pod stop recorder: an informer on the namespace's
// pods.
func (k *kubeWorld) watch(ctx context.Context) error {
	all := informers.NewSharedInformerFactoryWithOptions(k.cs, 0, informers.WithNamespace(k.ns))
	if _, err := all.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, cur any) { k.podChanged(old, cur) },
		DeleteFunc: func(obj any) { k.podDeleted(obj) },
	}); err != nil {
		return fmt.Errorf("watch the soak's pods: %w", err)
	}
	all.Start(ctx.Done())
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		<-ctx.Done()
		all.Shutdown()
	}()
	return nil
}

// podChanged records a pod's deletion (its deletion timestamp set) and a
// lowered deadline, as the API server reports them.
func (k *kubeWorld) podChanged(oldObj, curObj any) {
	old, ok1 := oldObj.(*corev1.Pod)
	cur, ok2 := curObj.(*corev1.Pod)
	if !ok1 || !ok2 {
		return
	}
	switch {
	case old.DeletionTimestamp == nil && cur.DeletionTimestamp != nil:
		k.stopped(cur, "deleted")
	case cur.Spec.ActiveDeadlineSeconds != nil &&
		(old.Spec.ActiveDeadlineSeconds == nil || *cur.Spec.ActiveDeadlineSeconds < *old.Spec.ActiveDeadlineSeconds):
		k.stopped(cur, fmt.Sprintf("deadline lowered to %ds", *cur.Spec.ActiveDeadlineSeconds))
	}
}

func (k *kubeWorld) podDeleted(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if p, ok := obj.(*corev1.Pod); ok {
		k.stopped(p, "deleted")
	}
}

// stopped records a stop of a pod (a deletion once per pod).
func (k *kubeWorld) stopped(p *corev1.Pod, how string) {
	a, ok := kube.PodAttempt(p.Labels, p.Annotations)
	if !ok {
		return
	}
	at := k.s.tl.now()
	k.mu.Lock()
	defer k.mu.Unlock()
	if how == "deleted" {
		if k.seen[string(p.UID)] {
			return
		}
		k.seen[string(p.UID)] = true
	}
	k.stops = append(k.stops, PodStop{At: at, Attempt: a, Pod: p.Name, How: how, Phase: string(p.Status.Phase)})
}

// podStops copies the stops recorded so far.
func (k *kubeWorld) podStops() []PodStop {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]PodStop(nil), k.stops...)
}

// podOf finds the pod of attempt a.
func (k *kubeWorld) podOf(ctx context.Context, a sdk.Attempt) (*corev1.Pod, error) {
	l, _ := kube.AttemptLabels(a)
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	list, err := k.cs.CoreV1().Pods(k.ns).List(cctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(l).String()})
	if err != nil {
		return nil, err
	}
	for i := range list.Items {
		if p := &list.Items[i]; p.DeletionTimestamp == nil && p.Annotations[kube.AnnotationRawTaskID] == a.TaskID {
			return p, nil
		}
	}
	return nil, errNoTarget
}

// injectKube throws one of the kube faults.
func (in *injector) injectKube(ctx context.Context, st step) (*Fault, error) {
	s, k := in.s, in.s.kube
	kind, pick, d1, dPause := st.kind, st.pick, st.d1, st.dLeader
	switch kind {
	case FaultPodDelete, FaultEviction:
		e, ok := in.target(pick)
		if !ok {
			return nil, errNoTarget
		}
		p, err := k.podOf(ctx, e.Attempt)
		if err != nil {
			return nil, err
		}
		cctx, cancel := context.WithTimeout(ctx, apiTimeout)
		defer cancel()
		// Recorded before the request: the watch may see the pod go
		// before the request returns, and a check in between must know
		// whose stop it was.
		a, at := e.Attempt, s.tl.now()
		f := in.record(Fault{Kind: kind, At: at, Ended: at, Target: &a, KilledGroup: true, ClusterStop: true,
			Detail: fmt.Sprintf("pod %s of %s (agent %d)", p.Name, a, e.AgentPID)})
		if kind == FaultPodDelete {
			err = k.cs.CoreV1().Pods(k.ns).Delete(cctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}})
		} else {
			err = k.cs.PolicyV1().Evictions(k.ns).Evict(cctx, &policyv1.Eviction{
				ObjectMeta:    metav1.ObjectMeta{Name: p.Name, Namespace: k.ns},
				DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}}})
		}
		if refused(err) {
			in.withdraw(f)
			return nil, err
		}
		// Any other error (a paused API server's timeout) may still have
		// gone through: the fault stands.
		return f, nil

	case FaultNodeLoss:
		node := k.binder.TakeNode(func(nodes []string) string {
			if len(nodes) < 2 {
				return ""
			}
			return nodes[int(pick%uint64(len(nodes)))]
		})
		if node == "" {
			return nil, errNoTarget
		}
		at := s.tl.now()
		harmed := map[sdk.Attempt]bool{}
		before, _ := k.podsOn(ctx, node)
		for _, p := range before {
			if a, ok := kube.PodAttempt(p.Labels, p.Annotations); ok && live(p) {
				harmed[a] = true
			}
		}
		cctx, cancel := context.WithTimeout(ctx, apiTimeout)
		err := k.cs.CoreV1().Nodes().Delete(cctx, node, metav1.DeleteOptions{})
		cancel()
		if err != nil && !apierrors.IsNotFound(err) {
			s.fail(Violation{Check: "harness", Evidence: "delete node " + node + ": " + err.Error()})
			return nil, err
		}
		after, _ := k.podsOn(ctx, node)
		for _, p := range after {
			if a, ok := kube.PodAttempt(p.Labels, p.Annotations); ok && live(p) {
				harmed[a] = true
			}
			if !k.c.HasControllerManager() {
				// No Pod GC: the node's pods go as a lost node's do.
				zero := int64(0)
				dctx, cancel := context.WithTimeout(ctx, apiTimeout)
				_ = k.cs.CoreV1().Pods(k.ns).Delete(dctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
				cancel()
			}
		}
		var targets []sdk.Attempt
		for a := range harmed {
			targets = append(targets, a)
		}
		sort.Slice(targets, func(i, j int) bool { return targets[i].String() < targets[j].String() })
		f := Fault{Kind: kind, At: at, KilledGroup: true, ClusterStop: true, Others: targets,
			Detail: fmt.Sprintf("node %s with %d pods, a new node after %s", node, len(targets), d1.Round(time.Millisecond))}
		rec := in.record(f)
		sleep(context.WithoutCancel(ctx), d1)
		if err := k.addNode(context.WithoutCancel(ctx)); err != nil {
			s.fail(Violation{Check: "harness", Evidence: "add a node: " + err.Error()})
		}
		in.ended(rec)
		return rec, nil

	case FaultKubeletKill, FaultKubeletPause:
		return in.injectKubelet(ctx, kind, d1, dPause)

	case FaultTeardownRefused:
		return in.injectTeardownRefused(ctx, st)

	case FaultAPIPartition:
		slot, how, ok := in.partitionTarget(pick)
		if !ok || slot > len(k.apiLinks) {
			return nil, errNoTarget
		}
		k.mu.Lock()
		busy := k.apiCut[slot]
		k.apiCut[slot] = true
		k.mu.Unlock()
		if busy {
			return nil, errNoTarget
		}
		defer func() {
			k.mu.Lock()
			delete(k.apiCut, slot)
			k.mu.Unlock()
		}()
		p := k.apiLinks[slot-1]
		p.Cut()
		f := in.record(Fault{Kind: kind, At: s.tl.now(),
			Detail: fmt.Sprintf("reaperd #%d (%s) cut from the API server for %s", slot, how, st.dCut.Round(time.Millisecond))})
		sleep(ctx, st.dCut)
		p.Heal()
		in.ended(f)
		return f, nil

	case FaultAPIPause:
		if !k.apiPauseMu.TryLock() {
			return nil, errNoTarget
		}
		defer k.apiPauseMu.Unlock()
		if err := k.c.PauseAPIServer(); err != nil {
			return nil, err
		}
		f := in.record(Fault{Kind: kind, At: s.tl.now(),
			Detail: fmt.Sprintf("kube-apiserver stopped (SIGSTOP) for %s", dPause.Round(time.Millisecond))})
		sleep(context.WithoutCancel(ctx), dPause)
		if err := k.c.ResumeAPIServer(); err != nil {
			s.fail(Violation{Check: "harness", Evidence: "resume the API server: " + err.Error()})
		}
		in.ended(f)
		return f, nil
	}
	return nil, fmt.Errorf("unknown fault kind %q", kind)
}

// live: the pod has not ended (its task may run).
func live(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodPending || p.Status.Phase == corev1.PodRunning
}

// refused: the API server answered the request and did nothing (the pod
// gone or replaced, an eviction turned down).
func refused(err error) bool {
	return apierrors.IsNotFound(err) || apierrors.IsConflict(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err)
}

// podsOn lists the namespace's pods bound to node.
func (k *kubeWorld) podsOn(ctx context.Context, node string) ([]*corev1.Pod, error) {
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	list, err := k.cs.CoreV1().Pods(k.ns).List(cctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		return nil, err
	}
	out := make([]*corev1.Pod, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, &list.Items[i])
	}
	return out, nil
}

// kubeLeftovers lists the pods not final at the end: every run is final,
// so a pod still pending or running is a task nobody stopped.
func (k *kubeWorld) leftovers() []string {
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	list, err := k.cs.CoreV1().Pods(k.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return []string{"pods: could not list them: " + err.Error()}
	}
	var out []string
	for _, p := range list.Items {
		if p.Status.Phase == corev1.PodPending || p.Status.Phase == corev1.PodRunning {
			out = append(out, fmt.Sprintf("pod %s %s on %q", p.Name, p.Status.Phase, p.Spec.NodeName))
		}
	}
	return out
}

// stop stops the player, the scheduler and the cluster.
func (k *kubeWorld) stop() {
	if k.player != nil {
		k.player.Stop()
	}
	if k.binder != nil {
		k.binder.Stop()
	}
	if k.cancel != nil {
		k.cancel()
	}
	k.wg.Wait()
	for _, p := range k.apiLinks {
		_ = p.Close()
	}
	if k.journals != nil {
		k.saveJournals()
	}
	if err := k.c.Stop(); err != nil {
		k.s.logf("stop the cluster: %v", err)
	}
}

// replicaConfigs gives each replica slot its own path to the API server:
// a netfault proxy in front of kube-apiserver, a kubeconfig whose server is
// that proxy (the server's certificate names the loopback address, not the
// port), and a configuration, config with every mention of the cluster's
// kubeconfig (the Lease's, the substrate's) replaced by the slot's. It
// returns the configurations' paths by slot.
func (k *kubeWorld) replicaConfigs(dir, config string, n int) ([]string, error) {
	orig := k.c.Kubeconfig()
	kc, err := os.ReadFile(orig)
	if err != nil {
		return nil, fmt.Errorf("read the cluster's kubeconfig: %w", err)
	}
	cfg, err := os.ReadFile(config)
	if err != nil {
		return nil, fmt.Errorf("read the replicas' configuration: %w", err)
	}
	host := strings.TrimPrefix(k.c.Host(), "https://")
	if !strings.Contains(string(kc), host) || !strings.Contains(string(cfg), orig) {
		return nil, fmt.Errorf("the kubeconfig names no %s, or the configuration no %s", host, orig)
	}
	var out []string
	for slot := 1; slot <= n; slot++ {
		p, err := netfault.Listen(host)
		if err != nil {
			return nil, err
		}
		k.apiLinks = append(k.apiLinks, p)
		kpath := filepath.Join(dir, fmt.Sprintf("kubeconfig-%d", slot))
		if err := os.WriteFile(kpath, []byte(strings.ReplaceAll(string(kc), host, p.Addr())), 0o600); err != nil {
			return nil, fmt.Errorf("write replica %d's kubeconfig: %w", slot, err)
		}
		cpath := filepath.Join(dir, fmt.Sprintf("reaperd-%d.hcl", slot))
		if err := os.WriteFile(cpath, []byte(strings.ReplaceAll(string(cfg), orig, kpath)), 0o600); err != nil {
			return nil, fmt.Errorf("write replica %d's configuration: %w", slot, err)
		}
		out = append(out, cpath)
	}
	return out, nil
}

// kubeConfigHCL is every replica's configuration on the kube edition.
func kubeConfigHCL(bin, dsn, kubeconfig, ns, apiListen, apiState string) string {
	return kubeHCL(bin, dsn, kubeconfig, ns, apiListen, apiState, "", fmt.Sprintf(`runner {
  interval = %q
  kube {
    image = "reaper-soak"
  }
}`, runnerTick))
}

// kubeHCL is the kube edition's configuration with the attempt API's extra
// lines and the runner block given.
func kubeHCL(bin, dsn, kubeconfig, ns, apiListen, apiState, apiExtra, runner string) string {
	leader := fmt.Sprintf(`leader "kubernetes" {
  namespace  = %q
  name       = "reaperd"
  kubeconfig = %q
  lease      = %q
}
`, ns, kubeconfig, lease)
	ladder := fmt.Sprintf(`  pod_lost_floor         = %q
  infra_confirm_valve    = %q
  task_termination_grace = %q
`, podLostFloor, infraConfirmValve, podGrace)
	return baseHCL(editionKube, bin, dsn, leader, ladder, apiListen, apiState, apiExtra) + fmt.Sprintf(`
substrate "kube" {
  namespace  = %q
  kubeconfig = %q
}

%s

reaper "dispatchlost" {}
reaper "podlost" {}
reaper "agentlost" {}
reaper "orphanrun" {}
`, ns, kubeconfig, runner)
}

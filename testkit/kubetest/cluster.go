// Package kubetest runs a real Kubernetes control plane for tests: etcd,
// kube-apiserver (RBAC on), kube-controller-manager and KWOK, which
// simulates nodes and the kubelet's pod lifecycle, all on free loopback ports
// in a temporary directory. The binaries are built from source, pinned, by
// the nested module in tools/kubecluster, and cached in the user's cache
// directory (Build), with Helm for the chart's tests; the first build takes
// about eighteen minutes on two idle cores, a start from the cache a few
// seconds.
//
// A test package wires it in with
//
//	func TestMain(m *testing.M) { kubetest.Main(m) }
//
// and a test takes the cluster with kubetest.Current(t), a namespace of its
// own with NewNamespace, and simulated nodes with AddNode. Start and Stop run
// a cluster without the testing package (the kubecluster command uses them
// for make kube-up).
//
// What is real and what is simulated: the API server, etcd, admission, RBAC
// and the controllers (Pod GC, taint eviction, disruption, garbage
// collection, namespaces) are the upstream ones. There is no kubelet and no
// scheduler: a pod runs once its spec.nodeName names a node made by AddNode
// (set by the test, or by a Binder, which plays the scheduler), and KWOK
// moves it (Running at once, deleted at once, Failed with
// DeadlineExceeded at startTime + activeDeadlineSeconds; see
// kwok-stages.yaml). Everything else a kubelet would write (exit codes,
// termination messages, evictions for node pressure) a test writes itself
// through the status subresource, or the kubelet player (package
// kubetest/kubelet) writes for the containers it runs as local processes. The ServiceAccount admission plugin is off,
// so a pod can be created in a namespace the instant it exists.
//
// With Options.RealNode the cluster also runs a real node beside the KWOK
// nodes (realnode.go): the upstream kubelet, built from tools/kubenode, with
// the machine's containerd and runc and a CNI bridge, one per machine; a
// test takes it with NeedRealNode, which skips saying why on a machine that
// cannot host one (and fails instead with REAPER_REQUIRE_REAL_NODE=1).
//
// With Options.InCluster the cluster hosts in-cluster workloads as a real
// one does (incluster.go): the API server on the pod network's gateway
// behind the kubernetes Service, ServiceAccount tokens mounted into pods,
// kube-scheduler, kube-proxy, CoreDNS and, where the machine has ipset, a
// NetworkPolicy enforcer; the Helm chart is installed there from the image
// (test/install, testkit/helmrelease).
package kubetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// The cluster's identities, each with a static bearer token. Admin is in
// group system:masters; Alice, Bob and Carol are plain authenticated users
// that RBAC grants nothing until a test binds them a role.
const (
	Admin = "admin"
	Alice = "alice"
	Bob   = "bob"
	Carol = "carol"
)

// NodeAnnotation marks the nodes KWOK manages (AddNode sets it).
const NodeAnnotation = "kwok.x-k8s.io/node"

//go:embed kwok-stages.yaml
var kwokStages []byte

// Options configure Start.
type Options struct {
	// Dir is the cluster's directory (certificates, kubeconfigs, etcd's
	// data, logs). It must not exist or be empty; default: a fresh
	// directory under BaseDir.
	Dir string
	// BaseDir is where the default Dir is made; default os.TempDir().
	BaseDir string
	// Detached starts processes that outlive this one (make kube-up);
	// StopDir stops them. Otherwise they are children of this process and
	// die with it.
	Detached bool
	// NoControllerManager leaves kube-controller-manager out: no Pod GC,
	// taint eviction, garbage collection or namespace deletion, and a
	// smaller, quicker cluster.
	NoControllerManager bool
	// RealNode adds a real node (RealNode) beside the KWOK nodes: the
	// kubelet built from NodeSourceDir with the machine's containerd and
	// runc. Where the machine cannot host one, the cluster starts without
	// it and RealNode says why; where it can, its failure to start is
	// Start's. The controller manager then marks a node NotReady after
	// NodeMonitorGrace without a heartbeat.
	RealNode bool
	// RealNodeUnavailable, when set with RealNode, is taken as the reason
	// the machine cannot host a real node (a test of the skip).
	RealNodeUnavailable string
	// InCluster (which implies RealNode) makes a cluster that hosts
	// in-cluster workloads as a real one does (incluster.go): the API
	// server on the pod network's gateway behind the kubernetes Service,
	// ServiceAccount tokens mounted into pods, kube-scheduler placing pods,
	// kube-proxy programming the Services' ClusterIPs and CoreDNS answering
	// for their names. Where the machine cannot host a real node, Start
	// fails instead of starting without one: none of it works without.
	InCluster bool
	// StartTimeout bounds the start, the build excluded; default 2 minutes.
	StartTimeout time.Duration
	// Build configures the build of the binaries when they are not cached.
	Build BuildOptions
}

// Cluster is a running control plane.
type Cluster struct {
	dir       string
	bins      Binaries
	pki       pki
	tokens    map[string]string // user -> bearer token
	host      string            // https://127.0.0.1:port
	etcd      string            // etcd's client URL, http://127.0.0.1:port
	detached  bool
	kcm       bool
	realNode  bool
	inCluster bool
	netpol    bool   // the NetworkPolicy enforcer runs
	netpolWhy string // why it does not
	// prep is the real node's preparation (the machine's node taken, its
	// bridge made) when InCluster needs it before the API server starts.
	prep *nodePrep

	node     *RealNode // nil without one
	nodeWhy  string    // why there is no real node
	ownsNode bool      // the machine's real node is recorded as this cluster's

	mu    sync.Mutex // guards procs once Start has returned (outages swap one)
	procs []*process // in start order; stopped in reverse
	seq   atomic.Int64
	stop  sync.Once
}

// process is one of the cluster's programs.
type process struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
	log    string
	index  int      // its place in the start order, from 1 (its pid file's prefix)
	env    []string // what spawnEnv added to the environment, for a restart
}

// Start builds the binaries if the cache lacks them (with progress on
// opts.Build.Progress), then starts etcd, kube-apiserver, KWOK and
// kube-controller-manager and waits until each is ready.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	bins, err := Build(ctx, opts.Build)
	if err != nil {
		return nil, err
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 2 * time.Minute
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()

	dir := opts.Dir
	if dir == "" {
		base := opts.BaseDir
		if base == "" {
			base = os.TempDir()
		}
		removeStale(base)
		if dir, err = os.MkdirTemp(base, "reaper-kubetest-"); err != nil {
			return nil, fmt.Errorf("kubetest: make the cluster's directory: %w", err)
		}
	} else if err := makeEmptyDir(dir); err != nil {
		return nil, err
	}
	if opts.InCluster {
		opts.RealNode = true
		opts.NoControllerManager = false // ServiceAccounts, tokens, the root CA's ConfigMap, endpoints
	}
	c := &Cluster{dir: dir, bins: bins, detached: opts.Detached, kcm: !opts.NoControllerManager, realNode: opts.RealNode,
		inCluster: opts.InCluster}
	if !opts.RealNode {
		c.nodeWhy = "the cluster was started without one (kubetest.Options.RealNode)"
	}
	ok := false
	defer func() {
		if !ok {
			_ = c.Stop()
		}
	}()
	if !opts.Detached {
		// Marks the directory as this process's, so that a later start can
		// tell a leftover (its owner died) from a live one.
		if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			return nil, fmt.Errorf("kubetest: %w", err)
		}
	}
	for _, sub := range []string{"logs", "pids"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, fmt.Errorf("kubetest: %w", err)
		}
	}
	if c.pki, err = makePKI(dir); err != nil {
		return nil, err
	}
	if err := c.writeTokens(); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "kwok-stages.yaml"), kwokStages, 0o644); err != nil {
		return nil, fmt.Errorf("kubetest: write the KWOK stages: %w", err)
	}
	if opts.InCluster {
		if why := hostCheck(opts.RealNodeUnavailable); why != "" {
			return nil, fmt.Errorf("kubetest: a cluster for in-cluster workloads needs a real node, and this machine cannot host one: %s", why)
		}
		// The API server listens on the pod network's gateway, so the
		// machine's node and its bridge come first.
		if c.prep, err = c.prepareNode(parent, opts); err != nil {
			return nil, err
		}
		// The start's bound counts from here: the wait for the machine's
		// node (another cluster may hold it) is bounded apart.
		cancel()
		ctx, cancel = context.WithTimeout(parent, opts.StartTimeout)
		defer cancel()
	}
	// A free port can be taken between the probe and the bind: try again.
	for attempt := 1; ; attempt++ {
		err = c.launch(ctx)
		if err == nil {
			break
		}
		c.killAll()
		if attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return nil, err
		}
	}
	if opts.RealNode {
		// The wait for the machine's node (another package's test binary
		// may hold it for its whole run) is bounded apart from the start.
		if c.node, c.nodeWhy, err = c.startRealNode(parent, opts); err != nil {
			return nil, err
		}
	}
	ok = true
	return c, nil
}

// launch starts the processes in order, each waited for until ready.
func (c *Cluster) launch(ctx context.Context) error {
	c.procs = nil
	ports, err := freePorts(5)
	if err != nil {
		return err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	c.etcd = etcdURL
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	apiAddr := "127.0.0.1"
	if c.inCluster {
		// On the gateway: the pods reach it there, through the
		// kubernetes Service's ClusterIP, and so does this machine.
		apiAddr = NodeGateway
		if ports[2], err = freePortOn(NodeGateway); err != nil {
			return err
		}
	}
	c.host = "https://" + apiAddr + ":" + strconv.Itoa(ports[2])
	kwokAddr := "127.0.0.1:" + strconv.Itoa(ports[3])
	kcmPort := ports[4]

	etcdData := filepath.Join(c.dir, "etcd")
	_ = os.RemoveAll(etcdData) // from a failed attempt
	etcd, err := c.spawn("etcd", c.bins.Etcd,
		"--name", "kubetest",
		"--data-dir", etcdData,
		"--listen-client-urls", etcdURL,
		"--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL,
		"--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "kubetest="+peerURL,
		"--unsafe-no-fsync",
		"--log-level", "warn",
	)
	if err != nil {
		return err
	}
	if err := c.waitReady(ctx, etcd, func(ctx context.Context) error {
		body, err := get(ctx, http.DefaultClient, etcdURL+"/health", "")
		if err == nil && !bytes.Contains(body, []byte(`"health":"true"`)) {
			err = fmt.Errorf("not healthy: %s", body)
		}
		return err
	}); err != nil {
		return err
	}

	apiArgs := []string{
		"--etcd-servers", etcdURL,
		"--bind-address", apiAddr,
		"--secure-port", strconv.Itoa(ports[2]),
		"--cert-dir", filepath.Join(c.dir, "apiserver"),
		"--tls-cert-file", c.pki.servingCert,
		"--tls-private-key-file", c.pki.servingKey,
		"--client-ca-file", c.pki.caFile,
		"--token-auth-file", filepath.Join(c.dir, "tokens.csv"),
		"--authorization-mode", "RBAC",
		"--service-account-key-file", c.pki.serviceAccountPub,
		"--service-account-signing-key-file", c.pki.serviceAccountKey,
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range", "10.96.0.0/16",
		"--profiling=false",
	}
	if c.inCluster {
		// The kubernetes Service's endpoint is the gateway (the lease
		// reconciler writes it), and pods get their ServiceAccount's
		// token mounted, as in any cluster.
		apiArgs = append(apiArgs, "--advertise-address", NodeGateway, "--endpoint-reconciler-type", "lease")
	} else {
		apiArgs = append(apiArgs,
			// The apiserver refuses a loopback advertise address; with no
			// reconciler it needs none.
			"--endpoint-reconciler-type", "none",
			// No pod needs a ServiceAccount to exist first (see the package doc).
			"--disable-admission-plugins", "ServiceAccount")
	}
	if c.realNode && !c.inCluster {
		// A pod on a node that stopped reporting is deleted by the taint
		// manager after its toleration of the node's NoExecute taints,
		// which the API server's DefaultTolerationSeconds admission
		// writes into every pod (5 minutes unless told). A cluster for
		// in-cluster workloads keeps the 5 minutes, as a user's does.
		tol := strconv.Itoa(int(NodeLostToleration / time.Second))
		apiArgs = append(apiArgs, "--default-not-ready-toleration-seconds", tol, "--default-unreachable-toleration-seconds", tol)
	}
	apiserver, err := c.spawn(apiServerName, c.bins.KubeAPIServer, apiArgs...)
	if err != nil {
		return err
	}
	apiClient := c.httpClient()
	adminToken := c.tokens[Admin]
	if err := c.waitReady(ctx, apiserver, func(ctx context.Context) error {
		_, err := get(ctx, apiClient, c.host+"/readyz", adminToken)
		return err
	}); err != nil {
		return err
	}
	if err := c.writeKubeconfig(c.Kubeconfig(), Admin); err != nil {
		return err
	}

	kwokConfig := filepath.Join(c.dir, "kwok.kubeconfig")
	if err := c.writeKubeconfig(kwokConfig, "kwok"); err != nil {
		return err
	}
	// KWOK's work directory (default ~/.kwok, whose kwok.yaml it would
	// load) is the cluster's own.
	kwokEnv := []string{"KWOK_WORKDIR=" + filepath.Join(c.dir, "kwok")}
	kwok, err := c.spawnEnv("kwok", kwokEnv, c.bins.KWOK,
		"--kubeconfig", kwokConfig,
		"--config", filepath.Join(c.dir, "kwok-stages.yaml"),
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector", NodeAnnotation+"=fake",
		"--cidr", "10.244.0.0/16",
		"--node-ip", "10.1.0.1",
		"--server-address", kwokAddr,
	)
	if err != nil {
		return err
	}
	if err := c.waitReady(ctx, kwok, func(ctx context.Context) error {
		_, err := get(ctx, http.DefaultClient, "http://"+kwokAddr+"/healthz", "")
		return err
	}); err != nil {
		return err
	}

	if !c.kcm {
		return nil
	}
	kcmConfig := filepath.Join(c.dir, "kube-controller-manager.kubeconfig")
	if err := c.writeKubeconfig(kcmConfig, "kube-controller-manager"); err != nil {
		return err
	}
	kcmArgs := []string{
		"--kubeconfig", kcmConfig,
		"--authentication-kubeconfig", kcmConfig,
		"--authorization-kubeconfig", kcmConfig,
		"--bind-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(kcmPort),
		"--cert-dir", filepath.Join(c.dir, "kube-controller-manager"),
		"--tls-cert-file", c.pki.servingCert,
		"--tls-private-key-file", c.pki.servingKey,
		"--leader-elect=false",
		"--service-account-private-key-file", c.pki.serviceAccountKey,
		"--root-ca-file", c.pki.caFile,
		"--profiling=false",
	}
	if c.realNode {
		// A real node that stops heartbeating goes NotReady within the
		// grace; 30 s keeps the KWOK nodes (a heartbeat every 20-25 s)
		// from flapping.
		kcmArgs = append(kcmArgs, "--node-monitor-grace-period", NodeMonitorGrace.String(), "--node-monitor-period", "1s")
	}
	kcm, err := c.spawn("kube-controller-manager", c.bins.KubeControllerManager, kcmArgs...)
	if err != nil {
		return err
	}
	kcmURL := "https://127.0.0.1:" + strconv.Itoa(kcmPort) + "/healthz"
	return c.waitReady(ctx, kcm, func(ctx context.Context) error {
		_, err := get(ctx, apiClient, kcmURL, "")
		return err
	})
}

// spawn starts one program with its output in logs/NAME.log.
func (c *Cluster) spawn(name, path string, args ...string) (*process, error) {
	return c.spawnEnv(name, nil, path, args...)
}

// spawnEnv is spawn with env added to this process's environment.
func (c *Cluster) spawnEnv(name string, env []string, path string, args ...string) (*process, error) {
	p := &process{name: name, log: filepath.Join(c.dir, "logs", name+".log"), index: len(c.procs) + 1, env: env}
	if err := c.start(p, path, args, os.O_TRUNC); err != nil {
		return nil, err
	}
	c.procs = append(c.procs, p)
	return p, nil
}

// start runs p's program (path with args) with its output appended to, or
// (flag os.O_TRUNC) replacing, its log, and records its pid.
func (c *Cluster) start(p *process, path string, args []string, flag int) error {
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|flag, 0o644)
	if err != nil {
		return fmt.Errorf("kubetest: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(path, args...)
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if c.detached {
		// Its own session: it outlives this process and its terminal.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	} else {
		// It dies with this process even when that is killed outright.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("kubetest: start %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	p.cmd, p.exited = cmd, exited
	go func() { // owned by the Cluster: ends when the program does
		_ = cmd.Wait()
		close(exited)
	}()
	pidFile := filepath.Join(c.dir, "pids", fmt.Sprintf("%d-%s", p.index, p.name))
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		return fmt.Errorf("kubetest: %w", err)
	}
	return nil
}

// waitReady calls check until it succeeds, p exits, or ctx ends.
func (c *Cluster) waitReady(ctx context.Context, p *process, check func(context.Context) error) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := check(cctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("kubetest: %s exited during start (%s):\n%s", p.name, p.cmd.ProcessState, logTail(p.log))
		case <-ctx.Done():
			return fmt.Errorf("kubetest: %s not ready: %w (last: %v):\n%s", p.name, ctx.Err(), err, logTail(p.log))
		case <-tick.C:
		}
	}
}

// Stop stops the cluster (KWOK and the controller manager, then the API
// server, then etcd) and removes its directory. It is safe to call more
// than once.
func (c *Cluster) Stop() error {
	var err error
	c.stop.Do(func() {
		c.stopAll()
		if c.ownsNode {
			releaseNode(c.dir)
		}
		if rmErr := os.RemoveAll(c.dir); rmErr != nil {
			err = fmt.Errorf("kubetest: remove %s: %w", c.dir, rmErr)
		}
	})
	return err
}

// stopAll stops the processes in reverse start order, each with SIGTERM and
// then, if it lingers, SIGKILL.
func (c *Cluster) stopAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		_ = p.cmd.Process.Signal(syscall.SIGCONT) // a paused one takes its SIGTERM
		select {
		case <-p.exited:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
	c.procs = nil
}

// killAll kills what a failed launch attempt started.
func (c *Cluster) killAll() {
	for _, p := range c.procs {
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	c.procs = nil
	pids, _ := filepath.Glob(filepath.Join(c.dir, "pids", "*"))
	for _, f := range pids {
		_ = os.Remove(f)
	}
}

// StopDir stops a detached cluster started in dir and removes dir. Only
// processes whose command line names dir are signalled, so a recycled
// process id is left alone.
func StopDir(dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "pids", "*"))
	if err != nil {
		return fmt.Errorf("kubetest: %w", err)
	}
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("kubetest: no cluster in %s: %w", dir, err)
	}
	// Files are named N-program; the highest N started last.
	sortByStartOrder(files)
	for i := len(files) - 1; i >= 0; i-- {
		b, err := os.ReadFile(files[i])
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || !ownedBy(pid, dir) {
			continue
		}
		if err := terminate(pid, dir); err != nil {
			return err
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "node")); err == nil {
		releaseNode(dir)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("kubetest: remove %s: %w", dir, err)
	}
	return nil
}

func sortByStartOrder(files []string) {
	n := func(f string) int {
		i, _ := strconv.Atoi(strings.SplitN(filepath.Base(f), "-", 2)[0])
		return i
	}
	for i := 1; i < len(files); i++ {
		for j := i; j > 0 && n(files[j]) < n(files[j-1]); j-- {
			files[j], files[j-1] = files[j-1], files[j]
		}
	}
}

// terminate sends SIGTERM to pid and waits for it to go, then SIGKILL.
func terminate(pid int, dir string) error {
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for ownedBy(pid, dir) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			deadline = time.Now().Add(10 * time.Second)
		}
		<-tick.C
	}
	return nil
}

// ownedBy reports whether pid is a live (not zombie) process whose command
// line names dir.
func ownedBy(pid int, dir string) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && len(stat) > i+2 && stat[i+2] == 'Z' {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && bytes.Contains(cmdline, []byte(dir))
}

// Dir is the cluster's directory.
func (c *Cluster) Dir() string { return c.dir }

// Binaries are the executables the cluster runs from, Helm among them (for
// tests of the chart against this cluster).
func (c *Cluster) Binaries() Binaries { return c.bins }

// Host is the API server's URL, https on 127.0.0.1.
func (c *Cluster) Host() string { return c.host }

// HasControllerManager reports whether kube-controller-manager runs.
func (c *Cluster) HasControllerManager() bool { return c.kcm }

// Kubeconfig is the path of a kubeconfig file for Admin.
func (c *Cluster) Kubeconfig() string { return filepath.Join(c.dir, "kubeconfig") }

// AdminConfig returns a new client configuration for Admin (group
// system:masters). Its QPS and burst are high (100, 200) for tests.
func (c *Cluster) AdminConfig() *rest.Config { return c.ConfigFor(Admin) }

// ConfigFor returns a new client configuration for user, one of Admin,
// Alice, Bob and Carol. It panics for any other name.
func (c *Cluster) ConfigFor(user string) *rest.Config {
	token, ok := c.tokens[user]
	if !ok || (user != Admin && user != Alice && user != Bob && user != Carol) {
		panic(fmt.Sprintf("kubetest: no user %q: use kubetest.Admin, Alice, Bob or Carol", user))
	}
	return &rest.Config{
		Host:            c.host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: append([]byte(nil), c.pki.caCert...)},
		QPS:             100,
		Burst:           200,
	}
}

// writeTokens makes the static token file: every identity with a random
// token, the cluster's own components in system:masters.
func (c *Cluster) writeTokens() error {
	c.tokens = map[string]string{}
	var b strings.Builder
	for _, u := range []struct{ name, groups string }{
		{Admin, "system:masters"},
		{"kwok", "system:masters"},
		{"kube-controller-manager", "system:masters"},
		{"kubelet", "system:masters"}, // the real node's; the cluster runs no Node authorizer
		{"kube-scheduler", "system:masters"},
		{"kube-proxy", "system:masters"},
		{"coredns", "system:masters"},
		{"kube-router", "system:masters"},
		{Alice, ""},
		{Bob, ""},
		{Carol, ""},
	} {
		token := randomHex(24)
		c.tokens[u.name] = token
		fmt.Fprintf(&b, "%s,%s,%s,%q\n", token, u.name, u.name, u.groups)
	}
	if err := os.WriteFile(filepath.Join(c.dir, "tokens.csv"), []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("kubetest: write the token file: %w", err)
	}
	return nil
}

// writeKubeconfig writes a self-contained kubeconfig for user at path.
func (c *Cluster) writeKubeconfig(path, user string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: c.host, CertificateAuthorityData: c.pki.caCert}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: c.tokens[user]}
	cfg.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: user, Namespace: "default"}
	cfg.CurrentContext = "kubetest"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("kubetest: write the kubeconfig %s: %w", path, err)
	}
	return nil
}

// httpClient trusts the cluster's CA (the API server's and the controller
// manager's serving certificate).
func (c *Cluster) httpClient() *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.pki.caCert)
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
}

func get(ctx context.Context, client *http.Client, url, token string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s: %s", url, resp.Status, body)
	}
	return body, nil
}

func makeEmptyDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("kubetest: make %s: %w", dir, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("kubetest: read %s: %w", dir, err)
	}
	if len(entries) > 0 {
		return fmt.Errorf("kubetest: %s is not empty (a cluster may be running there: stop it first)", dir)
	}
	return nil
}

// removeStale removes cluster directories left in base by test processes
// that died without cleaning up; their programs died with them. A directory
// whose owner still exists is left alone.
func removeStale(base string) {
	dirs, _ := filepath.Glob(filepath.Join(base, "reaper-kubetest-*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "owner.pid"))
		if err != nil {
			continue // detached, or not ours to judge
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || processExists(pid) {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "node")); err == nil {
			releaseNode(d) // its shims, containers and mounts outlived it
		}
		_ = os.RemoveAll(d)
	}
}

func processExists(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// freePortOn returns a free port on addr.
func freePortOn(addr string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		return 0, fmt.Errorf("kubetest: find a free port on %s: %w", addr, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// freePorts returns n distinct free ports on 127.0.0.1.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("kubetest: find a free port: %w", err)
		}
		defer l.Close() // held until all are chosen, so they differ
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return tail(b, 4000)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

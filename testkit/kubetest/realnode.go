package kubetest

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The real node: a kubelet built from NodeSourceDir and the machine's
// containerd and runc, configured under the cluster's directory. Some of
// what they use is fixed by the machine, not the directory: the kubelet's
// ports, its device plugin socket, /var/log/containers, runc's and the
// shims' state under /run/containerd, the network namespaces in /run/netns,
// the CNI plugins' results in /var/lib/cni, the /kubepods cgroup in every
// hierarchy and the pod network's bridge. So one real node runs per
// machine (NodeLock), and whatever it made is removed when it stops and
// again by the next start after a crash.
const (
	// NodeLock is the lock file that serialises real nodes' starts and
	// stops on the machine, and NodeOwner the file naming the cluster
	// directory of the one that runs.
	NodeLock  = "/run/reaper-kubetest-node.lock"
	NodeOwner = "/run/reaper-kubetest-node.owner"
	// NodeBridge is the pod network's bridge and NodeGateway its address
	// on the host: what a pod reaches the host at (an attempt API the
	// pods report to listens there).
	NodeBridge  = "reaper0"
	NodeGateway = "10.88.0.1"
	// NodeBridgeMAC is the bridge's fixed, locally administered hardware
	// address (see makeBridge).
	NodeBridgeMAC = "02:72:65:61:70:01"
	// NodeSubnet holds the pods' addresses.
	NodeSubnet = "10.88.0.0/16"
	// nodeSocketDir holds containerd's sockets (the shims name it in
	// their -address).
	nodeSocketDir = "/run/reaper-kubetest-node"
	// PauseImage is the sandbox image the real node's containerd uses.
	PauseImage = "reaper.local/pause:v1"
	// RealNodeLabel is set to "real" on the real node (KWOK nodes carry
	// type=kwok).
	RealNodeLabel = "type"
	// EnvRequireRealNode, set to 1, makes a machine that cannot host a
	// real node a failure of the tests that ask for one, not a skip (CI).
	EnvRequireRealNode = "REAPER_REQUIRE_REAL_NODE"
	// NodeWait bounds a start's wait for the machine's real node while
	// another cluster holds it.
	NodeWait = 20 * time.Minute
	// NodeMonitorGrace is the controller manager's
	// --node-monitor-grace-period on a cluster with a real node.
	NodeMonitorGrace = 30 * time.Second
	// NodeLostToleration is, on a cluster with a real node (not one for
	// in-cluster workloads, which keeps the default 5 minutes), how long a pod
	// tolerates its node's not-ready and unreachable taints before the
	// taint manager deletes it (the API server's default tolerations).
	NodeLostToleration = 5 * time.Second
)

// The fixed paths the real node's programs write outside the cluster's
// directory, removed by cleanNode.
var nodeFixedPaths = []string{
	"/var/lib/kubelet/device-plugins",
	"/var/lib/kubelet/plugins_registry",
	"/var/lib/kubelet/plugins",
	"/var/lib/kubelet/pod-resources",
	"/var/log/containers",
	"/run/containerd",
	"/var/lib/cni/results",
	"/var/lib/cni/networks",
	nodeSocketDir,
}

// RealNode is a running real node.
type RealNode struct {
	// Name is the node's name (the machine's host name, which resolves to
	// loopback, so the API server reaches the kubelet for logs).
	Name string
	// Containerd is containerd's socket.
	Containerd string
	// APICert, APIKey and CA are a serving certificate for NodeGateway
	// (and loopback) signed by the cluster's CA, its key and the CA: an
	// operator's certificate for a server the pods reach.
	APICert, APIKey, CA string
	bins                NodeBinaries
	dir                 string
	// Ready is how long the node took from its first program's start
	// to its Ready condition.
	Ready time.Duration
}

// RealNode returns the cluster's real node, or nil with the reason it has
// none (not asked for, or the machine cannot host one).
func (c *Cluster) RealNode() (*RealNode, string) {
	if c.node == nil {
		return nil, c.nodeWhy
	}
	return c.node, ""
}

// NeedRealNode returns the cluster's real node, or skips t with the
// reason the machine cannot host one; with EnvRequireRealNode=1 it fails
// t instead.
func (c *Cluster) NeedRealNode(t interface {
	Helper()
	Skipf(string, ...any)
	Fatalf(string, ...any)
}) *RealNode {
	t.Helper()
	n, why := c.RealNode()
	if n != nil {
		return n
	}
	if os.Getenv(EnvRequireRealNode) == "1" {
		t.Fatalf("kubetest: the real node is required (%s=1) but there is none: %s", EnvRequireRealNode, why)
	}
	t.Skipf("kubetest: no real node: %s", why)
	return nil
}

// hostCheck says why this machine cannot host a real node, "" when it
// can. unavailable, when set, is taken as the reason (a test of the skip).
func hostCheck(unavailable string) string {
	if unavailable != "" {
		return unavailable
	}
	if os.Geteuid() != 0 {
		return "not root (the kubelet and containerd need root)"
	}
	for _, prog := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "ip"} {
		if _, err := exec.LookPath(prog); err != nil {
			return "no " + prog + " on PATH (apt-get install containerd runc)"
		}
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		return "no iptables on PATH for the node's pod network faults (apt-get install iptables)"
	}
	for _, f := range []string{"/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback"} {
		if _, err := os.Stat(f); err != nil {
			return "no CNI plugin " + f + " (apt-get install containernetworking-plugins)"
		}
	}
	if _, err := os.Stat(busybox); err != nil {
		return "no static busybox at " + busybox + " for the task image's shell (apt-get install busybox-static)"
	}
	probe := filepath.Join("/sys/fs/cgroup/memory", fmt.Sprintf("reaper-kubetest-probe-%d", os.Getpid()))
	if err := os.Mkdir(probe, 0o755); err != nil {
		probe = filepath.Join("/sys/fs/cgroup", fmt.Sprintf("reaper-kubetest-probe-%d", os.Getpid()))
		if err2 := os.Mkdir(probe, 0o755); err2 != nil {
			return "cgroups not writable: " + err.Error()
		}
	}
	_ = os.Remove(probe)
	return ""
}

// busybox is the static shell the task image carries.
const busybox = "/bin/busybox"

// nodePrep is what a real node's start does before its programs run: the
// machine's node taken for this cluster, its binaries built and the pod
// network's bridge made.
type nodePrep struct{ bins NodeBinaries }

// prepareNode builds the node's binaries, takes the machine's node (waiting
// while another cluster holds it) and makes the bridge.
func (c *Cluster) prepareNode(ctx context.Context, opts Options) (*nodePrep, error) {
	bins, err := BuildNode(ctx, opts.Build)
	if err != nil {
		return nil, err
	}
	wait, cancelWait := context.WithTimeout(ctx, NodeWait)
	err = takeNode(wait, c.dir)
	cancelWait()
	if err != nil {
		return nil, err
	}
	c.ownsNode = true
	if err := makeBridge(ctx); err != nil {
		return nil, err
	}
	return &nodePrep{bins: bins}, nil
}

// startRealNode starts containerd and the kubelet and waits for the node
// to be Ready (and, in-cluster, the scheduler, kube-proxy and the cluster
// DNS). It returns (nil, reason, nil) when the machine cannot host one,
// and an error when it can and the node fails to start.
func (c *Cluster) startRealNode(ctx context.Context, opts Options) (*RealNode, string, error) {
	prep := c.prep
	if prep == nil {
		if why := hostCheck(opts.RealNodeUnavailable); why != "" {
			return nil, why, nil
		}
		var err error
		if prep, err = c.prepareNode(ctx, opts); err != nil {
			return nil, "", err
		}
	}
	bins := prep.bins
	var err error
	timeout := opts.StartTimeout
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	begin := time.Now()
	host, _ := os.Hostname()
	if host == "" {
		host = "localhost"
	}
	n := &RealNode{Name: strings.ToLower(host), bins: bins, dir: filepath.Join(c.dir, "node")}
	// A unix socket's path is short (at most 104 bytes for containerd);
	// the cluster's directory may be long: the sockets get a fixed one.
	if err := os.MkdirAll(nodeSocketDir, 0o700); err != nil {
		return nil, "", fmt.Errorf("kubetest: real node: %w", err)
	}
	n.Containerd = filepath.Join(nodeSocketDir, "containerd.sock")
	for _, d := range []string{"containerd/root", "containerd/state", "containerd/opt", "cni/net.d", "cni/ipam",
		"kubelet/pki", "pod-logs", "images"} {
		if err := os.MkdirAll(filepath.Join(n.dir, d), 0o755); err != nil {
			return nil, "", fmt.Errorf("kubetest: real node: %w", err)
		}
	}
	if err := n.writeConfigs(c); err != nil {
		return nil, "", err
	}
	if n.APICert, n.APIKey, err = c.pki.issueServing(n.dir, "node-api", NodeGateway); err != nil {
		return nil, "", err
	}
	n.CA = c.pki.caFile

	ctrd, err := c.spawn("containerd", "containerd", "--config", filepath.Join(n.dir, "containerd.toml"))
	if err != nil {
		return nil, "", err
	}
	if err := c.waitReady(ctx, ctrd, func(ctx context.Context) error {
		return exec.CommandContext(ctx, "ctr", "--address", n.Containerd, "version").Run()
	}); err != nil {
		return nil, "", err
	}
	if err := n.ImportImage(ctx, PauseImage, []string{"-file", bins.Pause + "=/pause", "-entrypoint", "/pause"}); err != nil {
		return nil, "", err
	}

	// The node's address: loopback, which the kubelet does not publish,
	// unless the cluster hosts in-cluster workloads; there kube-proxy
	// waits for the node to have one, and the gateway is where the pods
	// reach the machine. The API server reaches the kubelet by its host
	// name, which resolves to loopback, either way.
	nodeIP := "127.0.0.1"
	if c.inCluster {
		nodeIP = NodeGateway
	}
	kubeletConfig := filepath.Join(n.dir, "kubelet.kubeconfig")
	if err := c.writeKubeconfig(kubeletConfig, "kubelet"); err != nil {
		return nil, "", err
	}
	kubelet, err := c.spawn("kubelet", bins.Kubelet,
		"--config", filepath.Join(n.dir, "kubelet.yaml"),
		"--kubeconfig", kubeletConfig,
		// Its root holds unix sockets too: under the short fixed path.
		"--root-dir", filepath.Join(nodeSocketDir, "kubelet"),
		"--cert-dir", filepath.Join(nodeSocketDir, "kubelet", "pki"),
		"--hostname-override", n.Name,
		"--node-ip", nodeIP,
		"--node-labels", RealNodeLabel+"=real",
		"--v", "1",
	)
	if err != nil {
		return nil, "", err
	}
	cs, err := kubernetes.NewForConfig(c.AdminConfig())
	if err != nil {
		return nil, "", fmt.Errorf("kubetest: clientset: %w", err)
	}
	if err := c.waitReady(ctx, kubelet, func(ctx context.Context) error {
		node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !NodeReady(node) {
			return errors.New("node not Ready")
		}
		return nil
	}); err != nil {
		return nil, "", err
	}
	if c.inCluster {
		if err := c.startInCluster(ctx, n); err != nil {
			return nil, "", err
		}
	}
	n.Ready = time.Since(begin)
	return n, "", nil
}

// Kubelet returns the kubelet's process id (for a test that stops or
// kills it).
func (c *Cluster) processPID(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.procs {
		if p.name == name {
			return p.cmd.Process.Pid
		}
	}
	return 0
}

// KubeletPID is the real node's kubelet's process id (0 when none runs).
func (c *Cluster) KubeletPID() int { return c.processPID("kubelet") }

// ImportImage writes an image of local files with nodeimage (args are its
// -file, -link, -entrypoint and -env flags) and imports it into the node's
// containerd under ref; pods use it with imagePullPolicy Never.
func (n *RealNode) ImportImage(ctx context.Context, ref string, args []string) error {
	tar := filepath.Join(n.dir, "images", strings.NewReplacer("/", "_", ":", "_").Replace(ref)+".tar")
	out, err := exec.CommandContext(ctx, n.bins.NodeImage, append([]string{"-o", tar, "-tag", ref}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubetest: write the image %s: %w: %s", ref, err, out)
	}
	out, err = exec.CommandContext(ctx, "ctr", "--address", n.Containerd, "-n", "k8s.io", "images", "import", tar).CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubetest: import the image %s: %w: %s", ref, err, out)
	}
	return nil
}

// ImportArchive imports an image archive (a docker archive or OCI
// tarball, tagged inside, as make image writes it) into the node's
// containerd, as a registry pull would have put it there.
func (n *RealNode) ImportArchive(ctx context.Context, tar string) error {
	out, err := exec.CommandContext(ctx, "ctr", "--address", n.Containerd, "-n", "k8s.io", "images", "import", tar).CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubetest: import the image archive %s: %w: %s", tar, err, out)
	}
	return nil
}

// taskApplets are the busybox commands the task image links.
var taskApplets = []string{"sh", "sleep", "echo", "cat", "touch", "flock", "wget", "true", "false", "test", "[",
	"mkdir", "rm", "ls", "env", "kill", "dd", "head", "seq", "printf", "date", "grep", "tail", "nc",
	"httpd", "nslookup", "timeout"}

// TaskAgent is where the task image holds reaper-agent: the kube runner's
// agent on the real node. The runner's pods share their process namespace,
// so the sandbox is PID 1 and the agent runs as the container's command.
const TaskAgent = "/usr/local/bin/reaper-agent"

// TaskInit is an init in the task image that runs the agent (its arguments
// passed on) as its child, forwards SIGTERM and SIGINT to it and exits with
// its status: for pods that do not share their process namespace, where the
// agent would otherwise be PID 1 (its task group record never names
// process 1).
const TaskInit = "/usr/local/bin/agent-init"

const taskInitScript = `#!/bin/sh
/usr/local/bin/reaper-agent "$@" &
child=$!
trap 'kill -TERM $child' TERM
trap 'kill -INT $child' INT
wait $child
rc=$?
while kill -0 $child 2>/dev/null; do
  wait $child
  rc=$?
done
exit $rc
`

// Script is a shell script a task image carries: its path in the image
// and its text.
type Script struct{ Path, Text string }

// ImportTaskImage imports a task image under ref: the agent binary at
// /usr/local/bin/reaper-agent, its init at TaskInit, a static busybox as
// /bin/sh and the usual commands, PATH set, and the scripts given
// (executable).
func (n *RealNode) ImportTaskImage(ctx context.Context, ref, agent string, scripts ...Script) error {
	if err := staticBinary(agent); err != nil {
		return err
	}
	scripts = append([]Script{{Path: TaskInit, Text: taskInitScript}}, scripts...)
	args := []string{"-file", agent + "=/usr/local/bin/reaper-agent", "-file", busybox + "=/bin/busybox",
		"-env", "PATH=/usr/local/bin:/bin", "-env", "TMPDIR=/tmp"}
	for i, sc := range scripts {
		file := filepath.Join(n.dir, "images", fmt.Sprintf("%s-script-%d", strings.NewReplacer("/", "_", ":", "_").Replace(ref), i))
		if err := os.WriteFile(file, []byte(sc.Text), 0o755); err != nil {
			return fmt.Errorf("kubetest: write the task image's %s: %w", sc.Path, err)
		}
		args = append(args, "-file", file+"="+sc.Path)
	}
	for _, a := range taskApplets {
		args = append(args, "-link", "/bin/"+a+"=busybox")
	}
	return n.ImportImage(ctx, ref, args)
}

// staticBinary fails for an executable that needs a dynamic loader (the
// task image has no libc): build it with CGO_ENABLED=0.
func staticBinary(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("kubetest: read the agent binary %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("kubetest: %s is dynamically linked; the task image has no libc: build it with CGO_ENABLED=0", path)
		}
	}
	return nil
}

// writeConfigs writes containerd's, the CNI's and the kubelet's
// configuration under the node's directory.
func (n *RealNode) writeConfigs(c *Cluster) error {
	d := n.dir
	containerd := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %q

[ttrpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = %q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
`, filepath.Join(d, "containerd/root"), filepath.Join(d, "containerd/state"), n.Containerd, n.Containerd+".ttrpc",
		filepath.Join(d, "containerd/opt"), PauseImage, filepath.Join(d, "cni/net.d"))
	routes := ""
	if c.inCluster {
		// A default route through the gateway: the Services' ClusterIPs
		// lie outside the pod network, and the machine's kube-proxy
		// rules take them there.
		routes = `, "routes": [{"dst": "0.0.0.0/0"}]`
	}
	cni := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "reaper-kubetest",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": %q, "gateway": %q}]]%s}},
    {"type": "loopback"}
  ]
}
`, NodeBridge, filepath.Join(d, "cni/ipam"), NodeSubnet, NodeGateway, routes)
	kubelet := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://%s
imageServiceEndpoint: unix://%s
address: 127.0.0.1
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
failSwapOn: false
shutdownGracePeriod: 0s
shutdownGracePeriodCriticalPods: 0s
podLogsDir: %q
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "50Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
maxPods: 110
`, n.Containerd, n.Containerd, filepath.Join(d, "pod-logs"))
	if c.inCluster {
		// The cluster DNS the pods are handed (CoreDNS on the gateway).
		kubelet += fmt.Sprintf("clusterDomain: %s\nclusterDNS:\n- %s\n", ClusterDomain, NodeGateway)
	}
	for _, f := range []struct{ path, text string }{
		{filepath.Join(d, "containerd.toml"), containerd},
		{filepath.Join(d, "cni/net.d/10-reaper.conflist"), cni},
		{filepath.Join(d, "kubelet.yaml"), kubelet},
	} {
		if err := os.WriteFile(f.path, []byte(f.text), 0o644); err != nil {
			return fmt.Errorf("kubetest: real node: write %s: %w", f.path, err)
		}
	}
	return nil
}

// makeBridge makes the pod network's bridge with the gateway's address
// before any pod exists, so that a server the pods reach can listen on
// NodeGateway from the start (the CNI bridge plugin takes it as it is).
//
// The bridge gets a fixed hardware address. A Linux bridge without one
// takes the lowest of its ports' addresses and changes it whenever a pod's
// veth with a lower one joins or the lowest one leaves; the pods already
// running keep the gateway's old address in their neighbour cache, and
// their packets to the gateway go nowhere until the entry turns stale and
// is probed again (about five seconds and more). That is how a pod
// stopped or started beside a running one silenced the running one's
// heartbeats. An address set by hand is never recalculated.
func makeBridge(ctx context.Context) error {
	_ = exec.CommandContext(ctx, "ip", "link", "delete", NodeBridge).Run()
	for _, args := range [][]string{
		{"link", "add", NodeBridge, "address", NodeBridgeMAC, "type", "bridge"},
		{"addr", "add", NodeGateway + "/16", "dev", NodeBridge},
		{"link", "set", NodeBridge, "up"},
	} {
		if out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("kubetest: real node: ip %s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// takeNode takes the machine's real node for the cluster in dir: under
// NodeLock it waits (bounded by ctx) while another live cluster's node
// runs, removes what a dead one left, and records dir as the owner.
func takeNode(ctx context.Context, dir string) error {
	said := false
	for {
		unlock, err := lockFile(ctx, NodeLock, os.Stderr)
		if err != nil {
			return err
		}
		owner := readOwner()
		if owner == "" || owner == dir || !nodeAlive(owner) {
			if owner != "" && owner != dir {
				cleanNode(owner)
			}
			cleanNode(dir) // what a crash of this very directory left, if any
			// The owner's directory, and the process that took the node:
			// until the node's own programs run (an in-cluster start takes
			// it before its control plane), that process is what says
			// the node is in use.
			err := os.WriteFile(NodeOwner, []byte(fmt.Sprintf("%s\n%d\n", dir, os.Getpid())), 0o644)
			unlock()
			if err != nil {
				return fmt.Errorf("kubetest: record the real node's owner: %w", err)
			}
			return nil
		}
		unlock()
		if !said {
			fmt.Fprintf(os.Stderr, "kubetest: the real node of the cluster in %s runs; waiting for it to stop (one per machine)\n", owner)
			said = true
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubetest: wait for the machine's real node (held by the cluster in %s): %w", owner, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// releaseNode removes what the node of the cluster in dir made and its
// owner record, under NodeLock; nothing when the machine's node is another
// live cluster's (the fixed paths, shims and cgroups are then its).
func releaseNode(dir string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	unlock, err := lockFile(ctx, NodeLock, os.Stderr)
	if err == nil {
		defer unlock()
	}
	if owner := readOwner(); owner != "" && owner != dir && nodeAlive(owner) {
		return // the machine's node is another live cluster's: leave it be
	}
	cleanNode(dir)
	if readOwner() == dir {
		_ = os.Remove(NodeOwner)
	}
}

func readOwner() string {
	dir, _ := readOwnerRecord()
	return dir
}

// readOwnerRecord reads NodeOwner: the owner's directory and the process
// that took the node (0 when the record names none).
func readOwnerRecord() (string, int) {
	b, err := os.ReadFile(NodeOwner)
	if err != nil {
		return "", 0
	}
	lines := strings.SplitN(strings.TrimSpace(string(b)), "\n", 2)
	pid := 0
	if len(lines) == 2 {
		pid, _ = strconv.Atoi(strings.TrimSpace(lines[1]))
	}
	return strings.TrimSpace(lines[0]), pid
}

// nodeAlive reports whether the real node of the cluster in dir is in
// use: a program of it still runs, or the process that took it for that
// cluster (which starts its programs) is alive.
func nodeAlive(dir string) bool {
	if owner, pid := readOwnerRecord(); owner == dir && pid > 0 && processExists(pid) {
		return true
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil && ownedBy(pid, filepath.Join(dir, "node")+"/") {
			return true
		}
	}
	return false
}

// processesNaming lists the live processes whose command line names the
// real node's directory under dir (the kubelet, containerd) or its socket
// directory (the shims' -address): one node per machine, so every shim
// there is the node's.
func processesNaming(dir string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if ownedBy(pid, filepath.Join(dir, "node")+"/") || ownedBy(pid, nodeSocketDir+"/") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// cleanNode removes everything the real node of the cluster in dir made:
// its programs and shims, every process in the /kubepods cgroups and the
// cgroups themselves, the mounts under dir and the fixed paths, the
// network namespaces, the CNI state and the bridge. It is safe to call
// when nothing is left.
func cleanNode(dir string) {
	for _, pid := range processesNaming(dir) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for range 3 {
		for _, cg := range KubepodsCgroups() {
			killCgroup(cg)
		}
		time.Sleep(100 * time.Millisecond)
		for _, cg := range KubepodsCgroups() {
			removeCgroup(cg)
		}
		if len(KubepodsCgroups()) == 0 {
			break
		}
	}
	for _, m := range NodeMounts(dir) {
		_ = syscall.Unmount(m, syscall.MNT_DETACH)
	}
	netns, _ := filepath.Glob("/run/netns/cni-*")
	for _, ns := range netns {
		_ = syscall.Unmount(ns, syscall.MNT_DETACH)
		_ = os.Remove(ns)
	}
	for _, p := range nodeFixedPaths {
		_ = os.RemoveAll(p)
	}
	for _, d := range []string{"/run/netns", "/var/lib/cni", "/var/lib/kubelet"} {
		_ = syscall.Rmdir(d) // only when empty: another program may use it
	}
	_ = exec.Command("ip", "link", "delete", NodeBridge).Run()
	removeTaggedRules()
	removeKubeChainRules()
	removeKubeRouterSets()
}

// KubepodsCgroups lists the /kubepods cgroup of every mounted hierarchy
// that has one.
func KubepodsCgroups() []string {
	var out []string
	for _, root := range cgroupRoots() {
		cg := filepath.Join(root, "kubepods")
		if st, err := os.Stat(cg); err == nil && st.IsDir() {
			out = append(out, cg)
		}
	}
	return out
}

// cgroupRoots are the mount points of the cgroup hierarchies.
func cgroupRoots() []string {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return nil
	}
	defer f.Close()
	var roots []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 3 && (fields[2] == "cgroup" || fields[2] == "cgroup2") {
			roots = append(roots, fields[1])
		}
	}
	return roots
}

// killCgroup sends SIGKILL to every process in cg and its descendants
// (thawing a frozen one first).
func killCgroup(cg string) {
	_ = filepath.WalkDir(cg, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if b, err := os.ReadFile(filepath.Join(path, "freezer.state")); err == nil && !bytes.HasPrefix(b, []byte("THAWED")) {
			_ = os.WriteFile(filepath.Join(path, "freezer.state"), []byte("THAWED"), 0o644)
		}
		b, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		return nil
	})
}

// removeCgroup removes cg and its descendants, deepest first.
func removeCgroup(cg string) {
	var dirs []string
	_ = filepath.WalkDir(cg, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	for _, d := range dirs {
		_ = syscall.Rmdir(d)
	}
}

// NodeMounts lists the mount points the real node of the cluster in dir
// made: under dir, its socket directory, /run/containerd, /run/netns and /var/lib/kubelet,
// deepest first.
func NodeMounts(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		m := unescapeMount(fields[4])
		for _, under := range []string{dir + "/", nodeSocketDir + "/", "/run/containerd/", "/run/netns/", "/var/lib/kubelet/"} {
			if strings.HasPrefix(m, under) {
				out = append(out, m)
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// NodeLeftovers lists what the real node of the cluster in dir left
// behind: processes naming dir, processes of the kubelet or containerd
// binaries, shims, mounts, /kubepods cgroups, network namespaces, the
// bridge and the firewall rules a test added. Empty after a clean stop.
func NodeLeftovers(dir string) []string {
	var left []string
	for _, pid := range processesNaming(dir) {
		left = append(left, fmt.Sprintf("process %d naming the cluster's directory", pid))
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		switch filepath.Base(strings.TrimSuffix(exe, " (deleted)")) {
		case "kubelet", "containerd", "containerd-shim-runc-v2", "containerd-shim", "kube-proxy", "kube-scheduler", "coredns", "kube-router":
			left = append(left, fmt.Sprintf("process %d (%s)", pid, exe))
		}
	}
	for _, m := range NodeMounts(dir) {
		left = append(left, "mount "+m)
	}
	for _, cg := range KubepodsCgroups() {
		left = append(left, "cgroup "+cg)
	}
	netns, _ := filepath.Glob("/run/netns/cni-*")
	for _, ns := range netns {
		left = append(left, "netns "+ns)
	}
	for _, r := range taggedRules() {
		left = append(left, "firewall rule "+r)
	}
	for _, r := range kubeChainRules() {
		left = append(left, "kube-proxy or kube-router rule "+r)
	}
	for _, set := range kubeRouterSets() {
		left = append(left, "kube-router ipset "+set)
	}
	if _, err := os.Stat("/sys/class/net/" + NodeBridge); err == nil {
		left = append(left, "bridge "+NodeBridge)
	}
	return left
}

// ContainerLogs returns the tail of the logs the kubelet wrote for the
// containers of pod ns/name (for a failed test's dump).
func (n *RealNode) ContainerLogs(ns, name string) string {
	files, _ := filepath.Glob(filepath.Join(n.dir, "pod-logs", ns+"_"+name+"_*", "*", "*.log"))
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		fmt.Fprintf(&b, "%s:\n%s\n", filepath.Base(filepath.Dir(f)), tail(data, 3000))
	}
	return b.String()
}

// HostCheck says why this machine cannot host a real node, "" when it can.
func HostCheck() string { return hostCheck("") }

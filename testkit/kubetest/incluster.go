package kubetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// A cluster started with Options.InCluster hosts workloads the way a real
// one does: what a Deployment, a Service and a pod's in-cluster client
// need beyond the real node.
//
//   - kube-scheduler places pods (no test binds them);
//   - kube-proxy, in iptables mode, programs the Services' ClusterIPs,
//     among them the kubernetes Service, whose endpoint is the API server
//     on the pod network's gateway (client-go's in-cluster configuration
//     reaches it at KubernetesServiceIP);
//   - CoreDNS, on the gateway's port 53, answers for Services and pods in
//     ClusterDomain; the kubelet hands it to every pod as its name server;
//   - kube-router's NetworkPolicy controller enforces NetworkPolicies with
//     iptables and ipsets, where the machine has ipset (NetworkPolicies
//     says whether it runs). It is kube-router v2.1.0, which has reported
//     security flaws and no later release served: only its policy
//     controller runs, listening on nothing, in a test cluster only
//     (tools/kubenode/netpol/README.md says why not another).
//
// Bridged traffic between two pods of the bridge passes the machine's
// iptables (net.bridge.bridge-nf-call-iptables, which Start turns on when
// it is off), so that a pod reaching a Service whose backend is a pod on
// the same bridge gets its answer from the ClusterIP it asked.
const (
	// KubernetesServiceIP is the kubernetes Service's ClusterIP: the first
	// address of the service range.
	KubernetesServiceIP = "10.96.0.1"
	// ServiceRange is the ClusterIPs' range.
	ServiceRange = "10.96.0.0/16"
	// ClusterDomain is the cluster's DNS domain.
	ClusterDomain = "cluster.local"
)

// InCluster reports whether the cluster hosts in-cluster workloads.
func (c *Cluster) InCluster() bool { return c.inCluster }

// startInCluster starts kube-scheduler, kube-proxy and CoreDNS beside the
// node n and waits for each to be ready.
func (c *Cluster) startInCluster(ctx context.Context, n *RealNode) error {
	if err := bridgeNetfilter(); err != nil {
		return err
	}
	ports, err := freePorts(5)
	if err != nil {
		return err
	}
	apiClient := c.httpClient()

	schedConfig := filepath.Join(c.dir, "kube-scheduler.kubeconfig")
	if err := c.writeKubeconfig(schedConfig, "kube-scheduler"); err != nil {
		return err
	}
	sched, err := c.spawn("kube-scheduler", n.bins.KubeScheduler,
		"--kubeconfig", schedConfig,
		"--authentication-kubeconfig", schedConfig,
		"--authorization-kubeconfig", schedConfig,
		"--bind-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(ports[0]),
		"--cert-dir", filepath.Join(c.dir, "kube-scheduler"),
		"--tls-cert-file", c.pki.servingCert,
		"--tls-private-key-file", c.pki.servingKey,
		"--leader-elect=false",
		"--profiling=false",
	)
	if err != nil {
		return err
	}
	if err := c.waitReady(ctx, sched, func(ctx context.Context) error {
		_, err := get(ctx, apiClient, "https://127.0.0.1:"+strconv.Itoa(ports[0])+"/healthz", "")
		return err
	}); err != nil {
		return err
	}

	proxyConfig := filepath.Join(c.dir, "kube-proxy.kubeconfig")
	if err := c.writeKubeconfig(proxyConfig, "kube-proxy"); err != nil {
		return err
	}
	proxyYAML := filepath.Join(n.dir, "kube-proxy.yaml")
	if err := os.WriteFile(proxyYAML, []byte(kubeProxyConfig(proxyConfig, n.Name, ports[1], ports[2])), 0o644); err != nil {
		return fmt.Errorf("kubetest: write kube-proxy's configuration: %w", err)
	}
	proxy, err := c.spawn("kube-proxy", n.bins.KubeProxy, "--config", proxyYAML, "--v", "1")
	if err != nil {
		return err
	}
	if err := c.waitReady(ctx, proxy, func(ctx context.Context) error {
		if _, err := get(ctx, http.DefaultClient, "http://127.0.0.1:"+strconv.Itoa(ports[1])+"/healthz", ""); err != nil {
			return err
		}
		// Synced once the kubernetes Service is programmed.
		out, err := exec.CommandContext(ctx, "iptables", "-t", "nat", "-S", "KUBE-SERVICES").Output()
		if err != nil {
			return fmt.Errorf("iptables -t nat -S KUBE-SERVICES: %w", err)
		}
		if !strings.Contains(string(out), KubernetesServiceIP+"/32") {
			return errors.New("the kubernetes Service is not programmed yet")
		}
		return nil
	}); err != nil {
		return err
	}

	// CoreDNS, with the Corefile its module keeps (copied into the
	// cluster's directory: its command line names the directory, so that
	// StopDir knows the process for the cluster's), on the gateway's port 53.
	src, err := findSource(NodeSourceDir)
	if err != nil {
		return err
	}
	corefile, err := os.ReadFile(filepath.Join(src, "coredns", "Corefile"))
	if err != nil {
		return fmt.Errorf("kubetest: read CoreDNS's Corefile: %w", err)
	}
	conf := filepath.Join(n.dir, "Corefile")
	if err := os.WriteFile(conf, corefile, 0o644); err != nil {
		return fmt.Errorf("kubetest: write CoreDNS's Corefile: %w", err)
	}
	dnsConfig := filepath.Join(c.dir, "coredns.kubeconfig")
	if err := c.writeKubeconfig(dnsConfig, "coredns"); err != nil {
		return err
	}
	readyAddr := "127.0.0.1:" + strconv.Itoa(ports[3])
	dns, err := c.spawnEnv("coredns", []string{
		"COREDNS_LISTEN=" + NodeGateway, "COREDNS_PORT=53",
		"COREDNS_KUBECONFIG=" + dnsConfig, "COREDNS_CONTEXT=kubetest",
		"COREDNS_HEALTH=127.0.0.1:" + strconv.Itoa(ports[4]), "COREDNS_READY=" + readyAddr,
	}, n.bins.CoreDNS, "-conf", conf)
	if err != nil {
		return err
	}
	// Ready once it answers for the kubernetes Service (its /ready comes
	// a little before its port does).
	resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, net.JoinHostPort(NodeGateway, "53"))
	}}
	if err := c.waitReady(ctx, dns, func(ctx context.Context) error {
		if _, err := get(ctx, http.DefaultClient, "http://"+readyAddr+"/ready", ""); err != nil {
			return err
		}
		addrs, err := resolver.LookupHost(ctx, "kubernetes.default.svc."+ClusterDomain+".")
		if err != nil {
			return err
		}
		if len(addrs) != 1 || addrs[0] != KubernetesServiceIP {
			return fmt.Errorf("the kubernetes Service resolves to %v, want %s", addrs, KubernetesServiceIP)
		}
		return nil
	}); err != nil {
		return err
	}
	return c.startEnforcer(ctx, n)
}

// startEnforcer starts kube-router's NetworkPolicy controller (and nothing
// else of kube-router: no routing, no proxy, no port) where the machine has
// what it needs, and records why not where it has not.
func (c *Cluster) startEnforcer(ctx context.Context, n *RealNode) error {
	if _, err := exec.LookPath("ipset"); err != nil {
		c.netpolWhy = "no ipset on PATH for the NetworkPolicy enforcer (apt-get install ipset)"
		return nil
	}
	config := filepath.Join(n.dir, "kube-router.kubeconfig")
	if err := c.writeKubeconfig(config, "kube-router"); err != nil {
		return err
	}
	router, err := c.spawn("kube-router", n.bins.KubeRouter,
		"--kubeconfig="+config,
		"--hostname-override="+n.Name,
		"--run-firewall=true", "--run-router=false", "--run-service-proxy=false", "--run-loadbalancer=false",
		"--service-cluster-ip-range="+ServiceRange,
		"--health-port=0", "--metrics-port=0",
	)
	if err != nil {
		return err
	}
	if err := c.waitReady(ctx, router, func(ctx context.Context) error {
		return exec.CommandContext(ctx, "iptables", "-t", "filter", "-S", "KUBE-ROUTER-FORWARD").Run()
	}); err != nil {
		return err
	}
	c.netpol = true
	return nil
}

// NetworkPolicies reports whether the cluster enforces NetworkPolicies,
// and why not when it does not.
func (c *Cluster) NetworkPolicies() (bool, string) {
	if c.netpol {
		return true, ""
	}
	if c.netpolWhy == "" {
		return false, "the cluster hosts no in-cluster workloads (kubetest.Options.InCluster)"
	}
	return false, c.netpolWhy
}

// kubeRouterSets lists the ipsets kube-router made.
func kubeRouterSets() []string {
	out, err := exec.Command("ipset", "list", "-n").Output()
	if err != nil {
		return nil
	}
	var sets []string
	for _, name := range strings.Fields(string(out)) {
		if strings.HasPrefix(name, "KUBE-SRC-") || strings.HasPrefix(name, "KUBE-DST-") {
			sets = append(sets, name)
		}
	}
	return sets
}

// removeKubeRouterSets destroys them (after the rules that name them).
func removeKubeRouterSets() {
	for _, name := range kubeRouterSets() {
		_ = exec.Command("ipset", "destroy", name).Run()
	}
}

// kubeProxyConfig is kube-proxy's configuration: iptables mode, the pod
// network as the cluster's CIDR, the gateway as the node's address (the
// node's own, loopback, would have it wait for another), its servers on
// loopback, NodePorts on the
// gateway only (none on the machine's other addresses), and the machine's
// conntrack and localnet settings left as they are.
func kubeProxyConfig(kubeconfig, node string, healthPort, metricsPort int) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %q
hostnameOverride: %q
mode: iptables
clusterCIDR: %q
bindAddress: %q
healthzBindAddress: 127.0.0.1:%d
metricsBindAddress: 127.0.0.1:%d
nodePortAddresses: [%q]
iptables:
  localhostNodePorts: false
  masqueradeAll: false
  syncPeriod: 10s
  minSyncPeriod: 0s
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, kubeconfig, node, NodeSubnet, NodeGateway, healthPort, metricsPort, NodeGateway+"/32")
}

// bridgeNetfilter turns on net.bridge.bridge-nf-call-iptables when it is
// off (kube-proxy's rules must see bridged traffic between pods).
func bridgeNetfilter() error {
	const path = "/proc/sys/net/bridge/bridge-nf-call-iptables"
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("kubetest: in-cluster networking needs the kernel's bridge netfilter (%s): %w", path, err)
	}
	if strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	if err := os.WriteFile(path, []byte("1"), 0o644); err != nil {
		return fmt.Errorf("kubetest: turn on %s: %w", path, err)
	}
	return nil
}

// kubeProxyTables are the iptables tables kube-proxy and kube-router write
// chains into, and kubeProxyCommands the commands they write them with.
var (
	kubeProxyTables   = []string{"nat", "filter", "mangle"}
	kubeProxyCommands = []string{"iptables", "ip6tables"}
)

// kubeChainRules lists the KUBE- chains kube-proxy and kube-router left
// in iptables and the rules of the built-in chains that jump to them.
func kubeChainRules() []string {
	var left []string
	for _, cmd := range kubeProxyCommands {
		for _, table := range kubeProxyTables {
			out, err := exec.Command(cmd, "-t", table, "-S").Output()
			if err != nil {
				continue
			}
			for _, l := range strings.Split(string(out), "\n") {
				if strings.Contains(l, "KUBE-") {
					left = append(left, cmd+" "+table+": "+l)
				}
			}
		}
	}
	return left
}

// removeKubeChainRules deletes what kubeChainRules lists: the jumps from
// the built-in chains first, then the KUBE- chains, flushed and deleted.
func removeKubeChainRules() {
	for _, cmd := range kubeProxyCommands {
		for _, table := range kubeProxyTables {
			removeKubeChains(cmd, table)
		}
	}
}

// removeKubeChains removes kube-proxy's chains from one table.
func removeKubeChains(cmd, table string) {
	out, err := exec.Command(cmd, "-t", table, "-S").Output()
	if err != nil {
		return
	}
	var chains []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 2 && f[0] == "-N" && strings.HasPrefix(f[1], "KUBE-"):
			chains = append(chains, f[1])
		case len(f) >= 2 && f[0] == "-A" && !strings.HasPrefix(f[1], "KUBE-") && strings.Contains(l, "KUBE-"):
			_ = exec.Command(cmd, append([]string{"-t", table, "-D"}, unquoteRule(f[1:])...)...).Run()
		}
	}
	for _, ch := range chains {
		_ = exec.Command(cmd, "-t", table, "-F", ch).Run()
	}
	for _, ch := range chains {
		_ = exec.Command(cmd, "-t", table, "-X", ch).Run()
	}
}

// unquoteRule splits an iptables -S rule's words, joining the quoted ones
// (kube-proxy's comments hold spaces).
func unquoteRule(fields []string) []string {
	var out []string
	for i := 0; i < len(fields); i++ {
		w := fields[i]
		if strings.HasPrefix(w, `"`) && !(len(w) > 1 && strings.HasSuffix(w, `"`)) {
			for i+1 < len(fields) {
				i++
				w += " " + fields[i]
				if strings.HasSuffix(fields[i], `"`) {
					break
				}
			}
		}
		out = append(out, strings.Trim(w, `"`))
	}
	return out
}

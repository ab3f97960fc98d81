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
	"syscall"
)

// Faults of the real node, for fault tests:
//
//   - KillKubelet kills the kubelet outright (SIGKILL) and StartKubelet runs
//     it again as it was first started: the containers it started keep
//     running under containerd meanwhile, as on a node whose kubelet
//     crashed and was restarted by its supervisor.
//   - PauseKubelet freezes the kubelet (SIGSTOP) and ResumeKubelet lets it
//     carry on: the node stops reporting, so the controller manager marks
//     it NotReady after its node monitor grace.
//   - RejectFromPod makes the host refuse one pod's connections to a port
//     of the gateway (an iptables REJECT rule with a TCP reset): the pod is
//     cut off from a server the pods reach there (the attempt API) while
//     everything else still reaches it.

const kubeletName = "kubelet"

// kubeletHealthz is the kubelet's health endpoint (healthzBindAddress in
// its configuration, the default port).
const kubeletHealthz = "http://127.0.0.1:10248/healthz"

// ruleComment tags every firewall rule a test cluster adds, so a stop (or
// the next start after a crash) removes whatever a test left.
const ruleComment = "reaper-kubetest"

// KillKubelet kills the real node's kubelet (SIGKILL) and waits until it
// has exited.
func (c *Cluster) KillKubelet() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, err := c.named(kubeletName)
	if err != nil {
		return err
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kubetest: kill the kubelet: %w", err)
	}
	<-p.exited
	return nil
}

// StartKubelet starts a killed kubelet again, as it was started first, and
// waits until it answers its health check or ctx ends. It does nothing to
// one that runs.
func (c *Cluster) StartKubelet(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, err := c.named(kubeletName)
	if err != nil {
		return err
	}
	select {
	case <-p.exited:
	default:
		return nil // it runs (perhaps paused: ResumeKubelet continues it)
	}
	if err := c.start(p, p.cmd.Path, p.cmd.Args[1:], 0 /* append to its log */); err != nil {
		return err
	}
	return c.waitReady(ctx, p, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, kubeletHealthz, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("kubelet healthz: %s", resp.Status)
		}
		return nil
	})
}

// PauseKubelet freezes the real node's kubelet with SIGSTOP.
func (c *Cluster) PauseKubelet() error { return c.signal(kubeletName, syscall.SIGSTOP, "pause") }

// ResumeKubelet continues a paused kubelet with SIGCONT.
func (c *Cluster) ResumeKubelet() error { return c.signal(kubeletName, syscall.SIGCONT, "resume") }

func (c *Cluster) signal(name string, sig syscall.Signal, what string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, err := c.named(name)
	if err != nil {
		return err
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("kubetest: %s the %s: %w", what, name, err)
	}
	return nil
}

// named returns the cluster's process called name; c.mu is held.
func (c *Cluster) named(name string) (*process, error) {
	for _, p := range c.procs {
		if p.name == name {
			return p, nil
		}
	}
	return nil, fmt.Errorf("kubetest: the cluster runs no %s", name)
}

// RejectFromPod makes the host refuse the connections of the pod at podIP
// (or of every pod whose address is in a CIDR such as NodeSubnet) to port
// on the gateway, until the returned undo is called (a test's cleanup
// should call it too: calling it twice is harmless).
func (n *RealNode) RejectFromPod(podIP string, port int) (undo func() error, err error) {
	source := podIP + "/32"
	if _, _, err := net.ParseCIDR(podIP); err == nil {
		source = podIP
	} else if net.ParseIP(podIP) == nil {
		return nil, fmt.Errorf("kubetest: reject from pod: %q is neither an IP address nor a CIDR", podIP)
	}
	rule := []string{"INPUT", "-s", source, "-d", NodeGateway + "/32", "-p", "tcp", "--dport", strconv.Itoa(port),
		"-m", "comment", "--comment", ruleComment, "-j", "REJECT", "--reject-with", "tcp-reset"}
	if err := iptables(append([]string{"-I"}, rule...)...); err != nil {
		return nil, err
	}
	done := false
	return func() error {
		if done {
			return nil
		}
		done = true
		return iptables(append([]string{"-D"}, rule...)...)
	}, nil
}

func iptables(args ...string) error {
	out, err := exec.Command("iptables", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubetest: iptables %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// taggedRules lists the INPUT rules a test cluster added (RejectFromPod's)
// as iptables -S prints them; none when iptables is missing.
func taggedRules() []string {
	out, err := exec.Command("iptables", "-S", "INPUT").Output()
	if err != nil {
		return nil
	}
	var rules []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, ruleComment) {
			rules = append(rules, l)
		}
	}
	return rules
}

// removeTaggedRules deletes every rule taggedRules lists.
func removeTaggedRules() {
	for _, r := range taggedRules() {
		args := strings.Fields(strings.Replace(r, "-A ", "-D ", 1))
		_ = exec.Command("iptables", args...).Run()
	}
}

// PodProcess is a process of a container the real node runs.
type PodProcess struct {
	PID int
	Exe string // the basename of its executable
}

// PodProcesses lists the host processes in the containers of the pod whose
// UID is uid (by their cgroup, which the kubelet names after the pod), for
// a test that signals one (a wedged agent: SIGSTOP).
func PodProcesses(uid string) []PodProcess {
	if uid == "" {
		return nil
	}
	var out []PodProcess
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil || !strings.Contains(string(cg), "/pod"+uid+"/") {
			continue
		}
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		out = append(out, PodProcess{PID: pid, Exe: filepath.Base(strings.TrimSuffix(exe, " (deleted)"))})
	}
	return out
}

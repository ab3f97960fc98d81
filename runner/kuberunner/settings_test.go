package kuberunner

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/attempttoken"
)

// kubeconfigFile writes a kubeconfig naming a server nobody listens on:
// building a client reads it and dials nothing.
func kubeconfigFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	src := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n" +
		"users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// FromSettings turns the kube block into the runner's configuration: the
// client from its kubeconfig, the container's quantities, the hardening,
// the credentials minted by the issuer at the block's attempt_api, and the
// warm pool with worker credentials from the same issuer.
func TestFromSettingsBuildsTheRunnerOfTheKubeBlock(t *testing.T) {
	t.Parallel()
	w := lifecycle.New(nil, lifecycle.Options{})
	issuer := attempttoken.Issuer{TTL: time.Minute, API: "https://127.0.0.1:9465"}
	s := Settings{
		Namespace: "tasks", Kubeconfig: kubeconfigFile(t), Image: "task:1", ServiceAccount: "runner",
		PullPolicy: "Never", TerminationGrace: 7 * time.Second, AttemptAPI: "https://reaper.tasks.svc:9465",
		RunAsUser: 1000, RunAsGroup: 2000, ReadOnlyRoot: false,
		Requests: map[string]string{"cpu": "250m"}, Limits: map[string]string{"memory": "1Gi"},
		WarmPool:       &WarmPoolSettings{Name: "etl", Size: 2, Slots: 3, Poll: time.Second, Refill: 4 * time.Second},
		DispatchBuffer: 32, DispatchWorkers: 6,
	}
	r, err := FromSettings(s, issuer, Config{MaxParallel: 9}, w)
	if err != nil {
		t.Fatal(err)
	}
	c := r.cfg
	if c.Client == nil || c.Namespace != "tasks" || c.Image != "task:1" || c.AgentPath != AgentPathDefault ||
		c.ServiceAccount != "runner" || c.PullPolicy != corev1.PullNever || c.TerminationGrace != 7*time.Second || c.MaxParallel != 9 ||
		c.DispatchBuffer != 32 || c.DispatchWorkers != 6 {
		t.Fatalf("config %+v", c)
	}
	if c.Hardening != (Hardening{RunAsUser: 1000, RunAsGroup: 2000, WritableRoot: true}) {
		t.Fatalf("hardening %+v", c.Hardening)
	}
	if q := c.Resources.Requests[corev1.ResourceCPU]; q.Cmp(resource.MustParse("250m")) != 0 || len(c.Resources.Requests) != 1 {
		t.Fatalf("requests %v", c.Resources.Requests)
	}
	if q := c.Resources.Limits[corev1.ResourceMemory]; q.Cmp(resource.MustParse("1Gi")) != 0 || len(c.Resources.Limits) != 1 {
		t.Fatalf("limits %v", c.Resources.Limits)
	}
	m, ok := c.Credentials.(MintedCredentials)
	if !ok || m.Minter.(attempttoken.Issuer).API != s.AttemptAPI {
		t.Fatalf("credentials %#v: want minted for the pods' address %s", c.Credentials, s.AttemptAPI)
	}
	wp := c.WarmPool
	if wp == nil || wp.Name != "etl" || wp.Size != 2 || wp.Slots != 3 || wp.Poll != time.Second || wp.Refill != 4*time.Second {
		t.Fatalf("warm pool %+v", wp)
	}
	if wm, ok := wp.Credentials.(MintedWorkerCredentials); !ok || wm.Minter.(attempttoken.Issuer).API != s.AttemptAPI {
		t.Fatalf("worker credentials %#v", wp.Credentials)
	}
	if issuer.API != "https://127.0.0.1:9465" {
		t.Fatalf("the caller's issuer was changed: %s", issuer.API)
	}

	t.Run("NoAttemptAPIKeepsTheIssuersAddress", func(t *testing.T) {
		s := s
		s.AttemptAPI, s.WarmPool = "", nil
		r, err := FromSettings(s, issuer, Config{}, w)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.cfg.Credentials.(MintedCredentials).Minter.(attempttoken.Issuer).API; got != issuer.API || r.cfg.WarmPool != nil {
			t.Fatalf("minted for %s, pool %+v", got, r.cfg.WarmPool)
		}
	})
	for name, tc := range map[string]struct {
		edit func(*Settings)
		want string
	}{
		"AMissingKubeconfigIsRefused":     {func(s *Settings) { s.Kubeconfig += ".missing" }, "loading the API server's configuration"},
		"ABadQuantityIsRefused":           {func(s *Settings) { s.Limits = map[string]string{"memory": "lots"} }, `memory limit "lots"`},
		"NoImageIsRefused":                {func(s *Settings) { s.Image = "" }, "no image"},
		"WorkersWithoutABufferAreRefused": {func(s *Settings) { s.DispatchBuffer = 0 }, "dispatch_workers 6"},
	} {
		t.Run(name, func(t *testing.T) {
			s := s
			tc.edit(&s)
			if _, err := FromSettings(s, issuer, Config{}, w); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// Run needs the host's leadership: without Config.Leading it refuses at
// once rather than cycle unfenced.
func TestRunWithoutLeadershipIsRefused(t *testing.T) {
	t.Parallel()
	r, err := FromSettings(Settings{Namespace: "n", Image: "i", Kubeconfig: kubeconfigFile(t)}, attempttoken.Issuer{}, Config{},
		lifecycle.New(nil, lifecycle.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(t.Context()); err == nil || !strings.Contains(err.Error(), "Leading") {
		t.Fatalf("Run without leadership: %v", err)
	}
}

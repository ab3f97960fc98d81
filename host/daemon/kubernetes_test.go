package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dexaflow/reaper/host/config"
	"github.com/dexaflow/reaper/host/leader/kubelease"
)

// The leader block picks the lease: the board's row alone for postgres, a
// Kubernetes Lease in front of it for kubernetes.
func TestLeaderBlockPicksTheLease(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	src := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n" +
		"users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
	if err := os.WriteFile(kubeconfig, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		leader config.Leader
		kube   bool
		err    string
	}{
		{name: "Postgres", leader: config.Leader{Kind: config.LeaderPostgres}},
		{name: "KubernetesFromAKubeconfig", kube: true,
			leader: config.Leader{Kind: config.LeaderKubernetes, Namespace: "n", Name: "l", Kubeconfig: kubeconfig}},
		{name: "KubernetesOutsideAPodWithoutAKubeconfigIsRefused", err: "not running in a pod",
			leader: config.Leader{Kind: config.LeaderKubernetes, Namespace: "n", Name: "l"}},
		{name: "KubernetesWithAMissingKubeconfigIsRefused", err: "loading the API server's configuration",
			leader: config.Leader{Kind: config.LeaderKubernetes, Namespace: "n", Name: "l", Kubeconfig: kubeconfig + ".missing"}},
		{name: "UnknownKind", err: "has no elector", leader: config.Leader{Kind: "zookeeper"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Outside a pod, whatever runs the test.
			t.Setenv("KUBERNETES_SERVICE_HOST", "")
			t.Setenv("KUBERNETES_SERVICE_PORT", "")
			d := &Daemon{cfg: &config.Config{Leader: tc.leader}}
			lease, err := d.leaderLease()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, isKube := lease.(*kubelease.Lease); isKube != tc.kube {
				t.Fatalf("lease %T, want a Kubernetes Lease: %v", lease, tc.kube)
			}
		})
	}
}

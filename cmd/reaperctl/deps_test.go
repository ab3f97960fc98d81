package main_test

import (
	"os/exec"
	"strings"
	"testing"
)

// reaperctl reads reaperd's configuration file, which names the kube
// runner's settings, but it talks to the board only: it links no
// Kubernetes client (the kube runner's settings live apart from the
// runner, in runner/kuberunner/kubesettings).
func TestReaperctlLinksNoKubernetesClient(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	var client []string
	for _, dep := range strings.Fields(string(out)) {
		if dep == "k8s.io/client-go" || strings.HasPrefix(dep, "k8s.io/client-go/") {
			client = append(client, dep)
		}
	}
	if len(client) > 0 {
		t.Fatalf("reaperctl links %d packages of k8s.io/client-go, among them %s", len(client), client[0])
	}
}

package helmrelease

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ValuesText is the values file a user would keep for the image version:
// the image, the Secrets, the kube runner on with the task image, and the
// short ladder; everything else is the chart's default.
func ValuesText(version string) string {
	return fmt.Sprintf(`image:
  repository: %s
  tag: %q
config:
  leader:
    lease: %s
  maintenance:
    interval: %s
  ladder:
%s  runner:
    enabled: true
    settings:
      interval: 500ms
    kube:
      image: %s
      image_pull_policy: Never
attemptApi:
  tls:
    existingSecret: %s
    caKey: ca.crt
  signingKeys:
    existingSecret: %s
`, ImageRepository, version, Lease, MaintenanceInterval, ladderValues, TaskImage, TLSSecret, KeysSecret)
}

// Values writes ValuesText(version) into Dir, says what it holds, and
// returns its path.
func (r *Release) Values(version string) (string, error) {
	text := ValuesText(version)
	path := filepath.Join(r.cfg.Dir, "values-"+version+".yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return "", fmt.Errorf("helmrelease: write the values: %w", err)
	}
	r.say("%s:\n    %s", path, strings.ReplaceAll(strings.TrimSpace(text), "\n", "\n    "))
	return path, nil
}

// Helm runs the cluster's Helm in the repository's root (the chart is
// ChartDir there) with homes of its own (no repositories, plugins or
// kubeconfig of the user's) and KUBECONFIG the cluster's, says the command
// line, and returns its output.
func (r *Release) Helm(ctx context.Context, args ...string) (string, error) {
	r.say("$ helm %s", strings.Join(quoted(args), " "))
	cmd := exec.CommandContext(ctx, r.Cluster.Binaries().Helm, args...)
	cmd.Dir = r.cfg.Root
	home := filepath.Join(r.cfg.Dir, "helm")
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
		"KUBECONFIG="+r.Cluster.Kubeconfig())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// quoted quotes the arguments a shell would split.
func quoted(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n'\"$&;|<>()*?[]#~`\\") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out[i] = a
	}
	return out
}

// Install installs the chart with the image version's values (helm install
// --wait) and waits for both replicas to be Ready by their own probes; it
// returns how long that took from helm's start.
func (r *Release) Install(ctx context.Context, version string) (time.Duration, error) {
	values, err := r.Values(version)
	if err != nil {
		return 0, err
	}
	begin := time.Now()
	out, err := r.Helm(ctx, "install", Name, ChartDir, "--namespace", Namespace, "--values", values, "--wait", "--timeout", "4m")
	if err != nil {
		return 0, fmt.Errorf("helmrelease: helm install: %w\n%s", err, out)
	}
	// helm's --wait holds a Deployment ready with maxUnavailable replicas
	// not: wait for both, by their own probes.
	if err := r.WaitReplicasReady(ctx); err != nil {
		return 0, err
	}
	return time.Since(begin), nil
}

// Upgrade runs helm upgrade to the image version's values (--wait).
func (r *Release) Upgrade(ctx context.Context, version string, more ...string) (string, error) {
	values, err := r.Values(version)
	if err != nil {
		return "", err
	}
	return r.Helm(ctx, append([]string{"upgrade", Name, ChartDir, "--namespace", Namespace, "--values", values}, more...)...)
}

// Uninstall runs helm uninstall (--wait) and returns what it left that it
// should not have (Left).
func (r *Release) Uninstall(ctx context.Context) ([]string, error) {
	if out, err := r.Helm(ctx, "uninstall", Name, "--namespace", Namespace, "--wait", "--timeout", "2m"); err != nil {
		return nil, fmt.Errorf("helmrelease: helm uninstall: %w\n%s", err, out)
	}
	return r.Left(ctx), nil
}

// Left lists what helm uninstall must not leave: a reaperd pod, the Lease,
// an admission policy or binding of the release, a task pod held by the
// outcome record finalizer.
func (r *Release) Left(ctx context.Context) []string {
	var left []string
	if err := until(ctx, time.Minute, 200*time.Millisecond, "the replicas to go", func() bool {
		pods, err := r.Replicas(ctx)
		return err == nil && len(pods) == 0
	}); err != nil {
		pods, _ := r.Replicas(ctx)
		left = append(left, fmt.Sprintf("%d reaperd pods (%v)", len(pods), err))
	}
	if h, err := r.LeaseHolder(ctx); err != nil || h != "" {
		left = append(left, fmt.Sprintf("the Lease, held by %q (%v)", h, err))
	}
	if _, err := r.Client.CoordinationV1().Leases(Namespace).Get(ctx, Name, metav1.GetOptions{}); err == nil {
		left = append(left, "the Lease "+Name)
	}
	sel := metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + Name}
	if ps, err := r.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(ctx, sel); err != nil || len(ps.Items) != 0 {
		left = append(left, fmt.Sprintf("admission policies (%v)", err))
	}
	if bs, err := r.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().List(ctx, sel); err != nil || len(bs.Items) != 0 {
		left = append(left, fmt.Sprintf("admission policy bindings (%v)", err))
	}
	held, err := r.HeldTaskPods(ctx)
	if err != nil {
		left = append(left, err.Error())
	}
	for _, p := range held {
		left = append(left, "task pod "+p+" held by the outcome record finalizer")
	}
	return left
}

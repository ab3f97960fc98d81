package install_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"k8s.io/utils/ptr"

	"github.com/dexaflow/reaper/testkit/eventually"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// The names a user would choose, and the chart's defaults for the rest.
const (
	releaseName = "reaper"
	releaseNS   = "reaper-system"
	// taskNS is the chart's default task namespace for releaseNS.
	taskNS = releaseNS + "-tasks"
	// taskImage holds the agent and a shell for the tasks' commands.
	taskImage = "reaper.local/install-task:v1"
	// imageRepo is the chart's default image.repository.
	imageRepo = "reaper"
	// The Secrets the user creates before installing.
	dbSecret   = "reaper-database"
	tlsSecret  = "reaper-attempt-api-tls"
	keysSecret = "reaper-attempt-api-keys"
)

// The ladder the tier's values set: the specification's order, shortened
// so a fault is judged in seconds (the fault suites' ladder).
var ladderValues = map[string]string{
	"heartbeat": "1s", "agent_lost": "5s", "settling_grace": "8s", "dispatch_lost": "10s",
	"pod_lost_floor": "5s", "orphan_run": "20s", "infra_confirm_valve": "10s", "task_termination_grace": "2s",
}

// release is the chart installed in the tier's cluster.
type release struct {
	t      *testing.T
	c      *kubetest.Cluster
	node   *kubetest.RealNode
	cs     kubernetes.Interface
	dir    string // helm's home, the values and the host's configuration
	dbName string
	board  *pgxpool.Pool
	// hostConfig is reaperctl's configuration on the machine.
	hostConfig string
}

// repoRoot is the repository's root (the tier runs in test/install).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// buildImage builds the product's image with tools/image, stamped with
// version (more of its flags given), and returns the path of its tarball (tagged reaper:VERSION).
func buildImage(ctx context.Context, t *testing.T, version string, flags ...string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "image")
	cmd := exec.CommandContext(ctx, "go", append([]string{"run", ".", "-root", "../..", "-out", out, "-version", version}, flags...)...)
	cmd.Dir = filepath.Join(repoRoot(t), "tools", "image")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the image %s: %v\n%s", version, err, b)
	}
	return filepath.Join(out, "reaper.tar")
}

// newRelease prepares what a user prepares before helm install: the
// image on the node, the task image, a database with the board's schema,
// the release's namespace and its three Secrets.
func newRelease(t *testing.T) *release {
	t.Helper()
	if hostWhy != "" {
		t.Skipf("install: no real node: %s", hostWhy)
	}
	c := kubetest.Current(t)
	n := c.NeedRealNode(t)
	r := &release{t: t, c: c, node: n, cs: c.Client(t), dir: t.TempDir()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	agent, err := buildStatic(ctx, "reaper-agent", "github.com/dexaflow/reaper/runner/agent/cmd/reaper-agent")
	if err != nil {
		t.Fatal(err)
	}
	if err := n.ImportTaskImage(ctx, taskImage, agent); err != nil {
		t.Fatal(err)
	}

	r.dbName = db.UniqueName("install")
	if err := db.CreateDatabase(ctx, r.dbName, ""); err != nil {
		t.Fatal(err)
	}
	if r.board, err = pgxpool.New(ctx, db.DSN(r.dbName)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.board.Close)
	r.hostConfig = filepath.Join(r.dir, "host.hcl")
	if err := os.WriteFile(r.hostConfig, []byte(fmt.Sprintf(`edition = "kube"

store {
  dsn = %q
}

substrate "kube" {
  namespace  = %q
  kubeconfig = %q
}
`, db.DSN(r.dbName), taskNS, c.Kubeconfig())), 0o600); err != nil {
		t.Fatal(err)
	}
	// The schema, applied once before the install as docs/operate.md says.
	if out, err := exec.CommandContext(ctx, filepath.Join(binDir, "reaperd"), "migrate", "-config", r.hostConfig).CombinedOutput(); err != nil {
		t.Fatalf("reaperd migrate: %v\n%s", err, out)
	}

	if _, err := r.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: releaseNS}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.deleteNamespaces() })
	cert, err := c.IssueServingCert("reaper-attempt-api",
		releaseName+"-attempt-api."+releaseNS+".svc", releaseName+"-attempt-api."+releaseNS+".svc."+kubetest.ClusterDomain)
	if err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	for _, s := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Name: dbSecret}, StringData: map[string]string{
			"dsn": db.DSNAt(kubetest.NodeGateway, r.dbName)}},
		{ObjectMeta: metav1.ObjectMeta{Name: tlsSecret}, Type: corev1.SecretTypeTLS, Data: map[string][]byte{
			"tls.crt": cert.Cert, "tls.key": cert.Key, "ca.crt": cert.CA}},
		{ObjectMeta: metav1.ObjectMeta{Name: keysSecret}, StringData: map[string]string{
			"keys.hcl": fmt.Sprintf("current \"install-1\" {\n  secret = %q\n}\n", base64.StdEncoding.EncodeToString(key))}},
	} {
		if _, err := r.cs.CoreV1().Secrets(releaseNS).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create the Secret %s: %v", s.Name, err)
		}
	}
	return r
}

// values writes the values file a user would keep for version: the image,
// the Secrets, the kube runner on with the task image, and the tier's
// short ladder; everything else is the chart's default.
func (r *release) values(version string) string {
	var ladder strings.Builder
	for k, v := range ladderValues {
		fmt.Fprintf(&ladder, "    %s: %q\n", k, v)
	}
	text := fmt.Sprintf(`image:
  repository: %s
  tag: %q
config:
  leader:
    lease: 6s
  maintenance:
    interval: 2s
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
`, imageRepo, version, ladder.String(), taskImage, tlsSecret, keysSecret)
	path := filepath.Join(r.dir, "values-"+version+".yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		r.t.Fatal(err)
	}
	return path
}

// helm runs the cached Helm binary against the cluster, with homes of its
// own (no repositories, plugins or kubeconfig of the user's).
func (r *release) helm(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, r.c.Binaries().Helm, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(r.dir, "helm", "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(r.dir, "helm", "config"),
		"HELM_DATA_HOME="+filepath.Join(r.dir, "helm", "data"),
		"KUBECONFIG="+r.c.Kubeconfig())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// chart is the chart's directory.
func (r *release) chart() string { return filepath.Join(repoRoot(r.t), "deploy", "helm", "reaper") }

// replicas lists the release's reaperd pods.
func (r *release) replicas(ctx context.Context) []corev1.Pod {
	r.t.Helper()
	list, err := r.cs.CoreV1().Pods(releaseNS).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=reaper,app.kubernetes.io/instance=" + releaseName})
	if err != nil {
		r.t.Fatalf("list reaperd's pods: %v", err)
	}
	return list.Items
}

// leaseHolder is the holder of the release's Lease ("" when none).
func (r *release) leaseHolder(ctx context.Context) string {
	r.t.Helper()
	l, err := r.cs.CoordinationV1().Leases(releaseNS).Get(ctx, releaseName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return ""
	}
	if err != nil {
		r.t.Fatalf("get the Lease: %v", err)
	}
	return holder(l)
}

func holder(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// submit submits a run of n tasks running command with reaperctl from the
// machine, as an operator would, and returns its id.
func (r *release) submit(ctx context.Context, runID string, n int, command string) {
	r.t.Helper()
	out, err := exec.CommandContext(ctx, filepath.Join(binDir, "reaperctl"), "submit", "-config", r.hostConfig,
		"-run", runID, "-n", fmt.Sprint(n), "-command", command).CombinedOutput()
	if err != nil {
		r.t.Fatalf("reaperctl submit: %v\n%s", err, out)
	}
}

// runState is the run's state and its tasks' states, from the board.
func (r *release) runState(ctx context.Context, runID string) (string, map[string]string) {
	r.t.Helper()
	var state string
	if err := r.board.QueryRow(ctx, `SELECT state FROM runs WHERE run_id = $1`, runID).Scan(&state); err != nil {
		r.t.Fatalf("read run %s: %v", runID, err)
	}
	rows, err := r.board.Query(ctx, `SELECT task_id, state FROM task_instances WHERE run_id = $1`, runID)
	if err != nil {
		r.t.Fatalf("read run %s's tasks: %v", runID, err)
	}
	defer rows.Close()
	tasks := map[string]string{}
	for rows.Next() {
		var id, st string
		if err := rows.Scan(&id, &st); err != nil {
			r.t.Fatal(err)
		}
		tasks[id] = st
	}
	return state, tasks
}

// waitRun waits for the run to end and returns its state.
func (r *release) waitRun(ctx context.Context, runID string, within time.Duration) (string, map[string]string) {
	r.t.Helper()
	var state string
	var tasks map[string]string
	eventually.Until(within, func() bool {
		state, tasks = r.runState(ctx, runID)
		return state == "success" || state == "failed"
	}, eventually.Every(250*time.Millisecond))
	return state, tasks
}

// dump logs what a failed test needs: the runs, the reapers' decisions,
// the pods, their containers' logs, the events.
func (r *release) dump(ctx context.Context) {
	r.t.Helper()
	if rows, err := r.board.Query(ctx, `SELECT run_id, state, coalesce(error_message, '') FROM runs ORDER BY run_id`); err == nil {
		for rows.Next() {
			var id, st, msg string
			_ = rows.Scan(&id, &st, &msg)
			r.t.Logf("run %s: %s %s", id, st, msg)
		}
		rows.Close()
	}
	if rows, err := r.board.Query(ctx, `SELECT reaper, label, coalesce(run_id, ''), coalesce(task_id, ''), applied, detail FROM reap_decisions ORDER BY id`); err == nil {
		for rows.Next() {
			var reaper, label, run, task, detail string
			var applied bool
			_ = rows.Scan(&reaper, &label, &run, &task, &applied, &detail)
			r.t.Logf("decision %s %s %s/%s applied=%v %s", reaper, label, run, task, applied, detail)
		}
		rows.Close()
	}
	for _, ns := range []string{releaseNS, taskNS} {
		pods, err := r.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			continue
		}
		for _, p := range pods.Items {
			var logs strings.Builder
			for _, c := range p.Spec.Containers {
				b, err := r.cs.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: c.Name, TailLines: ptr.To[int64](60)}).DoRaw(ctx)
				fmt.Fprintf(&logs, "--- %s (%v):\n%s\n", c.Name, err, b)
			}
			r.t.Logf("pod %s/%s on %q: %s\n%s", ns, p.Name, p.Spec.NodeName, p.Status.Phase, logs.String())
		}
		evs, err := r.cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, e := range evs.Items {
				r.t.Logf("event %s/%s %s: %s", ns, e.InvolvedObject.Name, e.Reason, e.Message)
			}
		}
	}
}

// deleteNamespaces removes the release's and the task namespace (the
// chart keeps the latter on uninstall) at the test's end.
func (r *release) deleteNamespaces() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, ns := range []string{taskNS, releaseNS} {
		if err := r.cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			r.t.Errorf("delete namespace %s: %v", ns, err)
		}
	}
}

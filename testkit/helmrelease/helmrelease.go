// Package helmrelease installs reaper the way its users do, on the test
// cluster that hosts in-cluster workloads (kubetest.Options.InCluster): the
// product image built by tools/image and imported into the real node as a
// registry pull would put it there, a task image, a database on the pod
// network's gateway (reached by the pods as a managed one would be) with
// the board's schema applied by reaperd migrate, the release's namespace
// and the three Secrets the chart reads, a values file, helm with homes of
// its own, and reaperctl on the machine. It then reads what a user looks
// at: the replicas and their probes, the Lease, the task pods and their
// Events, the runs on the board.
//
// The install tier (test/install) judges a Release; make demo-helm shows
// one. Each step a Release takes is told (Config.Say) as the command a
// user types on a real cluster, the same walk docs/operate.md describes.
package helmrelease

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dexaflow/reaper/testkit/eventually"
	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// The names a user would choose, and the chart's defaults for the rest.
const (
	// Name is the release's name, and with the chart's defaults its full
	// name: the Deployment, the Lease and the Services' prefix.
	Name = "reaper"
	// Namespace is the release's namespace.
	Namespace = "reaper-system"
	// TaskNamespace is the chart's default task namespace for Namespace.
	TaskNamespace = Namespace + "-tasks"
	// ImageRepository is the chart's default image.repository: the image
	// tools/image builds is tagged ImageRepository:VERSION.
	ImageRepository = "reaper"
	// TaskImage holds the agent and a shell for the tasks' commands.
	TaskImage = "reaper.local/install-task:v1"
	// The Secrets the user creates before installing.
	DatabaseSecret = "reaper-database"
	TLSSecret      = "reaper-attempt-api-tls"
	KeysSecret     = "reaper-attempt-api-keys"
	// ChartDir is the chart's directory in the repository.
	ChartDir = "deploy/helm/reaper"
	// TelemetryPort serves /metrics and /monitor/health on a replica's
	// pod address.
	TelemetryPort = "9464"
)

// The timing the values set: the specification's ladder, shortened so that
// a fault is judged in seconds (the fault suites' ladder).
const (
	// Lease is the leader Lease's duration.
	Lease = 6 * time.Second
	// MaintenanceInterval is the maintenance loop's interval.
	MaintenanceInterval = 2 * time.Second
	// SettlingGrace is how long a new leader waits before it reaps.
	SettlingGrace = 8 * time.Second
)

// ladderValues is config.ladder in the values file.
const ladderValues = `    heartbeat: "1s"
    agent_lost: "5s"
    settling_grace: "8s"
    dispatch_lost: "10s"
    pod_lost_floor: "5s"
    orphan_run: "20s"
    infra_confirm_valve: "10s"
    task_termination_grace: "2s"
`

// Config is what a Release is prepared from.
type Config struct {
	// Cluster hosts in-cluster workloads (kubetest.Options.InCluster) and
	// has its real node.
	Cluster *kubetest.Cluster
	// DB listens on kubetest.NodeGateway and lets kubetest.NodeSubnet in
	// (pgtest.Options Listen and AllowFrom); the release gets a database
	// of its own on it.
	DB *pgtest.Server
	// Root is the repository's root (FindRoot).
	Root string
	// Bin holds reaperd and reaperctl, built for this machine.
	Bin string
	// Dir is the release's own directory: helm's homes, the values files,
	// the images, reaperctl's configuration.
	Dir string
	// Say, when set, is told each step as the command a user would type.
	Say func(format string, args ...any)
}

// Release is the chart's release in the cluster, and what was prepared for
// it.
type Release struct {
	cfg Config
	// Cluster, Node and Client are the cluster, its real node and an
	// admin client of it.
	Cluster *kubetest.Cluster
	Node    *kubetest.RealNode
	Client  kubernetes.Interface
	// Database is the release's database on Config.DB, and Board a pool
	// on it from the machine.
	Database string
	Board    *pgxpool.Pool
	// HostConfig is reaperctl's (and reaperd migrate's) configuration on
	// the machine: the database and the cluster's kubeconfig.
	HostConfig string
	namespace  bool // the release's namespace was created
}

// FindRoot finds the repository's root from the working directory up: the
// directory that holds ChartDir.
func FindRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("helmrelease: the working directory: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, ChartDir, "Chart.yaml")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("helmrelease: no " + ChartDir + " in the working directory or above it: run from the repository")
		}
		dir = parent
	}
}

// Prepare prepares what a user prepares before helm install: the task
// image on the node, a database with the board's schema (reaperd migrate),
// the release's namespace and its three Secrets. The product image is
// ImportImage's. Close undoes what Prepare made, even when it failed.
func Prepare(ctx context.Context, cfg Config) (*Release, error) {
	n, why := cfg.Cluster.RealNode()
	if n == nil {
		return nil, fmt.Errorf("helmrelease: the cluster has no real node: %s", why)
	}
	cs, err := kubernetes.NewForConfig(cfg.Cluster.AdminConfig())
	if err != nil {
		return nil, fmt.Errorf("helmrelease: the API client: %w", err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("helmrelease: %w", err)
	}
	r := &Release{cfg: cfg, Cluster: cfg.Cluster, Node: n, Client: cs, HostConfig: filepath.Join(cfg.Dir, "host.hcl")}
	if err := r.prepare(ctx); err != nil {
		_ = r.Close()
		return nil, err
	}
	return r, nil
}

func (r *Release) prepare(ctx context.Context) error {
	begin := time.Now()
	agent := filepath.Join(r.cfg.Dir, "reaper-agent")
	if err := BuildStatic(ctx, r.cfg.Root, agent, "./cmd/reaper-agent"); err != nil {
		return err
	}
	if err := r.Node.ImportTaskImage(ctx, TaskImage, agent); err != nil {
		return err
	}
	r.say("task image %s (reaper-agent, a static busybox) imported into the node in %s", TaskImage, since(begin))

	db := r.cfg.DB
	r.Database = db.UniqueName("reaper")
	if err := db.CreateDatabase(ctx, r.Database, ""); err != nil {
		return err
	}
	var err error
	if r.Board, err = pgxpool.New(ctx, db.DSN(r.Database)); err != nil {
		return fmt.Errorf("helmrelease: open the board: %w", err)
	}
	if err := os.WriteFile(r.HostConfig, []byte(fmt.Sprintf(`edition = "kube"

store {
  dsn = %q
}

substrate "kube" {
  namespace  = %q
  kubeconfig = %q
}
`, db.DSN(r.Database), TaskNamespace, r.Cluster.Kubeconfig())), 0o600); err != nil {
		return fmt.Errorf("helmrelease: write reaperctl's configuration: %w", err)
	}
	// The schema, applied once before the install as docs/operate.md says.
	r.say("$ reaperd migrate -config %s", r.HostConfig)
	out, err := r.command(ctx, "reaperd", "migrate", "-config", r.HostConfig).CombinedOutput()
	if err != nil {
		return fmt.Errorf("helmrelease: reaperd migrate: %w\n%s", err, out)
	}
	r.say("%s", strings.TrimSpace(string(out)))

	r.say("$ kubectl create namespace %s", Namespace)
	if _, err := r.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}},
		metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("helmrelease: create namespace %s: %w", Namespace, err)
	}
	r.namespace = true
	return r.createSecrets(ctx)
}

// createSecrets creates the database's, the attempt API's certificate's
// (for its Service's names, signed by the cluster's CA) and the signing
// keys' Secrets, and writes their files into Dir as a user would have them.
func (r *Release) createSecrets(ctx context.Context) error {
	service := Name + "-attempt-api." + Namespace + ".svc"
	cert, err := r.Cluster.IssueServingCert(Name+"-attempt-api", service, service+"."+kubetest.ClusterDomain)
	if err != nil {
		return err
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return fmt.Errorf("helmrelease: a signing key: %w", err)
	}
	keys := fmt.Sprintf("current \"install-1\" {\n  secret = %q\n}\n", base64.StdEncoding.EncodeToString(key))
	file := func(name string, data []byte) string {
		path := filepath.Join(r.cfg.Dir, name)
		if err == nil {
			err = os.WriteFile(path, data, 0o600)
		}
		return path
	}
	crt, tlsKey, ca, keysFile := file("tls.crt", cert.Cert), file("tls.key", cert.Key), file("ca.crt", cert.CA), file("keys.hcl", []byte(keys))
	if err != nil {
		return fmt.Errorf("helmrelease: write the Secrets' files: %w", err)
	}
	r.say("$ kubectl -n %s create secret generic %s --from-literal=dsn='%s'", Namespace, DatabaseSecret, r.PodDSN())
	r.say("$ kubectl -n %s create secret generic %s --type=kubernetes.io/tls --from-file=%s --from-file=%s --from-file=%s",
		Namespace, TLSSecret, crt, tlsKey, ca)
	r.say("    (a certificate for %s, signed by the cluster's CA)", service)
	r.say("$ kubectl -n %s create secret generic %s --from-file=%s", Namespace, KeysSecret, keysFile)
	for _, s := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Name: DatabaseSecret}, StringData: map[string]string{"dsn": r.PodDSN()}},
		{ObjectMeta: metav1.ObjectMeta{Name: TLSSecret}, Type: corev1.SecretTypeTLS, Data: map[string][]byte{
			"tls.crt": cert.Cert, "tls.key": cert.Key, "ca.crt": cert.CA}},
		{ObjectMeta: metav1.ObjectMeta{Name: KeysSecret}, StringData: map[string]string{"keys.hcl": keys}},
	} {
		if _, err := r.Client.CoreV1().Secrets(Namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("helmrelease: create the Secret %s: %w", s.Name, err)
		}
	}
	return nil
}

// PodDSN is the database's DSN as the pods reach it: on the gateway.
func (r *Release) PodDSN() string { return r.cfg.DB.DSNAt(kubetest.NodeGateway, r.Database) }

// SetDSN replaces the DSN Secret's value ("" deletes the Secret).
func (r *Release) SetDSN(ctx context.Context, dsn string) error {
	secrets := r.Client.CoreV1().Secrets(Namespace)
	if err := secrets.Delete(ctx, DatabaseSecret, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("helmrelease: delete the Secret %s: %w", DatabaseSecret, err)
	}
	if dsn == "" {
		return nil
	}
	if _, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: DatabaseSecret},
		StringData: map[string]string{"dsn": dsn}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("helmrelease: create the Secret %s: %w", DatabaseSecret, err)
	}
	return nil
}

// DeleteNamespaces deletes the release's and the task namespace (the chart
// keeps the latter on uninstall).
func (r *Release) DeleteNamespaces(ctx context.Context) error {
	var errs []error
	for _, ns := range []string{TaskNamespace, Namespace} {
		if err := r.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("helmrelease: delete namespace %s: %w", ns, err))
		}
	}
	return errors.Join(errs...)
}

// Close deletes the namespaces Prepare made and closes the board's pool;
// the database stays on its server.
func (r *Release) Close() error {
	var err error
	if r.namespace {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err = r.DeleteNamespaces(ctx)
		r.namespace = false
	}
	if r.Board != nil {
		r.Board.Close()
		r.Board = nil
	}
	return err
}

// command is one of the binaries in Config.Bin, with the environment the
// configuration file speaks for (no REAPER_DSN of the caller's).
func (r *Release) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(r.cfg.Bin, name), args...)
	cmd.Env = append(os.Environ(), "REAPER_DSN=")
	return cmd
}

func (r *Release) say(format string, args ...any) {
	if r.cfg.Say != nil {
		r.cfg.Say(format, args...)
	}
}

// ErrTimeout is what a wait returns when its bound passed.
var ErrTimeout = errors.New("timed out")

// until polls cond every every until it holds (nil), ctx ends (its error)
// or within has passed (ErrTimeout wrapped with what).
func until(ctx context.Context, within, every time.Duration, what string, cond func() bool) error {
	ok := eventually.Until(within, func() bool { return ctx.Err() != nil || cond() }, eventually.Every(every))
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("helmrelease: waiting for %s: %w", what, err)
	}
	if !ok {
		return fmt.Errorf("helmrelease: waited %s for %s: %w", within, what, ErrTimeout)
	}
	return nil
}

func since(t time.Time) time.Duration { return time.Since(t).Round(100 * time.Millisecond) }

package kubetest

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// harness is the cluster of the running test binary. It is the package's
// one piece of mutable state: TestMain sets it once, before any test runs,
// and clears it after the last; the testing package offers no other way to
// hand a value from TestMain to the tests.
var harness atomic.Pointer[Cluster]

// Main is a TestMain: it starts the test binary's cluster (building the
// binaries first when they are not cached, with progress on stderr), runs
// the tests, stops the cluster, and exits with the tests' code. If the
// cluster cannot be built or started, the tests do not run and the binary
// fails, saying why: the kube tests are never skipped in silence.
//
//	func TestMain(m *testing.M) { kubetest.Main(m) }
func Main(m *testing.M) {
	os.Exit(Run(m))
}

// Run is Main without the exit, for a TestMain that has set-up or clean-up
// of its own: it returns the tests' exit code.
func Run(m *testing.M) int {
	return RunWith(m, Options{})
}

// RunWith is Run with options (for example, a package that needs no
// controller manager).
func RunWith(m *testing.M, opts Options) int {
	return RunWithin(m, opts, (*testing.M).Run)
}

// RunWithin is RunWith whose tests are run by inner instead of m.Run: for
// a package that needs another harness around its tests too (pgtest.Run,
// for a board), with Current answering inside it.
func RunWithin(m *testing.M, opts Options, inner func(*testing.M) int) int {
	c, err := Start(context.Background(), opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubetest: the test cluster did not start, so these tests cannot run:\n%v\n", err)
		return 1
	}
	defer func() {
		harness.Store(nil)
		if err := c.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	harness.Store(c)
	return inner(m)
}

// Current returns the test binary's cluster. It fails t when the package's
// TestMain does not call Main.
func Current(t testing.TB) *Cluster {
	t.Helper()
	c := harness.Load()
	if c == nil {
		t.Fatal("kubetest: no cluster: the package's TestMain must call kubetest.Main(m)")
	}
	return c
}

// Client returns an admin clientset (a convenience for tests).
func (c *Cluster) Client(t testing.TB) kubernetes.Interface {
	t.Helper()
	return c.ClientFor(t, Admin)
}

// ClientFor returns a clientset for user (see ConfigFor).
func (c *Cluster) ClientFor(t testing.TB, user string) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(c.ConfigFor(user))
	if err != nil {
		t.Fatalf("kubetest: clientset for %s: %v", user, err)
	}
	return cs
}

var nonName = regexp.MustCompile(`[^a-z0-9]+`)

// NewNamespace creates a namespace for t alone, named after the test, and
// deletes it when the test ends (with the controller manager running, its
// pods go with it).
func (c *Cluster) NewNamespace(t testing.TB) string {
	t.Helper()
	name := strings.Trim(nonName.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(name) > 48 {
		name = strings.TrimRight(name[:48], "-")
	}
	name = fmt.Sprintf("%s-%d", name, c.seq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs := c.Client(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubetest": "true"}}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("kubetest: create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := cs.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("kubetest: delete namespace %s: %v", name, err)
		}
	})
	return name
}

// AddNode creates a node that KWOK manages, waits until it is Ready, and
// deletes it when the test ends (unless the test did). Node names are
// cluster-wide: an empty name is replaced by a unique one.
func (c *Cluster) AddNode(t testing.TB, name string) *corev1.Node {
	t.Helper()
	if name == "" {
		name = fmt.Sprintf("kwok-node-%d", c.seq.Add(1))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	node, err := c.CreateNode(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := c.Client(t).CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("kubetest: delete node %s: %v", name, err)
		}
	})
	return node
}

// CreateNode creates a node that KWOK manages and waits until it is Ready.
func (c *Cluster) CreateNode(ctx context.Context, name string) (*corev1.Node, error) {
	cs, err := kubernetes.NewForConfig(c.AdminConfig())
	if err != nil {
		return nil, fmt.Errorf("kubetest: clientset: %w", err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:        name,
		Annotations: map[string]string{NodeAnnotation: "fake"},
		Labels: map[string]string{
			"kubernetes.io/hostname": name,
			"kubernetes.io/os":       "linux",
			"kubernetes.io/arch":     "amd64",
			"type":                   "kwok",
		},
	}}
	if c.inCluster {
		// The scheduler places workloads on the real node only: a pod
		// on a KWOK node runs nothing. A test that names a KWOK node in
		// spec.nodeName passes by the scheduler and its taints.
		node.Spec.Taints = []corev1.Taint{{Key: NodeAnnotation, Value: "fake", Effect: corev1.TaintEffectNoSchedule}}
	}
	created, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubetest: create node %s: %w", name, err)
	}
	ready, err := waitNode(ctx, cs, created)
	if err != nil {
		return nil, fmt.Errorf("kubetest: node %s did not become Ready (is KWOK running? see its log in %s/logs): %w", name, c.dir, err)
	}
	return ready, nil
}

// waitNode watches node until its Ready condition is True.
func waitNode(ctx context.Context, cs kubernetes.Interface, node *corev1.Node) (*corev1.Node, error) {
	if NodeReady(node) {
		return node, nil
	}
	w, err := cs.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", node.Name).String(),
		ResourceVersion: node.ResourceVersion,
	})
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, fmt.Errorf("watch closed")
			}
			if ev.Type == watch.Error {
				return nil, apierrors.FromObject(ev.Object)
			}
			if n, ok := ev.Object.(*corev1.Node); ok && NodeReady(n) {
				return n, nil
			}
		}
	}
}

// WaitPod reads pod and then watches it until done holds (done is called
// with nil once the pod is deleted), and returns the last state seen. It
// fails when ctx ends, when the pod is deleted and done(nil) does not hold,
// or when the name is taken by another pod (another UID).
func WaitPod(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod, done func(*corev1.Pod) bool) (*corev1.Pod, error) {
	pods := cs.CoreV1().Pods(pod.Namespace)
	cur, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if done(nil) {
			return nil, nil
		}
		return nil, fmt.Errorf("kubetest: pod %s/%s is gone", pod.Namespace, pod.Name)
	case err != nil:
		return nil, fmt.Errorf("kubetest: read pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if pod.UID != "" && cur.UID != pod.UID {
		return cur, fmt.Errorf("kubetest: pod %s/%s was replaced by another of the same name", pod.Namespace, pod.Name)
	}
	if done(cur) {
		return cur, nil
	}
	w, err := pods.Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", pod.Name).String(),
		ResourceVersion: cur.ResourceVersion,
	})
	if err != nil {
		return cur, fmt.Errorf("kubetest: watch pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return cur, fmt.Errorf("kubetest: wait for pod %s/%s: %w", pod.Namespace, pod.Name, ctx.Err())
		case ev, ok := <-w.ResultChan():
			if !ok {
				return cur, fmt.Errorf("kubetest: the watch of pod %s/%s closed", pod.Namespace, pod.Name)
			}
			switch ev.Type {
			case watch.Error:
				return cur, fmt.Errorf("kubetest: watch pod %s/%s: %w", pod.Namespace, pod.Name, apierrors.FromObject(ev.Object))
			case watch.Deleted:
				if done(nil) {
					return nil, nil
				}
				return cur, fmt.Errorf("kubetest: pod %s/%s was deleted", pod.Namespace, pod.Name)
			case watch.Added, watch.Modified:
				if p, ok := ev.Object.(*corev1.Pod); ok {
					cur = p
					if done(cur) {
						return cur, nil
					}
				}
			}
		}
	}
}

// NodeReady reports whether node's Ready condition is True.
func NodeReady(node *corev1.Node) bool {
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// CreateServiceAccount creates the ServiceAccount name in namespace ns (an
// existing one is left as it is). The API server's ServiceAccount
// admission is off, so a pod naming a ServiceAccount that does not exist
// is still admitted; but a projected token of it cannot be made: the kube
// runner's pods run as its task ServiceAccount, which whatever runs them
// here (a test, the demo, the suites) creates first, as the chart does.
func CreateServiceAccount(ctx context.Context, cs kubernetes.Interface, ns, name string) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("kubetest: create ServiceAccount %s/%s: %w", ns, name, err)
	}
	return nil
}

package kubetest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dexaflow/reaper/testkit/kubetest"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

func TestClusterServesItsPinnedVersion(t *testing.T) {
	t.Parallel()
	c := kubetest.Current(t)
	v, err := c.Client(t).Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != kubetest.KubernetesVersion {
		t.Fatalf("server version %q, want %q", v.GitVersion, kubetest.KubernetesVersion)
	}
}

func TestKubeconfigFileReachesTheCluster(t *testing.T) {
	t.Parallel()
	c := kubetest.Current(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Get(t.Context(), "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("the admin kubeconfig cannot read namespace default: %v", err)
	}
}

func TestPodOnAKWOKNodeRuns(t *testing.T) {
	t.Parallel()
	c := kubetest.Current(t)
	node := c.AddNode(t, "")
	if !kubetest.NodeReady(node) {
		t.Fatalf("AddNode returned a node that is not Ready: %+v", node.Status.Conditions)
	}
	ns := c.NewNamespace(t)
	cs := c.Client(t)
	pod := createPod(t, cs, ns, "runs", node.Name, nil)
	running := waitPod(t, cs, pod, func(p *corev1.Pod) bool { return p != nil && p.Status.Phase == corev1.PodRunning })
	if running.Status.StartTime == nil || len(running.Status.ContainerStatuses) != 1 ||
		running.Status.ContainerStatuses[0].State.Running == nil {
		t.Fatalf("a running pod without a start time or a running container: %+v", running.Status)
	}
}

func TestDeleteWithAWrongUIDIsAConflict(t *testing.T) {
	t.Parallel()
	c := kubetest.Current(t)
	cs, pod := runningPod(t, c, nil)
	ns := pod.Namespace

	wrong := types.UID("00000000-0000-0000-0000-000000000000")
	err := cs.CoreV1().Pods(ns).Delete(t.Context(), pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &wrong}})
	if !apierrors.IsConflict(err) {
		t.Fatalf("delete with a wrong UID: %v, want a Conflict", err)
	}
	if _, err := cs.CoreV1().Pods(ns).Get(t.Context(), pod.Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("the pod is gone after a refused delete: %v", err)
	}
	uid := pod.UID
	if err := cs.CoreV1().Pods(ns).Delete(t.Context(), pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil {
		t.Fatalf("delete with the right UID: %v", err)
	}
	waitPod(t, cs, pod, func(p *corev1.Pod) bool { return p == nil }) // KWOK finishes the graceful delete
}

func TestLoweredActiveDeadlineFailsTheRunningPod(t *testing.T) {
	t.Parallel()
	c := kubetest.Current(t)
	hour := int64(3600)
	cs, pod := runningPod(t, c, func(p *corev1.Pod) { p.Spec.ActiveDeadlineSeconds = &hour })
	ns := pod.Namespace

	patch := []byte(`{"spec":{"activeDeadlineSeconds":1}}`)
	if _, err := cs.CoreV1().Pods(ns).Patch(t.Context(), pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("lower activeDeadlineSeconds: %v", err)
	}
	failed := waitPod(t, cs, pod, func(p *corev1.Pod) bool { return p != nil && p.Status.Phase == corev1.PodFailed })
	if failed.Status.Reason != "DeadlineExceeded" {
		t.Errorf("reason %q, want DeadlineExceeded", failed.Status.Reason)
	}
	for _, cst := range failed.Status.ContainerStatuses {
		if cst.State.Terminated == nil || cst.State.Terminated.ExitCode != 137 {
			t.Errorf("container %s: %+v, want terminated with exit code 137", cst.Name, cst.State)
		}
	}
	if failed.DeletionTimestamp != nil {
		t.Errorf("a pod stopped by its deadline is being deleted")
	}
}

func TestNonAdminNeedsARole(t *testing.T) {
	t.Parallel()
	c := kubetest.Current(t)
	ns, other := c.NewNamespace(t), c.NewNamespace(t)
	alice := c.ClientFor(t, kubetest.Alice)
	ctx := t.Context()

	if _, err := alice.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("alice lists pods with no role: %v, want Forbidden", err)
	}
	if _, err := alice.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("alice lists secrets with no role: %v, want Forbidden", err)
	}

	admin := c.Client(t)
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}},
	}
	if _, err := admin.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "alice-reads-pods"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: kubetest.Alice}},
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The API server's authorizer learns of a new binding from its own
	// watch: the binding takes effect shortly after its create returns.
	// Forbidden until then is expected; anything else, or Forbidden for
	// longer, is not.
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := alice.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if apierrors.IsForbidden(err) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		t.Fatalf("alice lists pods with the role: %v", err)
	}
	if _, err := alice.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("alice lists secrets with a pods-only role: %v, want Forbidden", err)
	}
	if _, err := alice.CoreV1().Pods(other).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("alice lists pods in a namespace she has no role in: %v, want Forbidden", err)
	}
	if _, err := c.ClientFor(t, kubetest.Bob).CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("bob lists pods through alice's binding: %v, want Forbidden", err)
	}
}

// With the real taint-eviction controller, a NoExecute taint on the node
// evicts a pod that does not tolerate it: DisruptionTarget with
// DeletionByTaintManager, then deleted (KWOK finishes the delete).
func TestNoExecuteTaintEvictsThePod(t *testing.T) {
	t.Parallel()
	c := kubetest.Current(t)
	if !c.HasControllerManager() {
		t.Fatal("the cluster runs without kube-controller-manager")
	}
	cs, pod := runningPod(t, c, nil)

	patch := []byte(`{"spec":{"taints":[{"key":"reaper.test/gone","effect":"NoExecute"}]}}`)
	if _, err := cs.CoreV1().Nodes().Patch(t.Context(), pod.Spec.NodeName, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("taint the node: %v", err)
	}
	var reason string
	waitPod(t, cs, pod, func(p *corev1.Pod) bool {
		if p != nil {
			reason = disruption(p)
		}
		return p == nil
	})
	if reason != "DeletionByTaintManager" {
		t.Fatalf("the evicted pod's DisruptionTarget reason was %q, want DeletionByTaintManager", reason)
	}
}

// With the real Pod GC, a pod bound to a node that is deleted is marked
// DisruptionTarget/DeletionByPodGC and deleted once the node has been gone
// for Pod GC's quarantine (40s, checked every 20s: this test takes about a
// minute).
func TestPodOfADeletedNodeIsGarbageCollected(t *testing.T) {
	t.Parallel()
	c := kubetest.Current(t)
	if !c.HasControllerManager() {
		t.Fatal("the cluster runs without kube-controller-manager")
	}
	cs, pod := runningPod(t, c, nil)

	if err := cs.CoreV1().Nodes().Delete(t.Context(), pod.Spec.NodeName, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete the node: %v", err)
	}
	var reason string
	var phase corev1.PodPhase
	waitPodWithin(t, cs, pod, 3*time.Minute, func(p *corev1.Pod) bool {
		if p != nil {
			reason, phase = disruption(p), p.Status.Phase
		}
		return p == nil
	})
	if reason != "DeletionByPodGC" || phase != corev1.PodFailed {
		t.Fatalf("the collected pod was %s with DisruptionTarget reason %q, want Failed and DeletionByPodGC", phase, reason)
	}
}

// A detached cluster (make kube-up) is stopped by StopDir (make kube-down):
// every program gone, the directory removed.
func TestStopDirStopsADetachedCluster(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "cluster")
	c, err := kubetest.Start(t.Context(), kubetest.Options{Dir: dir, Detached: true, NoControllerManager: true})
	if err != nil {
		t.Fatal(err)
	}
	pidFiles, err := filepath.Glob(filepath.Join(dir, "pids", "*"))
	if err != nil || len(pidFiles) != 3 {
		t.Fatalf("pid files %v (%v), want etcd, kube-apiserver and kwok", pidFiles, err)
	}
	var pids []int
	for _, f := range pidFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(string(b))
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	if _, err := c.Client(t).CoreV1().Namespaces().Get(t.Context(), "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("the detached cluster does not answer: %v", err)
	}
	if err := kubetest.StopDir(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the cluster's directory is still there: %v", err)
	}
	for _, pid := range pids {
		// This process is their parent: a stopped one is at most a zombie
		// until its waiter reaps it.
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && len(b) > 0 {
			t.Errorf("process %d (%s) still runs", pid, b)
		}
	}
	_ = c.Stop() // releases nothing left: the processes are gone
}

// runningPod makes a node, a namespace and a pod bound to the node, edited
// by edit, and waits until KWOK runs it.
func runningPod(t *testing.T, c *kubetest.Cluster, edit func(*corev1.Pod)) (kubernetes.Interface, *corev1.Pod) {
	t.Helper()
	node := c.AddNode(t, "")
	cs := c.Client(t)
	pod := createPod(t, cs, c.NewNamespace(t), "task", node.Name, edit)
	waitPod(t, cs, pod, func(p *corev1.Pod) bool { return p != nil && p.Status.Phase == corev1.PodRunning })
	return cs, pod
}

func createPod(t *testing.T, cs kubernetes.Interface, ns, name, node string, edit func(*corev1.Pod)) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "kubetest"}},
		Spec: corev1.PodSpec{
			NodeName:      node,
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "main", Image: "example.invalid/task:1"}},
		},
	}
	if edit != nil {
		edit(pod)
	}
	created, err := cs.CoreV1().Pods(ns).Create(t.Context(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s/%s: %v", ns, name, err)
	}
	return created
}

func waitPod(t *testing.T, cs kubernetes.Interface, pod *corev1.Pod, done func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	return waitPodWithin(t, cs, pod, 30*time.Second, done)
}

// waitPodWithin watches pod until done holds for it (nil once deleted), or
// fails t after timeout.
func waitPodWithin(t *testing.T, cs kubernetes.Interface, pod *corev1.Pod, timeout time.Duration, done func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	last, err := kubetest.WaitPod(ctx, cs, pod, done)
	if err != nil {
		t.Fatalf("pod %s/%s: %v; last seen: %s", pod.Namespace, pod.Name, err, describe(last))
	}
	return last
}

func disruption(p *corev1.Pod) string {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.DisruptionTarget && cond.Status == corev1.ConditionTrue {
			return cond.Reason
		}
	}
	return ""
}

func describe(p *corev1.Pod) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprintf("phase=%s reason=%q deleting=%v conditions=%+v", p.Status.Phase, p.Status.Reason, p.DeletionTimestamp != nil, p.Status.Conditions)
}

package helm_test

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// releaseLine is the shell line docs/operate.md gives for releasing the
// outcome record finalizers after an uninstall.
func releaseLine(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../docs/operate.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), "### Uninstall")
	if !ok {
		t.Fatal("docs/operate.md has no Uninstall section")
	}
	for _, line := range strings.Split(after, "\n") {
		if strings.HasPrefix(line, "NS=") {
			return line
		}
	}
	t.Fatal("the Uninstall section has no NS=... line")
	return ""
}

// TestUninstallLineReleasesOnlyTheOutcomeRecordFinalizer runs the
// documented line with kubectl against the API server: a task pod deleted
// while no reaperd runs is held Terminating by the finalizer; the line
// removes that finalizer and leaves another controller's.
func TestUninstallLineReleasesOnlyTheOutcomeRecordFinalizer(t *testing.T) {
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("no kubectl on PATH: the documented line cannot be run here")
	}
	c := kubetest.Current(t)
	cs := c.Client(t)
	ns := c.NewNamespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const other = "other.example/keep"
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "task-1", Labels: map[string]string{kube.LabelRunID: "run-1"},
			Finalizers: []string{other, kube.FinalizerOutcomeRecord}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: kube.TaskContainer, Image: "agent"}}},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, err := cs.CoreV1().Pods(ns).Patch(context.Background(), p.Name, types.MergePatchType,
			[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("releasing the test pod: %v", err)
		}
	})
	if err := cs.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	line := strings.Replace(releaseLine(t), "NS=reaper-system-tasks", "NS="+ns, 1)
	cmd := exec.CommandContext(ctx, "bash", "-c", line)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the documented line: %v\n%s", err, out)
	}
	got, err := cs.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the pod: %v (another controller's finalizer should still hold it)", err)
	}
	if !slices.Equal(got.Finalizers, []string{other}) {
		t.Fatalf("finalizers %q after the line, want only %q", got.Finalizers, other)
	}
}

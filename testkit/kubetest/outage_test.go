package kubetest_test

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/dexaflow/reaper/testkit/kubetest"
)

// A paused API server leaves its clients waiting until their timeout; a
// resumed one answers again. A stopped one refuses connections at once; a
// started one answers again with the state etcd kept. The outages run on a
// cluster of the test's own, so the package's shared one is never blind.
func TestAPIServerOutagesTimeOutOrRefuseThenRecover(t *testing.T) {
	t.Parallel()
	c, err := kubetest.Start(t.Context(), kubetest.Options{Dir: filepath.Join(t.TempDir(), "cluster"), NoControllerManager: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	cfg := c.AdminConfig()
	cfg.Timeout = 2 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kept"}}
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create a namespace: %v", err)
	}
	get := func() error {
		_, err := cs.CoreV1().Namespaces().Get(t.Context(), "kept", metav1.GetOptions{})
		return err
	}

	if err := c.PauseAPIServer(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = get()
	if err == nil {
		t.Fatal("a paused API server answered")
	}
	if took := time.Since(start); took < cfg.Timeout {
		t.Errorf("the request to a paused API server failed after %v (%v), before its %v timeout", took, err, cfg.Timeout)
	}
	if err := c.ResumeAPIServer(); err != nil {
		t.Fatal(err)
	}
	if err := get(); err != nil {
		t.Fatalf("the resumed API server does not answer: %v", err)
	}

	if err := c.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	err = get()
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("a stopped API server gave %v, want connection refused", err)
	}
	if took := time.Since(start); took >= cfg.Timeout {
		t.Errorf("the refusal took %v, as long as a timeout", took)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	if err := get(); err != nil {
		t.Fatalf("the restarted API server does not serve what etcd kept: %v", err)
	}
}

// After an outage across which etcd was compacted, a watch cannot resume
// from a revision before the compaction: the restarted API server answers
// it expired (410), so a client must list again.
func TestCompactionAcrossAnOutageExpiresAResumedWatch(t *testing.T) {
	t.Parallel()
	c, err := kubetest.Start(t.Context(), kubetest.Options{Dir: filepath.Join(t.TempDir(), "cluster"), NoControllerManager: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	cs := c.Client(t)
	ns, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "watched"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "later"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	rev, err := c.CompactEtcd(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if old, _ := strconv.ParseInt(ns.ResourceVersion, 10, 64); rev <= old {
		t.Fatalf("compacted at revision %d, not past the watched one %d", rev, old)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	w, err := cs.CoreV1().Namespaces().Watch(ctx, metav1.ListOptions{ResourceVersion: ns.ResourceVersion})
	if err == nil {
		defer w.Stop()
		select {
		case ev := <-w.ResultChan():
			if ev.Type == watch.Error {
				err = apierrors.FromObject(ev.Object)
			} else {
				t.Fatalf("the watch resumed from revision %s across the compaction: %s %T", ns.ResourceVersion, ev.Type, ev.Object)
			}
		case <-ctx.Done():
			t.Fatal("the resumed watch said nothing")
		}
	}
	if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
		t.Fatalf("resuming the watch from before the compaction gave %v, want expired (410)", err)
	}
}

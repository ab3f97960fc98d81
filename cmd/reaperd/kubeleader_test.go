package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/testkit/eventually"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// kubeOnce starts the API server of the kubernetes-leader tests on first
// use (the other tests of the package need none), and TestMain stops it.
type kubeOnce struct {
	once sync.Once
	c    *kubetest.Cluster
	err  error
}

func (k *kubeOnce) get(t *testing.T) *kubetest.Cluster {
	t.Helper()
	k.once.Do(func() {
		k.c, k.err = kubetest.Start(context.Background(), kubetest.Options{NoControllerManager: true})
	})
	if k.err != nil {
		t.Fatalf("the test cluster did not start: %v", k.err)
	}
	return k.c
}

func (k *kubeOnce) stop() {
	if k.c != nil {
		if err := k.c.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
}

// kubeLeaderConfig is writeConfig with leader "kubernetes" (a 2s lease) in
// place of the postgres leader.
func kubeLeaderConfig(t *testing.T, dsn, kubeconfig, ns, reapers string) string {
	t.Helper()
	path := writeConfig(t, dsn, reapers)
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pg := "leader \"postgres\" {\n  lease = \"1s\"\n}\n"
	kube := fmt.Sprintf("leader \"kubernetes\" {\n  namespace = %q\n  name = \"reaperd\"\n  kubeconfig = %q\n  lease = %q\n}\n",
		ns, kubeconfig, kubeLease)
	if !strings.Contains(string(src), pg) {
		t.Fatalf("the test configuration has no postgres leader block to replace:\n%s", src)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(src), pg, kube, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// kubeLease is the lease of the kubernetes-leader tests: whole seconds, as
// a Kubernetes Lease counts them.
const kubeLease = 2 * time.Second

// leaseHolder reads the Kubernetes Lease's holder ("" when released or
// absent).
func leaseHolder(t *testing.T, c *kubetest.Cluster, ns string) string {
	t.Helper()
	l, err := c.Client(t).CoordinationV1().Leases(ns).Get(context.Background(), "reaperd", metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// Two reaperd processes with leader "kubernetes" on one real API server and
// one board: one leads (holding the Lease and the board's term); kill -9
// it and the other takes the Lease over once it has run out, takes the next
// term from the board, waits its own settling grace, and the killed
// leader's term is fenced. A clean stop then releases the Lease at once.
func TestKubernetesLeaseTakeoverAfterKill9(t *testing.T) {
	c := cluster.get(t)
	ns := c.NewNamespace(t)
	store, w, dsn := migratedStore(t)
	a := runningSilentAttempt(t, w, "alive-run")
	cfg := kubeLeaderConfig(t, dsn, c.Kubeconfig(), ns, "reaper \"echo\" {}\n")
	ctx := context.Background()

	first := startDaemon(t, cfg)
	var lease board.Lease
	eventually.True(t, 30*time.Second, "the first replica to hold the Lease and the board's term", func() bool {
		l, ok, err := store.CurrentLeader(ctx)
		lease = l
		return err == nil && ok && first.holds(l.Holder) && first.holds(leaseHolder(t, c, ns))
	})
	firstTerm := lease.Term
	second := startDaemon(t, cfg)
	eventually.True(t, 20*time.Second, "the leader's reaper to run", func() bool {
		for _, r := range decisions(t, store, a) {
			if r.Reaper == "echo" && r.Term == firstTerm {
				return true
			}
		}
		return false
	})
	if h := leaseHolder(t, c, ns); !first.holds(h) {
		t.Fatalf("the Lease moved to %q while its leader lived", h)
	}

	first.cmd.Process.Signal(syscall.SIGKILL)
	<-first.done
	killedAt := time.Now()
	eventually.True(t, 30*time.Second, "the second replica to take the Lease and the next term", func() bool {
		l, ok, err := store.CurrentLeader(ctx)
		lease = l
		return err == nil && ok && second.holds(l.Holder) && second.holds(leaseHolder(t, c, ns))
	})
	took := time.Since(killedAt)
	t.Logf("takeover %v after kill -9 (lease %s, renewal every %s; under load)", took, kubeLease, kubeLease/3)
	if lease.Term != firstTerm+1 {
		t.Fatalf("new term %d, want %d", lease.Term, firstTerm+1)
	}
	// The Lease runs out at most a lease and a renewal after the last
	// renewal this replica saw; the bound leaves room for a loaded machine.
	if took > kubeLease+2*(kubeLease/3)+5*time.Second {
		t.Fatalf("takeover took %v", took)
	}
	gateResetAndOldTermFenced(t, store, a, firstTerm, lease, time.Second)

	second.stopCleanly(t)
	if h := leaseHolder(t, c, ns); h != "" {
		t.Fatalf("the Lease is still held by %q after a clean stop", h)
	}
	if l, _, err := store.CurrentLeader(ctx); err != nil || l.Holder != "" {
		t.Fatalf("the board's row after a clean stop: %+v, %v", l, err)
	}
}

package kubelease_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/host/leader/kubelease"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// cluster is the test binary's Kubernetes control plane. TestMain sets it
// once before the tests and clears it after (kubetest's own harness is
// taken by pgtest.Run, which runs the tests).
var cluster atomic.Pointer[kubetest.Cluster]

// helperEnv makes the test binary a replica that leads until it is killed.
const helperEnv = "KUBELEASE_TEST_REPLICA"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(replica())
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	c, err := kubetest.Start(context.Background(), kubetest.Options{NoControllerManager: true})
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubelease: the test cluster did not start: %v\n", err)
		return 1
	}
	defer func() {
		cluster.Store(nil)
		if err := c.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	cluster.Store(c)
	return pgtest.Run(m)
}

// boardLease adapts the board's lease row to leader.Lease.
type boardLease struct{ store *board.Store }

func (l boardLease) TryAcquire(ctx context.Context, holder string, ttl time.Duration, now time.Time) (int64, bool, error) {
	lease, ok, err := l.store.TryAcquire(ctx, holder, ttl, now)
	return lease.Term, ok, err
}

func (l boardLease) Renew(ctx context.Context, term int64, holder string, ttl time.Duration, now time.Time) (bool, error) {
	_, ok, err := l.store.Renew(ctx, term, holder, ttl, now)
	return ok, err
}

func (l boardLease) Resign(ctx context.Context, term int64, holder string) error {
	_, err := l.store.Resign(ctx, term, holder)
	return err
}

const (
	leaseTTL   = 4 * time.Second
	renewEvery = time.Second
)

// elector builds a replica's elector over the Kubernetes Lease ns/name and
// the board at dsn.
func elector(ctx context.Context, cs kubernetes.Interface, pool *pgxpool.Pool, ns, holder string, clk clock.Clock) (*leader.Elector, error) {
	return electorOn(cs, board.New(pool, board.Options{}), ns, holder, clk)
}

// electorOn is elector over the board store.
func electorOn(cs kubernetes.Interface, store *board.Store, ns, holder string, clk clock.Clock) (*leader.Elector, error) {
	return electorWithMargin(cs, store, ns, holder, clk, 0)
}

// electorWithMargin is electorOn whose local trust is margin short of the
// lease (0: the default).
func electorWithMargin(cs kubernetes.Interface, store *board.Store, ns, holder string, clk clock.Clock, margin time.Duration) (*leader.Elector, error) {
	l, err := kubelease.New(kubelease.Config{Namespace: ns, Name: "reaperd", Client: cs}, boardLease{store})
	if err != nil {
		return nil, err
	}
	return leader.New(l, leader.Config{Holder: holder, Lease: leaseTTL, RenewEvery: renewEvery, Margin: margin,
		Clock: clk, Logger: hclog.NewNullLogger()})
}

// replica is the helper process: it leads through the Lease named by its
// environment, prints "leading <term>" once, and runs until it is killed.
func replica() int {
	ctx := context.Background()
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	pool, err := pgxpool.New(ctx, os.Getenv("REAPER_DSN"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	e, err := elector(ctx, cs, pool, os.Getenv("LEASE_NAMESPACE"), os.Getenv(helperEnv), clock.Real{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	said := false
	// The replica's own renewal cadence, as the daemon's loop has it.
	renew := time.NewTicker(renewEvery)
	defer renew.Stop()
	for {
		st := e.Step(ctx)
		if st.Leading && !said {
			fmt.Printf("leading %d\n", st.Term)
			said = true
		}
		<-renew.C
	}
}

func TestTakeoverAfterKill9(t *testing.T) {
	c := cluster.Load()
	ctx := context.Background()
	ns := c.NewNamespace(t)
	pool := pgtest.NewDB(t)
	w := lifecycle.New(pool, lifecycle.Options{})

	// Replica A: another process, leading through the Lease.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+kubelease.Identity(), "KUBECONFIG="+c.Kubeconfig(),
		"REAPER_DSN="+pgtest.DSN(pool), "LEASE_NAMESPACE="+ns)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("replica A never led: %v", err)
	}
	oldTerm, err := strconv.ParseInt(strings.TrimSpace(strings.TrimPrefix(line, "leading ")), 10, 64)
	if err != nil {
		t.Fatalf("replica A said %q", line)
	}

	// Replica B: this process, on a fake clock that starts now.
	clk := clock.NewFake(time.Now())
	b, err := elector(ctx, c.Client(t), pool, ns, kubelease.Identity(), clk)
	if err != nil {
		t.Fatal(err)
	}
	if st := b.Step(ctx); st.Leading {
		t.Fatalf("B leads while A holds the Lease: %+v", st)
	}

	// kill -9: A neither renews nor releases.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	clk.Set(time.Now()) // the fake clock never lags A's last real renewal
	killed := clk.Now()
	var st leader.Status
	for st = b.Step(ctx); !st.Leading; st = b.Step(ctx) {
		if clk.Now().Sub(killed) > leaseTTL+2*renewEvery {
			t.Fatalf("B did not take over within the lease (%s) and a renewal: %+v, %v", leaseTTL, st, b.LastError())
		}
		clk.Advance(renewEvery)
	}
	took := clk.Now().Sub(killed)
	t.Logf("B took over %s (fake clock) after A was killed; lease %s", took, leaseTTL)
	if st.Term <= oldTerm {
		t.Fatalf("B's term %d does not follow A's %d", st.Term, oldTerm)
	}
	if !st.Since.Equal(clk.Now()) {
		t.Fatalf("the gate counts from %s, want the takeover at %s", st.Since, clk.Now())
	}
	lease, err := c.Client(t).CoordinationV1().Leases(ns).Get(ctx, "reaperd", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		t.Fatalf("the Lease after the takeover: %+v, %v", lease, err)
	}

	// A's writes are fenced: a mark under its term changes nothing, B's
	// applies.
	a := sdk.Attempt{RunID: "run-1", TaskID: "extract", Try: 1}
	if err := w.CreateRun(ctx, lifecycle.NewRun{RunID: a.RunID, DagID: "dag",
		Tasks: []lifecycle.NewTask{{TaskID: a.TaskID, Executor: sdk.ExecutorKube}}}, clk.Now()); err != nil {
		t.Fatal(err)
	}
	for _, step := range []func(context.Context, sdk.Attempt, time.Time) (bool, error){w.Enqueue, w.Queue} {
		if ok, err := step(ctx, a, clk.Now()); err != nil || !ok {
			t.Fatalf("driving %s to queued: %v, %v", a, ok, err)
		}
	}
	store := board.New(pool, board.Options{})
	mark := func(term int64) sdk.MarkResult {
		res, err := store.Mark(ctx, []sdk.Mark{{Attempt: a, FromStates: []string{sdk.StateQueued}, Kind: sdk.MarkInfra,
			Reason: sdk.LabelDispatchLost, Message: "dispatch_lost: test", Term: term, At: clk.Now()}})
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	if r := mark(oldTerm); r.Applied || r.NoopReason != sdk.NoopDeposed {
		t.Fatalf("a mark under A's term %d: %+v, want a deposed no-op", oldTerm, r)
	}
	if r := mark(st.Term); !r.Applied {
		t.Fatalf("a mark under B's term %d: %+v, want applied", st.Term, r)
	}

	// B resigns: the Lease is released for the next replica at once.
	b.Resign()
	lease, err = c.Client(t).CoordinationV1().Leases(ns).Get(ctx, "reaperd", metav1.GetOptions{})
	if err != nil || (lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "") {
		t.Fatalf("the Lease after B resigned: %+v, %v", lease.Spec, err)
	}
}

package kubelease_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/testkit/netfault"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// throughProxy returns a store on pool's database reached through a
// netfault proxy (each call bounded by timeout, real time: a cut call
// hangs until then), and the proxy.
func throughProxy(t *testing.T, pool *pgxpool.Pool, timeout time.Duration) (*board.Store, *netfault.Proxy) {
	t.Helper()
	server := net.JoinHostPort("127.0.0.1", strconv.Itoa(pgtest.Current(t).Port()))
	proxy, err := netfault.Listen(server)
	if err != nil {
		t.Fatal(err)
	}
	dsn := pgtest.DSN(pool)
	if !strings.Contains(dsn, server) {
		_ = proxy.Close()
		t.Fatalf("the DSN %q does not name the server at %s", dsn, server)
	}
	p, err := pgxpool.New(context.Background(), strings.Replace(dsn, server, proxy.Addr(), 1))
	if err != nil {
		_ = proxy.Close()
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	// Cleanups run last registered first: the proxy closes (its
	// connections with it, cut or not) before the pool does.
	t.Cleanup(func() { _ = proxy.Close() })
	return board.New(p, board.Options{QueryTimeout: timeout}), proxy
}

// sameTime reports whether a time the Lease stores (to the microsecond) is
// b.
func sameTime(stored, b time.Time) bool {
	return stored.Sub(b).Abs() < time.Microsecond
}

// holderOf reads the Kubernetes Lease's holder ("" when released).
func holderOf(t *testing.T, ns string) string {
	t.Helper()
	h, _ := leaseOf(t, ns)
	return h
}

// leaseOf reads the Kubernetes Lease's holder ("" when released) and when
// it was last renewed.
func leaseOf(t *testing.T, ns string) (string, time.Time) {
	t.Helper()
	l, err := cluster.Load().Client(t).CoordinationV1().Leases(ns).Get(context.Background(), "reaperd", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var renewed time.Time
	if l.Spec.RenewTime != nil {
		renewed = l.Spec.RenewTime.Time
	}
	if l.Spec.HolderIdentity == nil {
		return "", renewed
	}
	return *l.Spec.HolderIdentity, renewed
}

// The leader is cut off from PostgreSQL (its packets held, its board calls
// hanging) but not from the API server. It stops leading on its own clock
// and renews the Kubernetes Lease no more once a renewal found the board
// silent; once the board has been silent for a lease it releases the Lease, and the replica that reaches both takes it
// and its term. The cut replica leads nothing meanwhile, does not take the
// Lease back while cut, and after the heal stands by, its late writes
// refused by the fence.
func TestLeaderCutFromTheBoardGivesUpTheLease(t *testing.T) {
	c := cluster.Load()
	ctx := context.Background()
	ns := c.NewNamespace(t)
	pool := pgtest.NewDB(t)
	cutStore, proxy := throughProxy(t, pool, 300*time.Millisecond)
	clk := clock.NewFake(time.Now())
	a, err := electorOn(c.Client(t), cutStore, ns, "a", clk)
	if err != nil {
		t.Fatal(err)
	}
	b, err := electorOn(c.Client(t), board.New(pool, board.Options{}), ns, "b", clk)
	if err != nil {
		t.Fatal(err)
	}
	before := a.Step(ctx)
	if !before.Leading {
		t.Fatalf("a does not lead: %v", a.LastError())
	}
	if st := b.Step(ctx); st.Leading {
		t.Fatalf("b leads while a holds the Lease: %+v", st)
	}

	proxy.Cut()
	cutAt := clk.Now()
	bound := leaseTTL + 2*renewEvery
	var sb leader.Status
	for {
		clk.Advance(renewEvery)
		sa := a.Step(ctx)
		sb = b.Step(ctx)
		if sa.Leading && !clk.Now().Before(cutAt.Add(leaseTTL)) {
			t.Fatalf("a still leads %s after the cut, past its lease: %+v", clk.Now().Sub(cutAt), sa)
		}
		if sa.Leading && sb.Leading {
			t.Fatalf("both lead at %s after the cut: a %+v, b %+v", clk.Now().Sub(cutAt), sa, sb)
		}
		if h, renewed := leaseOf(t, ns); h == "a" && renewed.After(cutAt.Add(renewEvery)) {
			t.Fatalf("a renewed the Lease %s after the cut, its board silent since: only the renewal that found the board silent may", renewed.Sub(cutAt))
		}
		if sb.Leading {
			break
		}
		if clk.Now().Sub(cutAt) > bound {
			t.Fatalf("b did not take over within %s of the cut (the Lease held by %q): a's last error %v; b's %v",
				bound, holderOf(t, ns), a.LastError(), b.LastError())
		}
	}
	took := clk.Now().Sub(cutAt)
	t.Logf("b took over %s (fake clock) after a was cut from the board; lease %s; a said: %v", took, leaseTTL, a.LastError())
	if sb.Term <= before.Term {
		t.Fatalf("b's term %d does not follow a's %d", sb.Term, before.Term)
	}
	if h := holderOf(t, ns); h != "b" {
		t.Fatalf("the Lease is held by %q after the takeover, want b", h)
	}

	// Still cut, a does not take the Lease back (b renews it), and leads
	// nothing; after the heal it stands by.
	steps := func(what string, n int) {
		for range n {
			clk.Advance(renewEvery)
			if st := a.Step(ctx); st.Leading {
				t.Fatalf("%s, a leads again: %+v", what, st)
			}
			if st := b.Step(ctx); !st.Leading || st.Term != sb.Term {
				t.Fatalf("%s, b's leadership moved: %+v (%v)", what, st, b.LastError())
			}
		}
	}
	steps("while cut", 2*int(leaseTTL/renewEvery))
	proxy.Heal()
	steps("after the heal", 2*int(leaseTTL/renewEvery))
	if h := holderOf(t, ns); h != "b" {
		t.Fatalf("the Lease is held by %q after the heal, want b", h)
	}

	// A late write of a's term, through its healed path, is refused by the
	// fence; b's applies.
	at := sdk.Attempt{RunID: "run-1", TaskID: "extract", Try: 1}
	w := lifecycle.New(pool, lifecycle.Options{})
	if err := w.CreateRun(ctx, lifecycle.NewRun{RunID: at.RunID, DagID: "dag",
		Tasks: []lifecycle.NewTask{{TaskID: at.TaskID, Executor: sdk.ExecutorKube}}}, clk.Now()); err != nil {
		t.Fatal(err)
	}
	for _, step := range []func(context.Context, sdk.Attempt, time.Time) (bool, error){w.Enqueue, w.Queue} {
		if ok, err := step(ctx, at, clk.Now()); err != nil || !ok {
			t.Fatalf("driving %s to queued: %v, %v", at, ok, err)
		}
	}
	mark := func(store *board.Store, term int64) sdk.MarkResult {
		res, err := store.Mark(ctx, []sdk.Mark{{Attempt: at, FromStates: []string{sdk.StateQueued}, Kind: sdk.MarkInfra,
			Reason: sdk.LabelDispatchLost, Message: "dispatch_lost: test", Term: term, At: clk.Now()}})
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	if r := mark(cutStore, before.Term); r.Applied || r.NoopReason != sdk.NoopDeposed {
		t.Fatalf("a late mark under a's term %d: %+v, want a deposed no-op", before.Term, r)
	}
	if r := mark(board.New(pool, board.Options{}), sb.Term); !r.Applied {
		t.Fatalf("a mark under b's term %d: %+v, want applied", sb.Term, r)
	}
}

// A board that answers slowly (each call held a while, but answered within
// the step) is not silent, and one whose answers come only every other
// step keeps the leader too while the gaps stay shorter than its lease: the
// leader keeps the Lease and its term, and the other replica never takes
// over.
func TestSlowOrFlappingBoardKeepsTheLease(t *testing.T) {
	c := cluster.Load()
	ctx := context.Background()
	ns := c.NewNamespace(t)
	pool := pgtest.NewDB(t)
	store, proxy := throughProxy(t, pool, 500*time.Millisecond)
	clk := clock.NewFake(time.Now())
	a, err := electorOn(c.Client(t), store, ns, "a", clk)
	if err != nil {
		t.Fatal(err)
	}
	b, err := electorOn(c.Client(t), board.New(pool, board.Options{}), ns, "b", clk)
	if err != nil {
		t.Fatal(err)
	}
	first := a.Step(ctx)
	if !first.Leading {
		t.Fatalf("a does not lead: %v", a.LastError())
	}
	n := 3 * int(leaseTTL/renewEvery)
	for i := range n {
		clk.Advance(renewEvery)
		proxy.Cut()
		switch {
		case i < n/2: // slow: held 100ms, then answered
			timer := time.AfterFunc(100*time.Millisecond, proxy.Heal)
			sa := a.Step(ctx)
			timer.Stop()
			proxy.Heal()
			if !sa.Leading || sa.Term != first.Term || a.LastError() != nil {
				t.Fatalf("step %d: a slow board deposed a: %+v (%v)", i, sa, a.LastError())
			}
		case i%2 == 0: // flapping: this step unanswered
			if sa := a.Step(ctx); !sa.Leading || sa.Term != first.Term {
				t.Fatalf("step %d: one unanswered renewal deposed a: %+v (%v)", i, sa, a.LastError())
			}
			proxy.Heal()
		default:
			proxy.Heal()
			if sa := a.Step(ctx); !sa.Leading || sa.Term != first.Term || a.LastError() != nil {
				t.Fatalf("step %d: a does not lead after an answered renewal: %+v (%v)", i, sa, a.LastError())
			}
		}
		if sb := b.Step(ctx); sb.Leading {
			t.Fatalf("step %d: b took over from a leader whose board answers: %+v", i, sb)
		}
	}
	if h := holderOf(t, ns); h != "a" {
		t.Fatalf("the Lease is held by %q, want a", h)
	}
}

// A replica alone, cut off from the board: it gives the Lease up once the
// board has been silent for a lease, leaves it free for one lease more,
// then takes it again (nobody else wants it) and gives it up again while
// the board stays silent. After the heal it leads within a lease and a
// renewal.
func TestReplicaAloneCutFromTheBoardLeadsAgainAfterTheHeal(t *testing.T) {
	c := cluster.Load()
	ctx := context.Background()
	ns := c.NewNamespace(t)
	pool := pgtest.NewDB(t)
	store, proxy := throughProxy(t, pool, 300*time.Millisecond)
	clk := clock.NewFake(time.Now())
	a, err := electorOn(c.Client(t), store, ns, "a", clk)
	if err != nil {
		t.Fatal(err)
	}
	first := a.Step(ctx)
	if !first.Leading {
		t.Fatalf("a does not lead: %v", a.LastError())
	}
	proxy.Cut()
	cutAt := clk.Now()
	// The holder at each step, from the cut on: held until the board has
	// been silent a lease, free for a lease, held again, free again.
	var seen []string
	for range 3 * int(leaseTTL/renewEvery) {
		clk.Advance(renewEvery)
		if st := a.Step(ctx); st.Leading && !clk.Now().Before(cutAt.Add(leaseTTL)) {
			t.Fatalf("a leads %s after the cut: %+v", clk.Now().Sub(cutAt), st)
		}
		h := holderOf(t, ns)
		if len(seen) == 0 || seen[len(seen)-1] != h {
			seen = append(seen, h)
		}
	}
	if got := strings.Join(seen, ","); got != "a,,a," {
		t.Fatalf("the Lease's holders after the cut, in turn: %q, want a, free, a, free", got)
	}
	proxy.Heal()
	healed := clk.Now()
	var st leader.Status
	for st = a.Step(ctx); !st.Leading; st = a.Step(ctx) {
		if clk.Now().Sub(healed) > leaseTTL+renewEvery {
			t.Fatalf("a does not lead %s after the heal: %v", clk.Now().Sub(healed), a.LastError())
		}
		clk.Advance(renewEvery)
	}
	t.Logf("a leads again %s (fake clock) after the heal, term %d after %d", clk.Now().Sub(healed), st.Term, first.Term)
	if st.Term <= first.Term {
		t.Fatalf("a leads under term %d after the heal, want one after %d", st.Term, first.Term)
	}
}

// With a margin longer than a renewal, a leader cut off from the board
// tries to acquire again (its trust over) before the board has been silent
// for a lease: those steps hold the Lease without renewing it, so it was
// renewed once after the cut, by the renewal that found the board silent,
// until it is released.
func TestAcquisitionsAfterASilentBoardLeaveTheLeaseUnrenewed(t *testing.T) {
	c := cluster.Load()
	ctx := context.Background()
	ns := c.NewNamespace(t)
	pool := pgtest.NewDB(t)
	store, proxy := throughProxy(t, pool, 300*time.Millisecond)
	clk := clock.NewFake(time.Now())
	a, err := electorWithMargin(c.Client(t), store, ns, "a", clk, leaseTTL/2)
	if err != nil {
		t.Fatal(err)
	}
	if st := a.Step(ctx); !st.Leading {
		t.Fatalf("a does not lead: %v", a.LastError())
	}
	proxy.Cut()
	cutAt := clk.Now()
	for clk.Now().Sub(cutAt) < leaseTTL {
		clk.Advance(renewEvery)
		if st := a.Step(ctx); st.Leading && !clk.Now().Before(cutAt.Add(leaseTTL/2)) {
			t.Fatalf("a leads %s after the cut, past its trust: %+v", clk.Now().Sub(cutAt), st)
		}
		h, renewed := leaseOf(t, ns)
		if clk.Now().Sub(cutAt) < leaseTTL && h != "a" {
			t.Fatalf("%s after the cut the Lease is held by %q, want a until the board has been silent a lease", clk.Now().Sub(cutAt), h)
		}
		if renewed.After(cutAt.Add(renewEvery)) {
			t.Fatalf("the Lease was renewed %s after the cut, %s after the board first failed to answer",
				renewed.Sub(cutAt), renewed.Sub(cutAt.Add(renewEvery)))
		}
	}
	if h := holderOf(t, ns); h != "" {
		t.Fatalf("a lease after the cut the Lease is held by %q, want it released", h)
	}
}

// A replica that took the Lease while another's term still ran on the
// board, and then could not reach the board, holds the Lease unrenewed;
// when the board answers with a term, the Lease is renewed with it.
func TestATermTakenAfterAFailedBoardCallRenewsTheLease(t *testing.T) {
	c := cluster.Load()
	ctx := context.Background()
	ns := c.NewNamespace(t)
	pool := pgtest.NewDB(t)
	store, proxy := throughProxy(t, pool, 300*time.Millisecond)
	clk := clock.NewFake(time.Now())
	// A replica gone: its term runs on the board for a lease; it holds no
	// Lease.
	gone := clk.Now()
	if _, ok, err := board.New(pool, board.Options{}).TryAcquire(ctx, "gone", leaseTTL, gone); err != nil || !ok {
		t.Fatalf("a term for the gone replica: %v, %v", ok, err)
	}
	a, err := electorOn(c.Client(t), store, ns, "a", clk)
	if err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	clk.Advance(renewEvery)
	took := clk.Now()
	// Cut until the gone replica's term has run out.
	for clk.Now().Before(gone.Add(leaseTTL - renewEvery)) {
		if st := a.Step(ctx); st.Leading {
			t.Fatalf("a leads while cut: %+v", st)
		}
		if h, renewed := leaseOf(t, ns); h != "a" || !sameTime(renewed, took) {
			t.Fatalf("%s after it took the Lease, its holder is %q, renewed at %s: want a, never renewed since",
				clk.Now().Sub(took), h, renewed.Sub(took))
		}
		clk.Advance(renewEvery)
	}
	proxy.Heal()
	clk.Set(gone.Add(leaseTTL))
	st := a.Step(ctx)
	if !st.Leading {
		t.Fatalf("a does not lead once healed and the gone replica's term is over: %v", a.LastError())
	}
	if _, renewed := leaseOf(t, ns); !sameTime(renewed, clk.Now()) {
		t.Fatalf("a took term %d and the Lease was last renewed %s before, want with it", st.Term, clk.Now().Sub(renewed))
	}
}

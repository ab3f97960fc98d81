package kubee2e_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/netfault"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// proxiedConfig writes the scenario's configuration with every kubeconfig
// it names (the Lease's, the substrate's, the runner's) replaced by one
// whose server is proxy: that replica reaches the API server through it
// alone.
func (s *scenario) proxiedConfig(proxy *netfault.Proxy) string {
	s.t.Helper()
	orig := s.c.Kubeconfig()
	b, err := os.ReadFile(orig)
	if err != nil {
		s.t.Fatal(err)
	}
	host := strings.TrimPrefix(s.c.Host(), "https://")
	kc := filepath.Join(s.dir, "kubeconfig-proxied")
	if err := os.WriteFile(kc, []byte(strings.ReplaceAll(string(b), host, proxy.Addr())), 0o600); err != nil {
		s.t.Fatal(err)
	}
	cfg, err := os.ReadFile(s.config())
	if err != nil {
		s.t.Fatal(err)
	}
	path := filepath.Join(s.dir, "reaperd-proxied.hcl")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(cfg), orig, kc)), 0o600); err != nil {
		s.t.Fatal(err)
	}
	return path
}

// The leading replica is cut off from the API server by a partition that
// drops its packets (its requests hang; the Lease, the informers and the
// runner's calls all go through the cut) while the other replica and the
// cluster see it, and a running attempt's pod is deleted meanwhile. The
// leader cannot renew the Lease and stops leading on its own clock; the
// other takes the Lease once it has run out and reaps the attempt once,
// after its settling gate; the cut replica, blind, reaps nothing. After
// the heal it stands by.
func leaderCutOffFromTheAPIServer(t *testing.T, c *kubetest.Cluster) {
	s := newScenario(t, 13, "leader cut off from the API server", c)
	proxy, err := netfault.Listen(strings.TrimPrefix(c.Host(), "https://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	cut := s.startDaemonWith(s.proxiedConfig(proxy))
	if l := s.leader(30 * time.Second); l != cut {
		t.Fatalf("the replica behind the proxy does not lead")
	}
	other := s.startDaemon()
	s.submit(victim("victim"), bystander("bystander"))
	a, p := s.waitRunning("victim")
	s.waitRunning("bystander")
	before, _ := s.leaderNow()

	proxy.Cut()
	cutAt := time.Now()
	s.deletePod(p)
	f := s.harm("leader cut off from the API server, pod deleted", a, max(agentLost, podLostFloor))
	var l board.Lease
	s.eventually(30*time.Second, "the other replica to take the lease", func() bool {
		cur, ok := s.leaderNow()
		l = cur
		return ok && cur.Held(time.Now()) && other.holds(cur.Holder)
	})
	if l.Term <= before.Term {
		t.Errorf("the other replica leads under term %d, want one after %d", l.Term, before.Term)
	}
	t.Logf("the other replica took over %s after the cut (term %d)", l.AcquiredAt.Sub(cutAt).Round(time.Millisecond), l.Term)
	s.waitReaped(f, time.Minute)
	ds, err := s.decisions()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if d.Applied && reapers[d.Reaper] && d.Term == before.Term && d.At.After(cutAt) {
			t.Errorf("the cut replica applied a reap after the cut: %s %s %s", d.Reaper, d.Label, d.Attempt)
		}
	}

	proxy.Heal()
	t.Logf("healed %s after the cut", time.Since(cutAt).Round(time.Millisecond))
	if cur, _ := s.leaderNow(); !other.holds(cur.Holder) || cur.Term != l.Term {
		t.Errorf("at the heal the lease moved: %+v, want term %d with the other replica", cur, l.Term)
	}
	s.finish()
	// Through the run's end the healed replica stood by: every decision
	// from the takeover on was the new term's.
	if ds, err = s.decisions(); err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if d.Applied && !d.At.Before(l.AcquiredAt) && d.Term != l.Term {
			t.Errorf("a decision of term %d after term %d took over: %s %s %s", d.Term, l.Term, d.Reaper, d.Label, d.Attempt)
		}
	}
}

// boardProxiedConfig writes the scenario's configuration with its DSN
// naming proxy instead of the server: that replica reaches PostgreSQL
// through it alone (the API server directly).
func (s *scenario) boardProxiedConfig(proxy *netfault.Proxy, server string) string {
	s.t.Helper()
	cfg, err := os.ReadFile(s.config())
	if err != nil {
		s.t.Fatal(err)
	}
	if !strings.Contains(s.dsn, server) {
		s.t.Fatalf("the scenario's DSN does not name the server at %s", server)
	}
	text := strings.ReplaceAll(string(cfg), s.dsn, strings.Replace(s.dsn, server, proxy.Addr(), 1))
	if text == string(cfg) {
		s.t.Fatal("the configuration does not name the scenario's DSN")
	}
	path := filepath.Join(s.dir, "reaperd-board-proxied.hcl")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		s.t.Fatal(err)
	}
	return path
}

// kubeLeaseHolder reads the Kubernetes Lease's holder ("" when released).
func (s *scenario) kubeLeaseHolder() string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	l, err := s.cs.CoordinationV1().Leases(s.ns).Get(ctx, "reaperd", metav1.GetOptions{})
	if err != nil {
		s.t.Fatalf("read the Kubernetes Lease: %v", err)
	}
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// boardCutTakeover is the SLA of the takeover when the leader is cut off
// from PostgreSQL but not from the API server. The cut replica renews the
// Kubernetes Lease once at most after the cut: in the first step that
// finds the board silent (a renewal renews the Lease, then hangs on the
// board), a renewal interval (lease/3) after it at the latest. From then
// on the Lease is not renewed: a renewal after a failed board call asks
// the board first, reaperd reads the board's schema before each
// acquisition (which hangs before the Lease is touched), and kubelease
// releases a Lease whose board has been silent for a lease. The Lease runs
// out a lease after that renewal as the other replica observes it (up to
// a renewal interval late), and the other's next step takes it and, the
// cut replica's term having run out on the board by then, a new term.
const boardCutTakeover = lease + 3*(lease/3)

// The leading replica is cut off from PostgreSQL by a partition that holds
// its packets (its board calls hang) while it and the other replica still
// see the API server, and a running attempt's pod is deleted meanwhile.
// The cut replica stops leading on its own clock and stops renewing the
// Kubernetes Lease; the other replica takes the Lease and a new term
// within boardCutTakeover of the cut, and reaps the attempt once after its
// settling gate. The cut replica applies nothing; after the heal it
// stands by: it takes neither lease back, and every decision from the
// takeover on is the new term's.
func leaderCutOffFromPostgres(t *testing.T, c *kubetest.Cluster) {
	s := newScenario(t, 14, "leader cut off from PostgreSQL (API server seen)", c)
	server := net.JoinHostPort("127.0.0.1", strconv.Itoa(pgtest.Current(t).Port()))
	proxy, err := netfault.Listen(server)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	cut := s.startDaemonWith(s.boardProxiedConfig(proxy, server))
	if l := s.leader(30 * time.Second); l != cut {
		t.Fatalf("the replica behind the proxy does not lead")
	}
	other := s.startDaemon()
	s.submit(victim("victim"), bystander("bystander"))
	a, p := s.waitRunning("victim")
	s.waitRunning("bystander")
	before, _ := s.leaderNow()
	if !cut.holds(before.Holder) {
		t.Fatalf("leadership moved before the cut: %+v", before)
	}

	proxy.Cut()
	cutAt := time.Now()
	s.deletePod(p)
	f := s.harm("leader cut off from PostgreSQL, pod deleted", a, max(agentLost, podLostFloor))
	var l board.Lease
	s.eventually(30*time.Second, "the other replica to take the lease", func() bool {
		cur, ok := s.leaderNow()
		l = cur
		return ok && cur.Held(time.Now()) && other.holds(cur.Holder)
	})
	if l.Term <= before.Term {
		t.Errorf("the other replica leads under term %d, want one after %d", l.Term, before.Term)
	}
	took := l.AcquiredAt.Sub(cutAt)
	t.Logf("the other replica took over %s after the cut (term %d; SLA %s)", took.Round(time.Millisecond), l.Term, boardCutTakeover)
	// Up to one interval more is scheduling jitter on a loaded machine.
	if took > boardCutTakeover+interval {
		t.Errorf("the other replica took over %s after the cut, past the SLA of %s", took.Round(time.Millisecond), boardCutTakeover)
	}
	if h := s.kubeLeaseHolder(); !other.holds(h) {
		t.Errorf("the Kubernetes Lease is held by %q after the takeover, want the other replica", h)
	}
	s.waitReaped(f, time.Minute)
	ds, err := s.decisions()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if d.Applied && d.Term == before.Term && d.At.After(cutAt) {
			t.Errorf("the cut replica applied a decision after the cut: %s %s %s", d.Reaper, d.Label, d.Attempt)
		}
	}

	proxy.Heal()
	healAt := time.Now()
	t.Logf("healed %s after the cut", healAt.Sub(cutAt).Round(time.Millisecond))
	// Two leases after the heal, the healed replica has not taken either
	// lease back.
	time.Sleep(2 * lease)
	if cur, _ := s.leaderNow(); !other.holds(cur.Holder) || cur.Term != l.Term {
		t.Errorf("after the heal the lease moved: %+v, want term %d with the other replica", cur, l.Term)
	}
	if h := s.kubeLeaseHolder(); !other.holds(h) {
		t.Errorf("the Kubernetes Lease is held by %q after the heal, want the other replica", h)
	}
	s.finish()
	// Through the run's end the healed replica stood by: every decision
	// from the takeover on was the new term's; what it had decided under
	// its old term reached the board refused.
	if ds, err = s.decisions(); err != nil {
		t.Fatal(err)
	}
	refusedAudit := 0
	for _, d := range ds {
		if d.Applied && !d.At.Before(l.AcquiredAt) && d.Term != l.Term {
			t.Errorf("a decision of term %d after term %d took over: %s %s %s", d.Term, l.Term, d.Reaper, d.Label, d.Attempt)
		}
		if !d.Applied && d.Term == before.Term && d.At.After(cutAt) {
			refusedAudit++
		}
	}
	b, _ := os.ReadFile(cut.log)
	log := string(b)
	t.Logf("the cut replica: %d releases of the Kubernetes Lease for a silent board, %d writes refused by the fence, %d of its decisions audited unapplied after the cut",
		strings.Count(log, "released Lease"), strings.Count(log, "the board's fence refused"), refusedAudit)
}

package kubee2e_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/netfault"
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

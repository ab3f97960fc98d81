package e2e_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// partitionAddr is the loopback address the partitioned replica reaches
// PostgreSQL through: the server listens on it beside 127.0.0.1, and a
// DROP rule on it cuts that replica alone off, while the other replica,
// on 127.0.0.1, sees the database as before.
const partitionAddr = "127.0.0.3"

// dropRule cuts every packet to and from addr:port on loopback (the
// database's side of the partitioned replica's connections): connections
// hang, as they do when a network drops rather than refuses. It returns
// the undo, which the test's cleanup runs too.
func dropRule(t *testing.T, addr string, port int) func() {
	t.Helper()
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Fatalf("the partition needs iptables: %v", err)
	}
	comment := fmt.Sprintf("reaper-e2e-partition-%d", os.Getpid())
	rules := [][]string{
		{"INPUT", "-p", "tcp", "-d", addr, "--dport", strconv.Itoa(port)},
		{"INPUT", "-p", "tcp", "-s", addr, "--sport", strconv.Itoa(port)},
	}
	run := func(op string, r []string) error {
		args := append([]string{"-w", op}, r...)
		args = append(args, "-m", "comment", "--comment", comment, "-j", "DROP")
		if out, err := exec.Command("iptables", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("iptables %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	for _, r := range rules {
		if err := run("-I", r); err != nil {
			t.Fatal(err)
		}
	}
	undone := false
	undo := func() {
		if undone {
			return
		}
		undone = true
		for _, r := range rules {
			if err := run("-D", r); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(undo)
	return undo
}

// 14. Two replicas; the leader is cut off from PostgreSQL by a partition
// that drops its packets (its connections hang, they are not refused)
// while the other replica sees the database. The leader cannot renew: its
// local trust runs out and it stops leading; the other takes the lease
// once it has expired, and settles the agent killed during the partition
// under its new term. When the partition heals, the old leader stands by:
// whatever it had in flight meets the fence (metered on its telemetry).
func leaderPartitionedFromPostgres(t *testing.T, mon *monitor) {
	ctx := context.Background()
	srv, err := pgtest.Start(ctx, pgtest.Options{Listen: []string{partitionAddr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	name := srv.UniqueName("partition")
	if err := srv.CreateDatabase(ctx, name, ""); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, srv.DSN(name))
	if err != nil {
		t.Fatal(err)
	}
	_, err = board.Migrate(ctx, pool)
	pool.Close()
	if err != nil {
		t.Fatal(err)
	}

	// The test's own reads and the second replica reach the database on
	// 127.0.0.1; the first replica through partitionAddr.
	s := newScenario(t, 14, "the leader partitioned from PostgreSQL", mon, srv.DSN(name))
	s.dsn = srv.DSNAt(partitionAddr, name)
	d1, _ := s.startWork(liteReapers)
	before, _ := s.leaderNow()
	s.dsn = srv.DSN(name)
	d2 := s.startDaemon(s.config(liteReapers))
	s.eventually(10*time.Second, "the follower to report its telemetry", func() bool {
		_, ok := d2.metric("reaper_leader")
		return ok
	})
	if l, _ := s.leaderNow(); !d1.holds(l.Holder) || l.Term != before.Term {
		t.Fatalf("leadership moved before the partition: %+v", l)
	}

	cutAt := time.Now()
	heal := dropRule(t, partitionAddr, srv.Port())
	cf := s.controlFault("the leader partitioned from PostgreSQL (packets dropped)", cutAt, lease+renewEvery+grace, nil)
	vf := s.harmAgent("victim", true, "agent and task group killed during the partition")
	cf.target = vf.target
	// Its elector's answer, through the health report (the leading
	// gauge is set by the loop, which waits on the hung database).
	s.eventually(15*time.Second, "the partitioned leader to stop leading on its own clock", func() bool {
		_, body := d1.health()
		return strings.Contains(body, `"leading":false`)
	})
	stoppedAfter := time.Since(cutAt)
	l := s.waitLeader(d2, 20*time.Second)
	if l.Term != before.Term+1 {
		t.Errorf("the other replica leads under term %d, want %d", l.Term, before.Term+1)
	}
	gap := l.AcquiredAt.Sub(cutAt)
	t.Logf("the partitioned leader's health said it no longer leads %s after the cut (the report waits on its database ping); the other took over %s after it",
		stoppedAfter.Round(time.Millisecond), gap.Round(time.Millisecond))
	r := s.waitReaped(*vf.target, 40*time.Second)
	s.checkSettled(r, l)

	heal()
	healedAt := time.Now()
	s.eventually(20*time.Second, "the healed replica to answer its health again", func() bool {
		code, _ := d1.health()
		return code != 0
	})
	// Healed, it stands by: the lease stays with the replica that took it.
	s.eventually(15*time.Second, "the healed replica to report it does not lead", func() bool {
		code, body := d1.health()
		return code != 0 && strings.Contains(body, `"leading":false`)
	})
	if cur, _ := s.leaderNow(); !d2.holds(cur.Holder) || cur.Term != l.Term {
		t.Errorf("after the heal the lease moved: %+v, want term %d with the other replica", cur, l.Term)
	}
	refused, _ := d1.metric("reaper_fence_refused_total")
	t.Logf("healed %s after the cut; writes of the old term the fence refused: %v",
		healedAt.Sub(cutAt).Round(time.Millisecond), refused)
	s.waitRecovered("victim")
	s.finish()
}

package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/lite/proc"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// TestFaultSuite runs every fault scenario in parallel (each has its own
// database, record directory, task files and telemetry port), then prints
// the figures table.
func TestFaultSuite(t *testing.T) {
	if testing.Short() {
		t.Skip("the fault suite runs real processes for about a minute")
	}
	ctx, cancel := context.WithCancel(context.Background())
	mon := newMonitor(100 * time.Millisecond)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		mon.run(ctx)
	}()
	defer func() {
		cancel()
		<-stopped
	}()

	start := time.Now()
	t.Run("scenarios", func(t *testing.T) {
		var wg sync.WaitGroup
		for _, sc := range []struct {
			name string
			run  func(*testing.T, *monitor)
		}{
			{"1_agent_killed_task_alive", agentKilledTaskAlive},
			{"2_agent_and_task_killed", agentAndTaskKilled},
			{"3_setsid_escape", setsidEscape},
			{"4_reaperd_killed_and_restarted", reaperdKilledAndRestarted},
			{"5_postgres_outage", postgresOutage},
			{"6_leader_replica_killed", leaderReplicaKilled},
			{"7_reaper_plugin_crashing", pluginCrashing},
			{"8_reaper_plugin_hanging", pluginHanging},
			{"9_trapping_orphan_at_defaults_first", orphanStopAtDefaults(true)},
			{"10_trapping_orphan_at_defaults_last", orphanStopAtDefaults(false)},
			{"11_postgres_frozen", postgresFrozen},
			{"12_failover_synchronous", failoverSynchronous},
			{"13_failover_async_lost_term", failoverAsyncLostTerm},
			{"14_leader_partitioned_from_postgres", leaderPartitionedFromPostgres},
		} {
			// Run is called from a goroutine of its own rather than with
			// t.Parallel, which -parallel (GOMAXPROCS by default) would
			// limit: the scenarios mostly wait on real processes.
			wg.Add(1)
			go func() {
				defer wg.Done()
				t.Run(sc.name, func(t *testing.T) { sc.run(t, mon) })
			}()
		}
		wg.Wait()
	})
	fmt.Print(book.table(time.Since(start)))
}

// startWork starts reaperd with the Lite reapers (or the given blocks),
// submits a run of a victim and two bystanders, and waits until the gate
// has opened and every task runs and heartbeats.
func (s *scenario) startWork(reapers string, tasks ...taskSpec) (*daemon, string) {
	s.t.Helper()
	cfg := s.config(reapers)
	d := s.startDaemon(cfg)
	if len(tasks) == 0 {
		tasks = []taskSpec{victim("victim"), bystander("by1"), bystander("by2")}
	}
	s.submit(cfg, tasks...)
	s.waitLeader(d, 20*time.Second)
	s.waitGateOpen(d, "agentlost")
	for _, ts := range tasks {
		s.waitRunning(ts.id)
	}
	return d, cfg
}

// applied reports whether a reaper applied label to the first attempt of
// task.
func (s *scenario) applied(task, label string) bool {
	ds, err := s.decisions(task)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, d := range ds {
		if d.Applied && isReaper(d) && d.Label == label && d.Attempt == first(task) {
			return true
		}
	}
	return false
}

// gateSkips counts the settling skips recorded under term.
func (s *scenario) gateSkips(term int64) int {
	ds, err := s.decisions("")
	if err != nil {
		s.t.Fatal(err)
	}
	n := 0
	for _, d := range ds {
		if d.Term == term && d.Label == sdk.LabelSettlingSkip {
			n++
		}
	}
	return n
}

// checkSettled checks that the reap r came from the term of lease l, after
// that term's gate held for the grace and recorded its skips.
func (s *scenario) checkSettled(r decision, l board.Lease) {
	s.t.Helper()
	if r.Term != l.Term {
		s.t.Errorf("reaped under term %d, want the new leader's term %d", r.Term, l.Term)
	}
	if since := r.At.Sub(l.AcquiredAt); since < grace {
		s.t.Errorf("reaped %s after the new term began, inside the %s settling grace", since, grace)
	}
	if n := s.gateSkips(l.Term); n == 0 {
		s.t.Errorf("no %s recorded under the new term %d", sdk.LabelSettlingSkip, l.Term)
	} else {
		s.t.Logf("the new leader (term %d) recorded %d settling skips before reaping", l.Term, n)
	}
}

// 1. The agent dies (kill -9) while its task runs on: the orphaned task
// group is stopped, then the attempt is reaped and re-placed.
func agentKilledTaskAlive(t *testing.T, mon *monitor) {
	s := newScenario(t, 1, "agent kill -9, task alive", mon, pgtest.NewDSN(t))
	s.startWork(liteReapers)
	f := s.harmAgent("victim", false, "agent killed, task alive")
	s.waitReaped(*f.target, 30*time.Second)
	if !s.applied("victim", sdk.LabelAgentLostOrphanStopped) {
		t.Errorf("no applied %s: the orphaned task group was not stopped before the reap", sdk.LabelAgentLostOrphanStopped)
	}
	s.waitRecovered("victim")
	s.finish()
}

// 2. The agent and its whole task group die: the attempt reads dead and is
// reaped; there is nothing to stop.
func agentAndTaskKilled(t *testing.T, mon *monitor) {
	s := newScenario(t, 2, "agent and task group kill -9", mon, pgtest.NewDSN(t))
	s.startWork(liteReapers)
	f := s.harmAgent("victim", true, "agent and task group killed")
	r := s.waitReaped(*f.target, 30*time.Second)
	if r.Label != sdk.LabelAgentLost {
		t.Errorf("reaped as %s, want %s", r.Label, sdk.LabelAgentLost)
	}
	if s.applied("victim", sdk.LabelAgentLostOrphanStopped) {
		t.Errorf("an orphan stop was applied although no process of the group was left")
	}
	s.waitRecovered("victim")
	s.finish()
}

// 3. A task's child leaves the task's process group with setsid. That is
// the documented boundary: the escaped process neither keeps its attempt
// alive nor is stopped with an orphaned group. Two victims show both
// halves: one whose agent alone is killed (its group is stopped as an
// orphan, its escaped child is not), one whose agent and group are killed
// (reaped as dead although its escaped child runs).
func setsidEscape(t *testing.T, mon *monitor) {
	s := newScenario(t, 3, "task child escapes with setsid", mon, pgtest.NewDSN(t))
	orphan := taskSpec{id: "orphaned", victim: true, escape: true}
	dead := taskSpec{id: "dead", victim: true, escape: true}
	s.startWork(liteReapers, orphan, dead, bystander("by1"))

	escaped := map[string]int{}
	for _, id := range []string{orphan.id, dead.id} {
		path := filepath.Join(s.taskDir, id+".escaped")
		s.eventually(10*time.Second, "the escaped process of "+id, func() bool {
			b, err := os.ReadFile(path)
			if err != nil {
				return false
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil || pid <= 1 {
				return false
			}
			escaped[id] = pid
			return true
		})
		pid := escaped[id]
		s.escaped = append(s.escaped, pid) // killed below; by the sweep if the scenario stops early
		info, err := proc.Stat(pid)
		if err != nil {
			t.Fatalf("escaped process %d of %s: %v", pid, id, err)
		}
		for _, e := range s.mon.executions(s.taskDir) {
			if e.Task == id && info.PGID == e.PID {
				t.Fatalf("the process %d of %s did not leave the task's group %d", pid, id, e.PID)
			}
		}
	}

	fo := s.harmAgent(orphan.id, false, "agent killed; its task's escaped child runs on")
	fd := s.harmAgent(dead.id, true, "agent and group killed; the escaped child runs on")
	s.waitReaped(*fo.target, 30*time.Second)
	rd := s.waitReaped(*fd.target, 30*time.Second)
	if !s.applied(orphan.id, sdk.LabelAgentLostOrphanStopped) {
		t.Errorf("%s: no applied %s", orphan.id, sdk.LabelAgentLostOrphanStopped)
	}
	// Not seen: the escaped child did not keep the dead attempt alive.
	if rd.Label != sdk.LabelAgentLost {
		t.Errorf("%s reaped as %s, want %s", dead.id, rd.Label, sdk.LabelAgentLost)
	}
	ds, err := s.decisions(dead.id)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if d.Label == sdk.LabelAgentLostProcessAlive && d.Attempt == first(dead.id) {
			t.Errorf("%s was deferred as alive (%s): its escaped child was seen", dead.id, d.Detail)
		}
	}
	s.waitRecovered(orphan.id)
	s.waitRecovered(dead.id)
	// Not stopped: both escaped children outlived the reaps, the orphan
	// stop and the re-placed attempts.
	for id, pid := range escaped {
		if info, err := proc.Stat(pid); err != nil || info.Zombie {
			t.Errorf("the escaped child %d of %s was stopped (%v): the documented boundary says it is not", pid, id, err)
		} else {
			t.Logf("the escaped child %d of %s still runs after its attempt was reaped and re-placed, as documented", pid, id)
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	s.finish()
}

// 4. reaperd is killed with SIGKILL in the middle of a cycle; while it is
// down an agent dies (its task runs on). The restarted reaperd takes the
// lease once the dead one's has run out, holds its gate for the grace under
// the new term, then stops the orphan and recovers the attempt.
func reaperdKilledAndRestarted(t *testing.T, mon *monitor) {
	s := newScenario(t, 4, "reaperd kill -9 mid-cycle, restart", mon, pgtest.NewDSN(t))
	d1, cfg := s.startWork(liteReapers)
	before, _ := s.leaderNow()
	killedAt := s.killMidCycle(d1)
	cf := s.controlFault("reaperd killed mid-cycle and restarted", killedAt, lease+renewEvery+grace, nil)
	vf := s.harmAgent("victim", false, "agent killed while reaperd was down, task alive")
	cf.target = vf.target
	d2 := s.startDaemon(cfg)
	l := s.waitLeader(d2, 20*time.Second)
	if l.Term <= before.Term {
		t.Fatalf("the restarted reaperd leads under term %d, not after %d", l.Term, before.Term)
	}
	r := s.waitReaped(*vf.target, 40*time.Second)
	s.checkSettled(r, l)
	if !s.applied("victim", sdk.LabelAgentLostOrphanStopped) {
		t.Errorf("no applied %s after the restart", sdk.LabelAgentLostOrphanStopped)
	}
	s.waitRecovered("victim")
	// The agents send their heartbeats on heartbeat streams: the two
	// bystanders' agents, whose streams the kill broke, opened new ones on
	// the restarted reaperd, and so did the recovered victim's agent; the
	// heartbeats on them keep those attempts alive (the promises finish
	// checks: no reap, one execution each).
	s.eventually(30*time.Second, "the agents' heartbeat streams on the restarted reaperd", func() bool {
		n, _ := d2.metric("reaper_attempt_api_connections_total", `result="stream_opened"`)
		return n >= 3
	})
	if n, _ := d2.metric("reaper_attempt_api_calls_total", `call="heartbeat"`, `result="ok"`); n == 0 {
		t.Errorf("no heartbeat answered by the restarted reaperd")
	}
	s.finish()
}

// 5. PostgreSQL stops mid-run for longer than the lease and agent_lost, so
// every heartbeat goes stale; an agent and its task die meanwhile. While it
// is down reaperd reports itself unhealthy and reaps nothing. After it
// returns the leader starts a new term, settles, leaves the live attempts
// alone and recovers the dead one.
func postgresOutage(t *testing.T, mon *monitor) {
	ctx := context.Background()
	srv, dsn := ownBoard(t, "outage")
	s := newScenario(t, 5, "PostgreSQL stopped and restarted", mon, dsn)
	d, _ := s.startWork(liteReapers)
	before, _ := s.leaderNow()

	downAt := time.Now()
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	s.eventually(15*time.Second, "reaperd to report itself unhealthy", func() bool {
		code, _ := d.health()
		return code == http.StatusServiceUnavailable
	})
	_, body := d.health()
	t.Logf("health while PostgreSQL is down: %s", body)
	vf := s.harmAgent("victim", true, "agent and task group killed while PostgreSQL was down")
	// The outage is the fault: it lasts past the lease and past agent_lost,
	// so that when the database returns every heartbeat on it is stale.
	for time.Since(downAt) < agentLost+heartbeat {
		time.Sleep(100 * time.Millisecond)
	}
	upAt := time.Now()
	if err := srv.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	s.controlFault(fmt.Sprintf("PostgreSQL down for %s", upAt.Sub(downAt).Round(100*time.Millisecond)),
		upAt, renewEvery+grace, vf.target)
	if n := d.count("decision", downAt, upAt); n > 0 {
		t.Errorf("%d decisions applied while PostgreSQL was down", n)
	}
	s.eventually(30*time.Second, "reaperd to be healthy again", func() bool {
		code, _ := d.health()
		return code == http.StatusOK
	})
	l := s.waitLeader(d, 20*time.Second)
	if l.Term <= before.Term {
		t.Errorf("leading under term %d after the outage, want a new term after %d", l.Term, before.Term)
	}
	r := s.waitReaped(*vf.target, 40*time.Second)
	s.checkSettled(r, l)
	ds, err := s.decisions("")
	if err != nil {
		t.Fatal(err)
	}
	// Nothing is applied while blind. What the outage did to the passes
	// (reap_pass_error, not applied) is audited once the board is back,
	// at the time it happened.
	for _, dec := range ds {
		if dec.Applied && !dec.At.Before(downAt) && !dec.At.After(upAt) {
			t.Errorf("an applied decision is dated inside the outage: %+v", dec)
		}
	}
	s.waitRecovered("victim")
	s.finish()
}

// 6. Two replicas share the board; the leader is killed with SIGKILL and an
// agent and its task die with it. The follower takes the lease once it has
// run out, settles under its new term, and recovers the attempt.
func leaderReplicaKilled(t *testing.T, mon *monitor) {
	s := newScenario(t, 6, "two replicas, the leader kill -9", mon, pgtest.NewDSN(t))
	d1, cfg := s.startWork(liteReapers)
	before, _ := s.leaderNow()
	d2 := s.startDaemon(cfg)
	// The follower stays one while the leader lives.
	s.eventually(10*time.Second, "the follower to report its telemetry", func() bool {
		_, ok := d2.metric("reaper_leader")
		return ok
	})
	if v, _ := d2.metric("reaper_leader"); v != 0 {
		t.Fatalf("the second replica leads while the first lives")
	}
	if l, _ := s.leaderNow(); !d1.holds(l.Holder) || l.Term != before.Term {
		t.Fatalf("leadership moved while the leader lived: %+v", l)
	}
	killedAt := time.Now()
	d1.kill()
	cf := s.controlFault("the leading replica killed", killedAt, lease+renewEvery+grace, nil)
	vf := s.harmAgent("victim", true, "agent and task group killed with the leader")
	cf.target = vf.target
	l := s.waitLeader(d2, 20*time.Second)
	if l.Term != before.Term+1 {
		t.Errorf("the follower leads under term %d, want %d", l.Term, before.Term+1)
	}
	t.Logf("the follower took over %s after the kill", l.AcquiredAt.Sub(killedAt).Round(time.Millisecond))
	r := s.waitReaped(*vf.target, 40*time.Second)
	s.checkSettled(r, l)
	s.waitRecovered("victim")
	s.finish()
}

// 7. A reaper plugin crashes in every pass. It is restarted each time, and
// the reapers around it still run in the same cycles: an agent killed
// meanwhile is recovered on time.
func pluginCrashing(t *testing.T, mon *monitor) {
	s := newScenario(t, 7, "a reaper plugin crashing", mon, pgtest.NewDSN(t))
	reapers := `reaper "dispatchlost" {}
reaper "crashy" {
  mode = "crash"
}
reaper "agentlost" {}
reaper "orphanrun" {}
`
	d, _ := s.startWork(reapers)
	s.eventually(20*time.Second, "the crashing plugin to be restarted", func() bool {
		v, _ := d.metric("reaper_plugin_restarts_total", `plugin="crashy"`)
		return v >= 1
	})
	vf := s.harmAgent("victim", true, "agent and task group killed")
	s.controlFault("reaper plugin crashy crashes in every pass", vf.at, agentLost, vf.target)
	r := s.waitReaped(*vf.target, 30*time.Second)
	if r.Reaper != "agentlost" {
		t.Errorf("reaped by %s, want agentlost", r.Reaper)
	}

	ds, err := s.decisions("")
	if err != nil {
		t.Fatal(err)
	}
	crashes, sameCycle := 0, false
	for _, dec := range ds {
		if dec.Reaper != "crashy" {
			continue
		}
		if dec.Label != sdk.LabelPluginUnavailable {
			t.Errorf("crashy recorded %s, want only %s", dec.Label, sdk.LabelPluginUnavailable)
			continue
		}
		crashes++
		// The crash of the cycle that reaped: crashy runs before agentlost.
		if dec.Term == r.Term && !dec.At.After(r.At) && r.At.Sub(dec.At) < interval {
			sameCycle = true
		}
	}
	if !sameCycle {
		t.Errorf("no crash of crashy in the cycle where agentlost reaped (at %s)", r.At.Format("15:04:05.000"))
	}
	restarts, _ := d.metric("reaper_plugin_restarts_total", `plugin="crashy"`)
	t.Logf("crashy crashed %d times and was restarted %v times", crashes, restarts)
	if crashes < 2 || restarts < 1 {
		t.Errorf("crashes %d, restarts %v: want the plugin to crash and be restarted repeatedly", crashes, restarts)
	}
	for _, other := range []string{"dispatchlost", "agentlost", "orphanrun"} {
		if p := d.passes(other); p < float64(crashes-1) {
			t.Errorf("%s ran %v passes while crashy crashed %d times: it missed cycles", other, p, crashes)
		}
	}
	s.waitRecovered("victim")
	s.finish()
}

// 8. A reaper plugin hangs in every pass until its budget cancels it, and
// it is configured FIRST. Its pass gets only its share of the reap budget,
// the host stops the plugin (a WARN) and starts a fresh one next cycle, and
// the reapers after it still run every cycle: an agent killed meanwhile is
// recovered on time.
func pluginHanging(t *testing.T, mon *monitor) {
	s := newScenario(t, 8, "a reaper plugin hanging past its budget", mon, pgtest.NewDSN(t))
	reapers := `reaper "hang" {
  mode = "hang"
}
` + liteReapers
	d, _ := s.startWork(reapers)
	overruns := func() int {
		n := 0
		for _, l := range d.lines() {
			if l.ev.Message == "reaper pass outlived its share of the reap budget: restarting the plugin" && l.ev.Level == "warn" {
				n++
			}
		}
		return n
	}
	s.eventually(20*time.Second, "a hung pass to be cut off at its share, with a WARN", func() bool { return overruns() >= 1 })
	cycles, _ := d.metric("reaper_cycles_total")
	vf := s.harmAgent("victim", true, "agent and task group killed")
	s.controlFault("reaper plugin hang blocks every pass past its budget", vf.at, agentLost, vf.target)
	r := s.waitReaped(*vf.target, 30*time.Second)
	if r.Reaper != "agentlost" {
		t.Errorf("reaped by %s, want agentlost", r.Reaper)
	}
	if code, body := d.health(); code != http.StatusOK {
		t.Errorf("unhealthy while a plugin hangs: %d %s", code, body)
	}
	s.waitRecovered("victim")
	later, _ := d.metric("reaper_cycles_total")
	metered, _ := d.metric("reaper_plugin_restarts_total", `plugin="hang"`)
	t.Logf("%d cut-off WARNs, %v restarts of the hung plugin, %v cycles from the fault to the recovery", overruns(), metered, later-cycles)
	if later-cycles < 3 {
		t.Errorf("only %v cycles ran after the fault: the loop did not go on", later-cycles)
	}
	if overruns() < 3 || metered < 2 {
		t.Errorf("hung passes: %d WARNs, %v restarts; want one per hung cycle", overruns(), metered)
	}
	ds, err := s.decisions("")
	if err != nil {
		t.Fatal(err)
	}
	hung := 0
	for _, dec := range ds {
		if dec.Reaper == "hang" {
			hung++
		}
	}
	if hung == 0 {
		t.Errorf("no decision records the hung passes")
	}
	s.finish()
}

// 9, 10. At the specification's cycle and stop timings (30 s; SIGTERM,
// 10 s, SIGKILL, 5 s), an agent is killed with kill -9 and its task group,
// which ignores SIGTERM, runs on. Its stop needs longer than agentlost's
// share of the reap phase: the stop goes on in the substrate, the attempt
// defers as alive, and the mark lands on the pass that finds the group
// gone, within two cycles, with agentlost first in the order (9) and last
// (10). No pass overruns its share and no plugin is recycled for it.
func orphanStopAtDefaults(first bool) func(*testing.T, *monitor) {
	return func(t *testing.T, mon *monitor) {
		num, title := 9, "trapping orphan, default stop, agentlost first"
		reapers := "reaper \"agentlost\" {}\nreaper \"dispatchlost\" {}\nreaper \"orphanrun\" {}\n"
		if !first {
			num, title = 10, "trapping orphan, default stop, agentlost last"
			reapers = "reaper \"dispatchlost\" {}\nreaper \"orphanrun\" {}\nreaper \"agentlost\" {}\n"
		}
		s := newScenario(t, num, title, mon, pgtest.NewDSN(t))
		s.timing = defaultStopTiming()
		s.startWork(reapers, trapping("victim"), bystander("by1"))
		f := s.harmAgent("victim", false, "agent killed, its group ignores SIGTERM")
		// Judged within two cycles of the threshold: the stop takes one.
		f.threshold = agentLost + s.timing.interval
		r := s.waitReaped(*f.target, agentLost+4*s.timing.interval)
		if r.Label != sdk.LabelAgentLostOrphanStopped {
			t.Errorf("reaped as %s, want %s", r.Label, sdk.LabelAgentLostOrphanStopped)
		}
		ds, err := s.decisions("")
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			if d.Label == sdk.LabelPluginUnavailable || d.Label == sdk.LabelPassError {
				t.Errorf("%s at %s: %s", d.Label, d.At.Format("15:04:05.000"), d.Detail)
			}
		}
		s.waitRecovered("victim")
		s.finish()
	}
}

package kubee2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// The PostgreSQL nemeses on the kube edition: the board's server stalls,
// and the primary is lost and a standby promoted, synchronous or a term
// behind. The replicas lead through the Kubernetes Lease, fenced by the
// board's term; the task pods' agents report through the attempt API, whose
// every answer is the board's.

// leaderless samples the board's leader row every poll and keeps the
// longest stretch in which no replica held it.
type leaderless struct {
	since   time.Time // the current stretch began (zero: a leader holds)
	longest time.Duration
}

func (g *leaderless) sample(s *scenario) {
	l, ok := s.leaderNow()
	now := time.Now()
	switch {
	case ok && l.Held(now) && !g.since.IsZero():
		g.longest = max(g.longest, now.Sub(g.since))
		g.since = time.Time{}
	case (!ok || !l.Held(now)) && g.since.IsZero():
		g.since = now
	}
}

func (g *leaderless) end() time.Duration {
	if !g.since.IsZero() {
		g.longest = max(g.longest, time.Since(g.since))
		g.since = time.Time{}
	}
	return g.longest
}

// fenceRefusals counts, in the replicas' logs, the writes the board's fence
// refused them.
func (s *scenario) fenceRefusals() int {
	n := 0
	for _, d := range s.daemons {
		b, _ := os.ReadFile(d.log)
		n += strings.Count(string(b), "the board's fence refused")
	}
	return n
}

// freeze stops the replica (SIGSTOP) and returns once it is stopped.
func (d *daemon) freeze() error {
	if err := d.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("freeze %s: %w", d.name, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !stoppedProc(d.pid()) {
		if time.Now().After(deadline) {
			return fmt.Errorf("freeze %s: not stopped 5s after SIGSTOP", d.name)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// thaw resumes a frozen replica (SIGCONT).
func (d *daemon) thaw() error {
	if err := d.cmd.Process.Signal(syscall.SIGCONT); err != nil && !d.exited() {
		return fmt.Errorf("thaw %s: %w", d.name, err)
	}
	return nil
}

// stoppedProc reports whether /proc shows pid stopped by a signal.
func stoppedProc(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && i+2 < len(b) && b[i+2] == 'T'
}

// appliedBetween lists the applied reaper decisions dated in [from, to].
func appliedBetween(ds []decision, from, to time.Time) []decision {
	var out []decision
	for _, d := range ds {
		if d.Applied && reapers[d.Reaper] && !d.At.Before(from) && !d.At.After(to) {
			out = append(out, d)
		}
	}
	return out
}

// PostgreSQL's I/O is frozen (every process of the scenario's own server
// SIGSTOPped, as a disk whose I/O hangs would stall it) for two leases
// while two attempts run, and the victim's pod is deleted meanwhile. Every
// board call hangs: nothing is applied blind, the live bystander is not
// reaped. Once thawed, a replica leads again, and the victim's loss is
// reaped within its SLA counted from the thaw (the board back); the
// bystander finishes at its first attempt.
func postgresFrozen(t *testing.T, c *kubetest.Cluster) {
	srv, dsn := pgtest.NewOwnBoard(t, "kfrozen")
	s := newScenarioBoard(t, 15, "PostgreSQL I/O frozen past the lease", c, nil, dsn)
	// Registered after the scenario's cleanups: runs before them (the dump
	// of a failed scenario reads the board).
	t.Cleanup(func() { _ = srv.Thaw() })
	s.pair()
	s.submit(victim("victim"), bystander("bystander"))
	a, p := s.waitRunning("victim")
	s.waitRunning("bystander")
	before, _ := s.leaderNow()

	frozeAt := time.Now()
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	s.deletePod(p)
	t.Logf("PostgreSQL frozen; the victim's pod %s deleted", p.Name)
	time.Sleep(2 * lease) // the fault itself: past the lease
	thawAt := time.Now()
	if err := srv.Thaw(); err != nil {
		t.Fatal(err)
	}
	t.Logf("PostgreSQL thawed after %s", thawAt.Sub(frozeAt).Round(time.Millisecond))
	// The loss is the fault from the moment the board is back: nothing
	// could be judged before.
	f := s.harm(fmt.Sprintf("PostgreSQL frozen %s, pod deleted in it (from the thaw)", thawAt.Sub(frozeAt).Round(100*time.Millisecond)),
		a, max(agentLost, podLostFloor))
	f.at = thawAt

	gaps := leaderless{}
	var regained board.Lease
	s.eventually(time.Minute, "a replica to lead after the thaw and the victim to be reaped", func() bool {
		gaps.sample(s)
		if l, ok := s.leaderNow(); ok && l.Held(time.Now()) && regained.Term == 0 && l.RenewedAt.After(thawAt) {
			regained = l
		}
		ds, err := s.decisions()
		return err == nil && regained.Term != 0 && reapOf(ds, f) != nil
	})
	longest := gaps.end()
	ds, err := s.decisions()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range appliedBetween(ds, frozeAt, thawAt) {
		t.Errorf("applied while PostgreSQL was frozen: %s %s %s (term %d)", d.Reaper, d.Label, d.Attempt, d.Term)
	}
	r := reapOf(ds, f)
	s.finish()
	s.row.note("PostgreSQL frozen %s: term %d before, %d after (renewed %+.1fs from the thaw); longest without a leader after the thaw %s; thaw to the reap %s; fence refusals %d",
		thawAt.Sub(frozeAt).Round(100*time.Millisecond), before.Term, regained.Term, regained.RenewedAt.Sub(thawAt).Seconds(),
		longest.Round(100*time.Millisecond), r.At.Sub(thawAt).Round(100*time.Millisecond), s.fenceRefusals())
}

// The board's primary has a synchronous standby and both replicas' DSN
// names both (target_session_attrs=read-write). Once a reap is applied,
// the primary is killed -9 and the standby promoted, and a second attempt's
// pod is deleted with it. The replicas follow the promotion without a
// restart; every decision applied on the primary is in the promoted board's
// audit, the lease row is at least the one last renewed there, the reaped
// attempt stays reaped; the second loss is reaped and the run finishes.
func failoverSynchronous(t *testing.T, c *kubetest.Cluster) {
	primary, standby := pgtest.NewFailoverPair(t, "board", pgtest.StandbyOptions{Synchronous: true})
	s := newScenarioBoard(t, 16, "failover to a synchronous standby", c, nil, pgtest.FailoverDSN("board", primary, standby))
	s.pair()
	s.submit(victim("victim"), victim("late"), bystander("bystander"))
	a, p := s.waitRunning("victim")
	b, pb := s.waitRunning("late")
	s.waitRunning("bystander")

	// Something acknowledged just before the failover: a reap.
	s.deletePod(p)
	s.podGone(p.Name, 30*time.Second)
	fa := s.harm("pod deleted before the failover", a, max(agentLost, podLostFloor))
	s.waitReaped(fa, time.Minute)
	onPrimary, ok := s.leaderNow()
	if !ok {
		t.Fatal("no lease row on the primary")
	}
	applied, err := s.decisions()
	if err != nil {
		t.Fatal(err)
	}
	pids := map[*daemon]int{}
	for _, d := range s.daemons {
		pids[d] = d.pid()
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	killedAt := time.Now()
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	s.deletePod(pb)
	fb := s.harm("primary killed -9, pod deleted with it", b, max(agentLost, podLostFloor))
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promotedAt := time.Now()
	s.pool.Reset()

	onStandby, ok := s.leaderNow()
	if !ok || onStandby.Term < onPrimary.Term || (onStandby.Term == onPrimary.Term &&
		(onStandby.Holder != onPrimary.Holder || onStandby.RenewedAt.Before(onPrimary.RenewedAt))) {
		t.Errorf("lease on the promoted standby %+v (found %v), want at least the primary's last %+v", onStandby, ok, onPrimary)
	}
	gaps := leaderless{}
	var renewedAt time.Time
	s.eventually(time.Minute, "a lease renewal on the promoted standby and the second reap", func() bool {
		gaps.sample(s)
		if l, ok := s.leaderNow(); ok && renewedAt.IsZero() && l.Held(time.Now()) && l.RenewedAt.After(promotedAt) {
			renewedAt = l.RenewedAt
		}
		ds, err := s.decisions()
		return err == nil && !renewedAt.IsZero() && reapOf(ds, fb) != nil
	})
	longest := gaps.end()
	l, _ := s.leaderNow()
	ds, err := s.decisions()
	if err != nil {
		t.Fatal(err)
	}
	// Every decision the primary had applied is on the promoted board.
	kept := 0
	for _, want := range applied {
		if !want.Applied {
			continue
		}
		found := false
		for _, d := range ds {
			if d.ID == want.ID && d.Applied && d.Label == want.Label && d.Attempt == want.Attempt && d.Term == want.Term {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("an applied decision of the primary is not on the promoted board: %s %s %s (term %d)", want.Reaper, want.Label, want.Attempt, want.Term)
			continue
		}
		kept++
	}
	// Followed without a restart: the same processes, all running.
	for d, pid := range pids {
		if d.exited() || d.pid() != pid {
			t.Errorf("%s did not ride the failover out (exited %v)", d.name, d.exited())
		}
	}
	r := reapOf(ds, fb)
	s.finish()
	s.row.note("kill to promotion %s; kill to the first lease renewal on the promoted standby %s; term %d before, %d after; longest without a leader %s; kill to the second reap %s; %d applied decisions before the kill, all kept; fence refusals %d",
		promotedAt.Sub(killedAt).Round(100*time.Millisecond), renewedAt.Sub(killedAt).Round(100*time.Millisecond),
		onPrimary.Term, l.Term, longest.Round(100*time.Millisecond), r.At.Sub(killedAt).Round(100*time.Millisecond), kept,
		s.fenceRefusals())
}

// configSecondLease writes the scenario's configuration for a replica on a
// Kubernetes Lease of its own (name), with a lease of leaseFor renewed
// every renew: the Kubernetes Lease is no fence (client-go promises no
// single acting leader), so two replicas may each hold one, and the
// board's term, checked with its holder on every write, is what keeps them
// from both writing.
func (s *scenario) configSecondLease(name string, leaseFor, renew time.Duration) string {
	s.t.Helper()
	b, err := os.ReadFile(s.config())
	if err != nil {
		s.t.Fatal(err)
	}
	text := string(b)
	for _, r := range [][2]string{
		{`name       = "reaperd"`, fmt.Sprintf("name       = %q", name)},
		{fmt.Sprintf("lease      = %q", lease), fmt.Sprintf("lease      = %q\n  renew      = %q", leaseFor, renew)},
	} {
		if !strings.Contains(text, r[0]) {
			s.t.Fatalf("the configuration holds no %s", r[0])
		}
		text = strings.Replace(text, r[0], r[1], 1)
	}
	path := s.config() + "." + name + ".hcl"
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		s.t.Fatal(err)
	}
	return path
}

// configHeartbeat rewrites the configuration at path (a copy beside it)
// with the agents' heartbeat every, and agent_lost and settling_grace
// above it as the ladder asks.
func (s *scenario) configHeartbeat(path string, every time.Duration) string {
	s.t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		s.t.Fatal(err)
	}
	text := string(b)
	for _, r := range [][2]string{
		{fmt.Sprintf("heartbeat              = %q", heartbeat), fmt.Sprintf("heartbeat              = %q", every)},
		{fmt.Sprintf("agent_lost             = %q", agentLost), fmt.Sprintf("agent_lost             = %q", 3*every/2)},
		{fmt.Sprintf("settling_grace         = %q", grace), fmt.Sprintf("settling_grace         = %q", 2*every)},
	} {
		if !strings.Contains(text, r[0]) {
			s.t.Fatalf("the configuration holds no %s", r[0])
		}
		text = strings.Replace(text, r[0], r[1], 1)
	}
	out := strings.TrimSuffix(path, ".hcl") + ".heartbeat.hcl"
	if err := os.WriteFile(out, []byte(text), 0o600); err != nil {
		s.t.Fatal(err)
	}
	return out
}

// The board's standby is asynchronous and stops streaming while the lease
// row holds term N, led by replica 1. Replica 2 runs on a Kubernetes Lease
// of its own (the Kubernetes Lease does not promise one leader; the
// board's term is the fence) and renews only every 10 s (a 15 s lease).
// Replica 1 is killed; replica 2 takes term N+1 and writes under it on the
// primary alone. Replica 1 restarted (replica 3) follows. Right after a
// renewal of replica 2, replica 2 is frozen (SIGSTOP), the primary killed
// -9, a running attempt's pod deleted, and the standby promoted: its lease
// row holds term N, so replica 3 is handed term N+1 again. Replica 2 is
// thawed within its renewal period, still believing it leads N+1, and
// runs a cycle: the fence refuses its writes for their holder, it steps
// down, and nothing of it applies; replica 3 reaps the attempt and the
// history's checker finds one writer per term. The late task, dispatched
// by replica 2 on the primary alone, is offered again by the promoted
// board under the same try and epoch while its first pod, heartbeating
// once a minute, still runs: the runner deletes that pod and creates the
// new one only once it is gone (the checker: no overlapping executions).
func failoverAsyncLostTerm(t *testing.T, c *kubetest.Cluster) {
	primary, standby := pgtest.NewFailoverPair(t, "board", pgtest.StandbyOptions{})
	s := newScenarioBoard(t, 17, "async failover, a term increment lost", c, nil, pgtest.FailoverDSN("board", primary, standby))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const survivorLease, survivorRenew = 15 * time.Second, 10 * time.Second
	d1 := s.startDaemon()
	if l := s.leader(30 * time.Second); l != d1 {
		t.Fatalf("replica 1 does not lead")
	}
	// Replica 2's pods heartbeat once a minute: the late task's first
	// execution, which replica 2 alone dispatches, hears nothing of the
	// failover before the promoted board has run the task again (with the
	// suite's second, it would be told to stop before that).
	d2 := s.startDaemonWith(s.configHeartbeat(s.configSecondLease("reaperd-second", survivorLease, survivorRenew),
		time.Minute))
	t.Cleanup(func() { _ = d2.thaw() })
	// The gate task ends, and the late task after it is dispatched and
	// runs, in the lost window.
	gate := taskSpec{id: "gate", gate: "gate.release"}
	late := taskSpec{id: "late", upstreams: []string{"gate"}, lost: true}
	s.submit(victim("victim"), bystander("bystander"), gate, late)
	a, p := s.waitRunning("victim")
	s.waitRunning("bystander")
	ga, _ := s.waitRunning("gate")
	termN, _ := s.leaderNow()
	if !d1.holds(termN.Holder) {
		t.Fatalf("replica 1 does not lead: %+v", termN)
	}

	// The standby has term N, then nothing more.
	if err := standby.WaitCaughtUp(ctx, primary); err != nil {
		t.Fatal(err)
	}
	if err := standby.StopStreaming(ctx); err != nil {
		t.Fatal(err)
	}
	lostFrom := time.Now()
	t.Logf("the standby stopped streaming at term %d", termN.Term)

	// Replica 1 dies; replica 2 takes N+1 on the primary alone.
	d1.kill()
	var termB board.Lease
	s.eventually(2*survivorRenew+lease, "replica 2 to lead", func() bool {
		l, ok := s.leaderNow()
		termB = l
		return ok && l.Held(time.Now()) && d2.holds(l.Holder)
	})
	if termB.Term != termN.Term+1 {
		t.Fatalf("replica 2 leads under term %d, want %d", termB.Term, termN.Term+1)
	}
	// On the primary alone: the gate succeeds, the late task is queued,
	// its pod made and its execution started.
	if err := os.WriteFile(filepath.Join(s.taskDir, gate.gate), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s.eventually(30*time.Second, "the late task to start on the primary alone", func() bool {
		return s.execLog("late").starts > 0
	})
	lateRow, err := s.taskRow("late")
	if err != nil {
		t.Fatal(err)
	}
	latePod, err := s.podOf(lateRow.Attempt)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("in the window: the gate %s ended, the late task runs as %s in pod %s", ga, lateRow.Attempt, latePod.Name)
	d3 := s.startDaemon()

	// Right after a renewal of replica 2, freeze it.
	last, _ := s.leaderNow()
	s.eventually(survivorRenew+5*time.Second, "replica 2 to renew its lease", func() bool {
		l, ok := s.leaderNow()
		return ok && l.Term == termB.Term && l.RenewedAt.After(last.RenewedAt)
	})
	renewed, _ := s.leaderNow()
	if err := d2.freeze(); err != nil {
		t.Fatal(err)
	}
	frozeAt := time.Now()
	killedAt := time.Now()
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	s.deletePod(p)
	f := s.harm("primary killed -9 a term ahead of its async standby, pod deleted", a, max(agentLost, podLostFloor))
	// The gate's success was reported to the primary alone: the promoted
	// board has it running, silent; a mark is allowed, which its pod's
	// record must override.
	s.harmed[ga] = true
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promotedAt := time.Now()
	s.pool.Reset()
	if l, ok := s.leaderNow(); !ok || l.Term != termN.Term || l.Holder != termN.Holder {
		t.Fatalf("lease on the promoted standby %+v (found %v), want term %d held by replica 1", l, ok, termN.Term)
	}
	// Replica 3 is handed N+1 again while replica 2 is frozen.
	gaps := leaderless{since: killedAt}
	var termC board.Lease
	s.eventually(20*time.Second, "replica 3 to lead on the promoted standby", func() bool {
		gaps.sample(s)
		l, ok := s.leaderNow()
		termC = l
		return ok && l.Held(time.Now()) && d3.holds(l.Holder)
	})
	if termC.Term != termB.Term {
		t.Fatalf("replica 3 leads under term %d on the promoted standby, want the lost term %d again", termC.Term, termB.Term)
	}
	thawAt := time.Now()
	if left := renewed.RenewedAt.Add(survivorRenew).Sub(thawAt); left < time.Second {
		t.Fatalf("the failover took until %s before replica 2's next renewal: it would learn of it from its renewal, not the fence",
			left.Round(time.Millisecond))
	}
	if err := d2.thaw(); err != nil {
		t.Fatal(err)
	}
	t.Logf("replica 2 frozen %s; term %d was %s's on the primary and is %s's on the promoted standby",
		thawAt.Sub(frozeAt).Round(time.Millisecond), termB.Term, d2.name, d3.name)
	var downAt time.Time
	s.eventually(survivorRenew, "replica 2's fenced write to be refused and replica 2 to step down", func() bool {
		gaps.sample(s)
		b, _ := os.ReadFile(d2.log)
		if strings.Contains(string(b), "it no longer leads; stepping down") {
			downAt = time.Now()
			return true
		}
		return false
	})
	s.waitReaped(f, time.Minute)
	longest := gaps.end()
	if l, ok := s.leaderNow(); !ok || l.Term != termC.Term || !d3.holds(l.Holder) {
		t.Errorf("after the step-down the lease is %+v (found %v), want replica 3's term %d", l, ok, termC.Term)
	}
	ds, err := s.decisions()
	if err != nil {
		t.Fatal(err)
	}
	byD2 := 0
	for _, d := range ds {
		if d.Term == termB.Term && d.Applied && d2.holds(d.Holder) {
			byD2++
			t.Errorf("the promoted board holds an applied decision of term %d written by replica 2: %s %s %s", d.Term, d.Reaper, d.Label, d.Attempt)
		}
		if d.Term == termB.Term && d.Applied && d.At.Before(termC.AcquiredAt) {
			t.Errorf("the promoted board holds an applied decision of term %d from before replica 3 took it: %s %s %s", d.Term, d.Reaper, d.Label, d.Attempt)
		}
	}
	rfs, err := s.store.FenceRefusals(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	kept := 0
	for _, r := range rfs {
		if r.Term == termB.Term && d2.holds(r.Holder) {
			kept++
			if r.Why() != board.RefusedHolder || r.LeadTerm != termC.Term || r.LeadHolder != termC.Holder {
				t.Errorf("replica 2's refusal %+v (%s), want refused for its holder against replica 3's term %d", r, r.Why(), termC.Term)
			}
		}
	}
	if kept == 0 {
		t.Errorf("the board recorded none of replica 2's refused writes: %+v", rfs)
	}
	refusedLog := s.fenceRefusals()
	r := reapOf(ds, f)
	s.finish()
	// The late task ran in the window and was dispatched again by the
	// promoted board; its executions never overlapped (finish: no double,
	// the checker: no overlap).
	lateLog := s.execLog("late")
	xs, err := readExecutions(filepath.Join(s.taskDir, "late.log"), "late")
	if err != nil {
		t.Fatal(err)
	}
	between := "-"
	if len(xs) == 2 && !xs[0].End.IsZero() {
		between = xs[1].Start.Sub(xs[0].End).Round(time.Millisecond).String()
		t.Logf("the late task's first execution ended (%s) at kill %+.1fs, the second started at kill %+.1fs",
			xs[0].Outcome, xs[0].End.Sub(killedAt).Seconds(), xs[1].Start.Sub(killedAt).Seconds())
	}
	t.Logf("the late task: %d executions (%d ended), %d overlapping", lateLog.starts, lateLog.ends, lateLog.doubles)
	s.row.note("the late task dispatched in the window (pod %s): %d executions, %d at once, %s from the first's end to the second's start",
		latePod.Name, lateLog.starts, lateLog.doubles, between)
	s.row.note("lost window %s (streaming stopped to the kill); term %d: %s's on the primary, %s's again on the promoted standby; %s's writes refused by the fence: %d in its log, %d recorded on the board (holder), stepped down %s after its thaw, applied 0 (found %d); kill to promotion %s; longest without a leader from the kill %s; kill to the reap %s",
		killedAt.Sub(lostFrom).Round(100*time.Millisecond), termB.Term, d2.name, d3.name, d2.name, refusedLog, kept,
		downAt.Sub(thawAt).Round(time.Millisecond), byD2, promotedAt.Sub(killedAt).Round(100*time.Millisecond),
		longest.Round(100*time.Millisecond), r.At.Sub(killedAt).Round(100*time.Millisecond))
}

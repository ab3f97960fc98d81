package e2e_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/history"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// The PostgreSQL nemeses: the board's server stalls rather than dies, and
// the primary is lost and a standby promoted, synchronous or behind.

// 11. Two replicas; PostgreSQL's processes are stopped (SIGSTOP, as a disk
// whose I/O hangs would stall them) for longer than the lease, then
// resumed. Every query of the replicas hangs until its bound instead of
// failing at once; an agent and its task die meanwhile. Nothing is applied
// while the board hangs; after the thaw a replica starts a new term,
// settles, leaves the live attempts alone and recovers the dead one.
func postgresFrozen(t *testing.T, mon *monitor) {
	srv, dsn := ownBoard(t, "frozen")
	s := newScenario(t, 11, "PostgreSQL I/O frozen past the lease", mon, dsn)
	// Registered after the scenario's own cleanups, so it runs before
	// them: the dump of a failed scenario reads the board.
	t.Cleanup(func() { _ = srv.Thaw() })
	d1, cfg := s.startWork(liteReapers)
	d2 := s.startDaemon(cfg)
	s.eventually(10*time.Second, "the follower to report its telemetry", func() bool {
		_, ok := d2.metric("reaper_leader")
		return ok
	})
	before, _ := s.leaderNow()

	frozeAt := time.Now()
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	vf := s.harmAgent("victim", true, "agent and task group killed while PostgreSQL was frozen")
	// The freeze is the fault: past the lease, and until no replica trusts
	// the lease it held (its renewals hung past the lease's trusted part,
	// it tries to acquire one: the elector logs each such try that fails).
	// Its cycles are no sign: each waits out the bound of every call.
	s.eventually(20*time.Second, "every replica to stop leading while the board hangs", func() bool {
		for _, d := range []*daemon{d1, d2} {
			if d.count("lease acquisition failed", frozeAt, time.Time{}) == 0 {
				return false
			}
		}
		return true
	})
	for time.Since(frozeAt) < lease+2*renewEvery {
		time.Sleep(100 * time.Millisecond)
	}
	thawAt := time.Now()
	if err := srv.Thaw(); err != nil {
		t.Fatal(err)
	}
	s.controlFault(fmt.Sprintf("PostgreSQL frozen for %s", thawAt.Sub(frozeAt).Round(100*time.Millisecond)),
		thawAt, renewEvery+grace, vf.target)
	for _, d := range []*daemon{d1, d2} {
		if n := d.count("decision", frozeAt, thawAt); n > 0 {
			t.Errorf("%s applied %d decisions while PostgreSQL was frozen", d.name, n)
		}
		// A hang, not a refusal: nothing told the replicas the server was
		// gone.
		for _, l := range d.lines() {
			if !l.at.Before(frozeAt) && !l.at.After(thawAt) && strings.Contains(l.text, "connection refused") {
				t.Errorf("%s was refused a connection while PostgreSQL was frozen: %s", d.name, l.text)
				break
			}
		}
	}

	// The longest stretch without a leader after the thaw, sampled until
	// the dead attempt is reaped.
	gaps := leaderless{since: thawAt}
	var r decision
	s.eventually(40*time.Second, "the reap of "+vf.target.String(), func() bool {
		gaps.sample(s)
		ds, err := s.decisions(vf.target.TaskID)
		if err != nil {
			return false
		}
		if got := reapOf(ds, *vf.target); got != nil {
			r = *got
			return true
		}
		return false
	})
	if !gaps.since.IsZero() {
		gaps.longest = max(gaps.longest, time.Since(gaps.since))
	}
	l, leader := s.waitAnyLeader(10 * time.Second)
	if l.Term <= before.Term {
		t.Errorf("leading under term %d after the freeze, want a new term after %d", l.Term, before.Term)
	}
	s.checkSettled(r, l)
	firstCycle := s.firstDecisionOf(l.Term)
	// A replica's acquisition sent while the board hung is applied at the
	// thaw, dated when it was sent: its acquired_at may precede the thaw.
	s.row.note("longest time without a leader after the thaw %s (sampled every 100ms); term %d (%s) acquired at thaw %+.1fs, its first cycle at thaw %+.1fs; thaw to the reap %s",
		gaps.longest.Round(100*time.Millisecond), l.Term, leader.name, l.AcquiredAt.Sub(thawAt).Seconds(),
		firstCycle.Sub(thawAt).Seconds(), r.At.Sub(thawAt).Round(100*time.Millisecond))
	s.waitRecovered("victim")
	s.finish()
}

// firstDecisionOf is the time of the first decision audited under term:
// the gate's settling skip of the term's first cycle.
func (s *scenario) firstDecisionOf(term int64) time.Time {
	s.t.Helper()
	ds, err := s.decisions("")
	if err != nil {
		s.t.Fatal(err)
	}
	for _, d := range ds {
		if d.Term == term {
			return d.At
		}
	}
	s.t.Errorf("no decision audited under term %d", term)
	return time.Time{}
}

// 12. The board's primary has a synchronous standby, and every replica's
// DSN names both. Once the leader has reported a reap applied, the
// primary is killed and the standby promoted, and an agent and its task
// die with it. The replicas follow the promotion without a restart;
// nothing the board acknowledged is lost: the lease row is the one last
// renewed on the primary, every decision a replica reported applied is in
// the promoted board's audit, the reaped attempt stays reaped; the dead
// attempt is recovered and the run finishes.
func failoverSynchronous(t *testing.T, mon *monitor) {
	primary, standby, dsn := failoverBoard(t, pgtest.StandbyOptions{Synchronous: true})
	s := newScenario(t, 12, "failover to a synchronous standby", mon, dsn)
	d1, cfg := s.startWork(liteReapers, victim("victim"), victim("late"), bystander("by1"), bystander("by2"))
	d2 := s.startDaemon(cfg)
	s.eventually(10*time.Second, "the follower to report its telemetry", func() bool {
		_, ok := d2.metric("reaper_leader")
		return ok
	})

	// Something acknowledged just before the failover: a reap.
	f := s.harmAgent("victim", true, "agent and task group killed before the failover")
	reaped := s.waitReaped(*f.target, 30*time.Second)
	s.eventually(10*time.Second, "the leader to report the reap applied", func() bool {
		for _, l := range d1.appliedAfter(time.Time{}) {
			if l.ev.Task == "victim" {
				return true
			}
		}
		return false
	})
	onPrimary, ok := s.leaderNow()
	if !ok {
		t.Fatal("no lease row on the primary")
	}

	ctx, cancel := context.WithTimeout(s.ctx(), time.Minute)
	defer cancel()
	killedAt := time.Now()
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	lf := s.harmAgent("late", true, "agent and task group killed with the primary")
	// Baselines of the replicas' passes: the first clean pass after them
	// ran on the promoted standby.
	passes, failures := map[*daemon]float64{}, map[*daemon]int{}
	for _, d := range []*daemon{d1, d2} {
		passes[d], failures[d] = d.passes("agentlost"), d.passFailures("agentlost")
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promotedAt := time.Now()
	s.promoted()
	s.controlFault(fmt.Sprintf("primary killed, synchronous standby promoted %s later", promotedAt.Sub(killedAt).Round(100*time.Millisecond)),
		killedAt, lease+renewEvery+grace, lf.target)

	// The lease row is the one last renewed on the primary, or a later
	// renewal of the same term: the synchronous standby lost none.
	onStandby, ok := s.leaderNow()
	if !ok || onStandby.Term < onPrimary.Term || (onStandby.Term == onPrimary.Term &&
		(onStandby.Holder != onPrimary.Holder || onStandby.RenewedAt.Before(onPrimary.RenewedAt))) {
		t.Errorf("lease on the promoted standby %+v (found %v), want at least the primary's last %+v", onStandby, ok, onPrimary)
	}
	// The reap stays: the attempt the primary acknowledged as reaped is not
	// running again at its epoch on the promoted board.
	if ti, err := s.store.TaskInstance(s.ctx(), runID, "victim"); err != nil {
		t.Fatal(err)
	} else if ti.Attempt == reaped.Attempt && ti.State == sdk.StateRunning {
		t.Errorf("the promoted board shows %s running: the reap the primary acknowledged is lost", ti.Attempt)
	}

	var renewedAt, cleanAt time.Time
	var cleanBy *daemon
	s.eventually(40*time.Second, "a replica to renew the lease and run a clean pass on the promoted standby", func() bool {
		if renewedAt.IsZero() {
			if l, ok := s.leaderNow(); ok && l.RenewedAt.After(promotedAt) {
				renewedAt = l.RenewedAt
			}
		}
		if cleanAt.IsZero() {
			for _, d := range []*daemon{d1, d2} {
				if at := time.Now(); d.passedCleanly("agentlost", passes[d], failures[d]) {
					cleanAt, cleanBy = at, d
					break
				}
			}
		}
		return !renewedAt.IsZero() && !cleanAt.IsZero()
	})
	l, leader := s.waitAnyLeader(20 * time.Second)
	t.Logf("after the failover %s leads under term %d (before: %s, term %d)", leader.name, l.Term, d1.name, onPrimary.Term)
	r := s.waitReaped(*lf.target, 40*time.Second)
	if r.Term != onPrimary.Term {
		s.checkSettled(r, l)
	}
	s.waitRecovered("victim")
	s.waitRecovered("late")
	kept := s.checkAppliedKept()
	s.row.note("kill to promotion %s; kill to the first lease renewal on the promoted standby %s; kill to the first clean cycle there (%s) %s; term %d before, %d after; %d applied decisions reported, all kept",
		promotedAt.Sub(killedAt).Round(100*time.Millisecond), renewedAt.Sub(killedAt).Round(100*time.Millisecond),
		cleanBy.name, cleanAt.Sub(killedAt).Round(100*time.Millisecond), onPrimary.Term, l.Term, kept)
	s.finish()
}

// 13. The board's standby is asynchronous and falls behind (it stops
// streaming) while the lease row holds term N, led by replica 1. Replica 1
// is killed; replica 2 takes term N+1 and writes under it on the primary.
// Replica 2 renews only every 10 s (its own leader block: a 15 s lease),
// so that after its last renewal it believes it leads N+1 for a while
// whatever happens to the board. It is frozen (SIGSTOP) right after that
// renewal; the primary is killed, an agent and its task die with it, and
// the standby is promoted: its lease row holds term N, replica 2's term
// and writes are lost. Replica 1 restarted (replica 3) acquires there and
// is handed term N+1 again. Replica 2 is thawed within its renewal period,
// still believing it leads N+1, and runs a cycle.
//
// What is proven: the board's fence refuses replica 2's writes of N+1 (it
// counts them in reaper_fence_refused_total, logs that it steps down, for
// term N+1, and the board records the refusal in fence_refusals: term N+1
// claimed by replica 2, met held by replica 3), replica 2 reports no
// decision applied after the thaw, replica 3 holds N+1 on the board from
// its acquisition to the end, and the promoted board's audit holds no
// applied decision of N+1 written by replica 2 (each audit row names its
// holder) nor dated before replica 3 took it: of the two replicas handed
// term N+1, only replica 3's writes applied. The scenario's fault history
// holds the refusal as a write refused by the fence, and the checker
// proves it stale. A fence on the term alone would have let replica 2's
// writes through beside replica 3's (board's
// TestFailoverToAnAsyncStandbyThatLostATermIncrementDoesNotHandTheTermTwice
// shows that on the store).
func failoverAsyncLostTerm(t *testing.T, mon *monitor) {
	primary, standby, dsn := failoverBoard(t, pgtest.StandbyOptions{})
	s := newScenario(t, 13, "async failover, a term increment lost", mon, dsn)
	ctx, cancel := context.WithTimeout(s.ctx(), 2*time.Minute)
	defer cancel()
	d1, cfg1 := s.startWork(liteReapers)
	// Replica 2 renews every survivorRenew; its lease is trusted for 12 s.
	const survivorRenew = 10 * time.Second
	d2 := s.startDaemon(s.configWith(liteReapers, leaderTiming{lease: 15 * time.Second, renew: survivorRenew}))
	t.Cleanup(func() { _ = d2.thaw() })
	s.eventually(10*time.Second, "the follower to report its telemetry", func() bool {
		_, ok := d2.metric("reaper_leader")
		return ok
	})
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
	t.Logf("%s: the standby stopped streaming at term %d", time.Now().Format("15:04:05.000"), termN.Term)

	// Replica 1 dies; replica 2 takes N+1 and writes under it.
	d1.kill()
	termB := s.waitLeader(d2, 2*survivorRenew+lease)
	if termB.Term != termN.Term+1 {
		t.Fatalf("replica 2 leads under term %d, want %d", termB.Term, termN.Term+1)
	}
	s.eventually(3*interval, fmt.Sprintf("a write of term %d on the primary", termB.Term), func() bool {
		return s.gateSkips(termB.Term) > 0
	})
	// Replica 1 restarted: a follower while replica 2 holds N+1.
	d3 := s.startDaemon(cfg1)

	// Right after a renewal of replica 2, freeze it.
	s.eventually(survivorRenew+5*time.Second, "replica 2 to renew its lease", func() bool {
		l, ok := s.leaderNow()
		return ok && l.Term == termB.Term && l.RenewedAt.After(termB.RenewedAt)
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
	vf := s.harmAgent("victim", true, "agent and task group killed with the primary")
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promotedAt := time.Now()
	s.promoted()
	s.controlFault(fmt.Sprintf("primary killed, asynchronous standby a term behind promoted %s later",
		promotedAt.Sub(killedAt).Round(100*time.Millisecond)), killedAt, lease+renewEvery+grace, vf.target)

	// The promoted board holds the old term.
	if l, ok := s.leaderNow(); !ok || l.Term != termN.Term || l.Holder != termN.Holder {
		t.Fatalf("lease on the promoted standby %+v (found %v), want term %d held by replica 1 as the standby last had it", l, ok, termN.Term)
	}
	// Replica 3 is handed N+1 again while replica 2 is frozen.
	termC := s.waitLeader(d3, 20*time.Second)
	if termC.Term != termB.Term {
		t.Fatalf("replica 3 leads under term %d on the promoted standby, want the lost term %d again", termC.Term, termB.Term)
	}
	// Replica 2 still believes it leads: it has not tried to renew since.
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

	// The fence refuses replica 2's first write of N+1 on the promoted
	// board, and it steps down.
	s.eventually(survivorRenew, "replica 2's fenced write to be refused and replica 2 to step down", func() bool {
		return len(d2.stepDowns()) > 0
	})
	down := d2.stepDowns()[0]
	if down.ev.Term != termB.Term {
		t.Errorf("replica 2 stepped down from term %d, want %d", down.ev.Term, termB.Term)
	}
	// At the thaw the board's lease is term N+1, replica 3's and running
	// (it renews every second): of the fence's clauses (term, holder, lease
	// not run out at the write's time) only the holder can refuse replica
	// 2's writes. The runner's refusal says so in its words.
	why := fmt.Sprintf("term %d is held by %s on the board, not by this replica", termB.Term, termC.Holder)
	for _, l := range d2.lines() {
		if l.at.After(thawAt) && strings.Contains(l.text, why) {
			t.Logf("%s: %s", d2.name, l.text)
			break
		}
	}
	refused, _ := d2.metric("reaper_fence_refused_total")
	if refused < 1 {
		t.Errorf("replica 2's reaper_fence_refused_total is %v after its step-down", refused)
	}
	var writes []string
	for _, l := range d2.lines() {
		if l.ev.Message == stepDownMsg {
			writes = append(writes, l.ev.Write)
		}
	}
	for _, l := range d2.appliedAfter(frozeAt) {
		t.Errorf("replica 2 applied a decision after the failover: %s", l.text)
	}

	r := s.waitReaped(*vf.target, 40*time.Second)
	s.checkSettled(r, termC)
	if l, ok := s.leaderNow(); !ok || l.Term != termC.Term || !d3.holds(l.Holder) {
		t.Errorf("after the step-down the lease is %+v (found %v), want replica 3's term %d", l, ok, termC.Term)
	}
	ds, err := s.decisions("")
	if err != nil {
		t.Fatal(err)
	}
	byTermC := 0
	for _, d := range ds {
		if d.Term == termB.Term && d.Applied && d.At.Before(termC.AcquiredAt) {
			t.Errorf("the promoted board holds an applied decision of term %d from before replica 3 took it: %+v", d.Term, d)
		}
		if d.Term == termB.Term && d.Applied && d2.holds(d.Holder) {
			t.Errorf("the promoted board holds an applied decision of term %d written by replica 2 (%s): %+v", d.Term, d.Holder, d)
		}
		if d.Term == termB.Term && d3.holds(d.Holder) {
			byTermC++
		}
	}
	if byTermC == 0 {
		t.Errorf("no audit row of term %d names replica 3 (%s) as its writer", termB.Term, termC.Holder)
	}
	// The board kept replica 2's refusals: term N+1 claimed by replica 2,
	// met held by replica 3.
	rfs, err := s.store.FenceRefusals(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var kept []board.FenceRefusal
	for _, r := range rfs {
		if r.Term == termB.Term && d2.holds(r.Holder) {
			kept = append(kept, r)
			if r.Why() != board.RefusedHolder || r.LeadTerm != termC.Term || r.LeadHolder != termC.Holder {
				t.Errorf("replica 2's refusal %+v (%s), want refused for its holder against replica 3's term %d", r, r.Why(), termC.Term)
			}
		}
	}
	if len(kept) == 0 {
		t.Errorf("the board recorded none of replica 2's refused writes: %+v", rfs)
	}
	replica2 := ""
	if len(kept) > 0 {
		replica2 = kept[0].Holder
	}
	s.waitRecovered("victim")
	refused, _ = d2.metric("reaper_fence_refused_total")
	s.row.note("term %d handed to %s on the primary and again to %s on the promoted standby; %s's writes refused by the fence: %v (first: %s), %d recorded on the board, stepped down %s after its thaw; %s's applied: 0",
		termB.Term, d2.name, d3.name, d2.name, refused, strings.Join(writes, ", "), len(kept),
		down.at.Sub(thawAt).Round(time.Millisecond), d2.name)
	s.finish()

	// The history holds replica 2's refusals as writes refused by the
	// fence, with what the fence met (and the checker, in finish, found
	// them stale).
	events, err := history.Read(filepath.Join(s.dir, historyFile))
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, e := range events {
		if e.Kind == history.KindWrite && e.Outcome == history.OutcomeDeposed && e.Term == termB.Term && e.Holder == replica2 {
			found++
			if e.Fence == nil || e.Fence.Term != termC.Term || e.Fence.Holder != termC.Holder {
				t.Errorf("replica 2's refusal in the history: %+v fence %+v", e, e.Fence)
			}
			if found == 1 {
				t.Logf("history: %s under term %d by %s refused (%s)", e.Op, e.Term, e.Holder, e.Note)
			}
		}
	}
	if replica2 != "" && found == 0 {
		t.Errorf("the history holds no refused write of replica 2 under term %d", termB.Term)
	}
}

package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dexaflow/reaper/substrate/lite/proc"
)

// Fault kinds.
const (
	FaultAgentKill      = "kill_agent"
	FaultAgentGroupKill = "kill_agent_and_group"
	FaultEscapedKill    = "kill_escaped_child"
	FaultLeaderKill     = "kill_leader"
	FaultPluginKill     = "kill_plugin"
	FaultAgentPause     = "pause_agent"
	FaultLeaderPause    = "pause_leader"
	FaultPostgres       = "restart_postgres"
	FaultBurst          = "burst_of_runs"
	// The nemeses (Lite): one replica partitioned from PostgreSQL, the
	// primary's I/O frozen, the primary lost and its standby promoted
	// (once a soak: no standby is left after it), synchronous or, its
	// pick odd, made asynchronous and behind (FaultFailoverAsync,
	// asyncfailover_test.go).
	FaultPartition = "partition_replica_from_postgres"
	FaultFreeze    = "freeze_postgres"
	FaultFailover  = "failover_to_sync_standby"
)

// nemeses are the fault kinds the report follows one by one: what they
// cost the cluster in leadership and fenced writes.
var nemeses = []string{FaultPartition, FaultFreeze, FaultFailover}

// once are the kinds drawn at most once a soak.
var once = map[string]bool{FaultFailover: true}

// faultWeight is how often a kind of fault is drawn.
type faultWeight struct {
	kind   string
	weight int
}

// faultWeights: the Lite edition's draw.
var faultWeights = []faultWeight{
	{FaultAgentKill, 4}, {FaultAgentGroupKill, 4}, {FaultEscapedKill, 2}, {FaultLeaderKill, 2},
	{FaultPluginKill, 2}, {FaultAgentPause, 3}, {FaultLeaderPause, 2}, {FaultPostgres, 1}, {FaultBurst, 1},
	{FaultPartition, 2}, {FaultFreeze, 1}, {FaultFailover, 1},
}

// injector throws faults at the system: one every 1 to 3.5 seconds, each on
// a goroutine of its own, so faults with a duration (a pause, a restart)
// overlap with the ones after.
type injector struct {
	s       *soak
	rng     *rand.Rand    // used only on the injector's goroutine
	weights []faultWeight // the edition's draw

	drawn map[string]bool // kinds drawn so far, for the ones drawn once; the injector's goroutine's

	mu      sync.Mutex
	faults  []*Fault
	skipped map[string]int
	paused  map[int]bool // agents under SIGSTOP
	cut     map[int]bool // replica slots partitioned from the database
	lost    []lostWrites // what asynchronous failovers lost
	wg      sync.WaitGroup
}

func newInjector(s *soak, weights []faultWeight) *injector {
	return &injector{s: s, rng: rand.New(rand.NewPCG(s.seed, 2)), weights: weights, drawn: map[string]bool{},
		skipped: map[string]int{}, paused: map[int]bool{}, cut: map[int]bool{}}
}

// draw draws a kind of fault, leaving out a kind drawn once already that
// is drawn at most once.
func (in *injector) draw() string {
	ws := in.weights
	if len(in.drawn) > 0 {
		ws = nil
		for _, w := range in.weights {
			if !(once[w.kind] && in.drawn[w.kind]) {
				ws = append(ws, w)
			}
		}
	}
	kind := drawWeighted(in.rng, ws, func(f faultWeight) int { return f.weight }).kind
	in.drawn[kind] = true
	return kind
}

// step is one fault as drawn: every choice it needs, drawn in order from
// the seed on the injector's goroutine (what it meets when it lands, which
// processes are up, is the system's).
type step struct {
	wait    time.Duration // after the previous fault
	kind    string
	pick    uint64        // which target among those sorted
	d1      time.Duration // a short outage: a replica's or PostgreSQL's downtime, a promotion's delay
	dPause  time.Duration // an agent's pause
	dLeader time.Duration // a leader's pause, past its lease
	// dCut is a partition's length and dFreeze a freeze's: either side of
	// the lease, up to past the lease and the settling grace.
	dCut, dFreeze time.Duration
}

// next draws the next step.
func (in *injector) next() step {
	st := step{wait: in.dur(time.Second, 3500*time.Millisecond)}
	st.kind = in.draw()
	st.pick = in.rng.Uint64()
	st.d1 = in.dur(500*time.Millisecond, 3*time.Second)
	st.dPause = in.dur(time.Second, 8*time.Second)
	st.dLeader = in.dur(lease+time.Second, lease+grace+2*time.Second)
	st.dCut = in.dur(lease/3, lease+grace+2*time.Second)
	st.dFreeze = in.dur(lease/3, lease+grace)
	return st
}

// dur draws a duration in [lo, hi).
func (in *injector) dur(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(in.rng.Int64N(int64(hi-lo)))
}

// run injects until ctx ends, then waits for every fault under way to be
// undone (paused processes resumed, killed replicas restarted).
func (in *injector) run(ctx context.Context) {
	defer in.wg.Wait()
	for {
		// Every choice is drawn here, on this goroutine, in order: the seed
		// decides them all.
		st := in.next()
		select {
		case <-ctx.Done():
			return
		case <-time.After(st.wait):
		}
		in.wg.Add(1)
		go func() {
			defer in.wg.Done()
			if _, err := in.inject(ctx, st); err != nil {
				in.mu.Lock()
				in.skipped[st.kind]++
				in.mu.Unlock()
			}
		}()
	}
}

// record adds a fault as it begins.
func (in *injector) record(f Fault) *Fault {
	in.mu.Lock()
	defer in.mu.Unlock()
	p := &f
	in.faults = append(in.faults, p)
	in.s.logf("fault %-22s %s", f.Kind, f.Detail)
	return p
}

// withdraw takes back a fault recorded before its action, which failed.
func (in *injector) withdraw(f *Fault) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for i, g := range in.faults {
		if g == f {
			in.faults = append(in.faults[:i], in.faults[i+1:]...)
			break
		}
	}
	in.s.logf("fault %-22s withdrawn: its request failed", f.Kind)
}

func (in *injector) ended(f *Fault) {
	in.mu.Lock()
	defer in.mu.Unlock()
	f.Ended = in.s.tl.now()
}

// list copies the faults so far.
func (in *injector) list() []Fault {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make([]Fault, len(in.faults))
	for i, f := range in.faults {
		out[i] = *f
	}
	return out
}

var errNoTarget = fmt.Errorf("no target")

func (in *injector) inject(ctx context.Context, st step) (*Fault, error) {
	s := in.s
	kind, pick, d1, dPause, dLeader := st.kind, st.pick, st.d1, st.dPause, st.dLeader
	switch kind {
	case FaultAgentKill, FaultAgentGroupKill:
		e, ok := in.target(pick)
		if !ok {
			return nil, errNoTarget
		}
		group := kind == FaultAgentGroupKill
		if _, err := proc.Signal(e.AgentPID, syscall.SIGKILL); err != nil {
			return nil, err
		}
		at := s.tl.now()
		detail := fmt.Sprintf("agent %d of %s", e.AgentPID, e.Attempt)
		if group {
			// Only the group the agent recorded, while its leader is still
			// the recorded process.
			if info, err := proc.Stat(e.PGID); err == nil && info.Start == e.LeaderStart && info.PGID == e.PGID {
				_, _ = proc.SignalGroup(e.PGID, syscall.SIGKILL)
			}
			detail += fmt.Sprintf(" and its task group %d", e.PGID)
		}
		a := e.Attempt
		// On the real node the agent is its container's main process: the
		// runtime kills the container's other processes, its task group, with it.
		killed := group || (s.kube != nil && s.kube.real != nil)
		f := in.record(Fault{Kind: kind, At: at, Ended: at, Target: &a, KilledGroup: killed, Detail: detail})
		return f, nil

	case FaultAgentPause:
		e, ok := in.target(pick)
		if !ok {
			return nil, errNoTarget
		}
		in.mu.Lock()
		in.paused[e.AgentPID] = true
		in.mu.Unlock()
		defer func() {
			in.mu.Lock()
			delete(in.paused, e.AgentPID)
			in.mu.Unlock()
		}()
		l, ok := s.obs.agentOf(e.AgentPID)
		if !ok {
			return nil, errNoTarget
		}
		if _, err := proc.Signal(e.AgentPID, syscall.SIGSTOP); err != nil {
			return nil, err
		}
		a := e.Attempt
		f := in.record(Fault{Kind: kind, At: s.tl.now(), Target: &a,
			Detail: fmt.Sprintf("agent %d of %s stopped for %s", e.AgentPID, e.Attempt, dPause.Round(time.Millisecond))})
		sleep(ctx, dPause)
		// Resume it only if it is still the same process.
		if info, err := proc.Stat(l.PID); err == nil && info.Start == l.StartTicks {
			_, _ = proc.Signal(l.PID, syscall.SIGCONT)
		}
		in.ended(f)
		return f, nil

	case FaultEscapedKill:
		pid, ok := in.escaped(pick)
		if !ok {
			return nil, errNoTarget
		}
		if _, err := proc.Signal(pid, syscall.SIGKILL); err != nil {
			return nil, err
		}
		at := s.tl.now()
		return in.record(Fault{Kind: kind, At: at, Ended: at, Detail: fmt.Sprintf("escaped child %d", pid)}), nil

	case FaultLeaderKill:
		d, others := s.leaderDaemon()
		if d == nil || others == 0 {
			return nil, errNoTarget
		}
		pid := d.pid()
		d.kill()
		f := in.record(Fault{Kind: kind, At: s.tl.now(),
			Detail: fmt.Sprintf("reaperd #%d (pid %d), restarted after %s", d.slot, pid, d1.Round(time.Millisecond))})
		sleep(context.WithoutCancel(ctx), d1)
		if err := d.start(); err != nil {
			s.fail(Violation{Check: "harness", Evidence: err.Error()})
		}
		in.ended(f)
		return f, nil

	case FaultLeaderPause:
		d, others := s.leaderDaemon()
		if d == nil || others == 0 {
			return nil, errNoTarget
		}
		pid := d.pid()
		if err := d.signal(syscall.SIGSTOP); err != nil {
			return nil, err
		}
		f := in.record(Fault{Kind: kind, At: s.tl.now(),
			Detail: fmt.Sprintf("reaperd #%d (pid %d) stopped for %s", d.slot, pid, dLeader.Round(time.Millisecond))})
		sleep(context.WithoutCancel(ctx), dLeader)
		_ = d.signal(syscall.SIGCONT)
		in.ended(f)
		return f, nil

	case FaultPluginKill:
		d, _ := s.leaderDaemon()
		if d == nil {
			return nil, errNoTarget
		}
		var plugins []procInfo
		for _, p := range s.obs.children(d.pid()) {
			if strings.HasPrefix(p.comm, "reaper-") && p.comm != "reaper-agent" {
				plugins = append(plugins, p)
			}
		}
		if len(plugins) == 0 {
			return nil, errNoTarget
		}
		p := plugins[pick%uint64(len(plugins))]
		if info, err := proc.Stat(p.info.PID); err != nil || info.Start != p.info.Start {
			return nil, errNoTarget
		}
		if _, err := proc.Signal(p.info.PID, syscall.SIGKILL); err != nil {
			return nil, err
		}
		at := s.tl.now()
		return in.record(Fault{Kind: kind, At: at, Ended: at,
			Detail: fmt.Sprintf("%s (pid %d) of reaperd #%d", p.comm, p.info.PID, d.slot)}), nil

	case FaultPostgres:
		if !s.db.acquire(ctx) {
			return nil, errNoTarget
		}
		defer s.db.release()
		f := in.record(Fault{Kind: kind, At: s.tl.now(), Detail: fmt.Sprintf("down for %s", d1.Round(time.Millisecond))})
		if err := s.db.restart(ctx, d1); err != nil {
			s.fail(Violation{Check: "harness", Evidence: "restart postgres: " + err.Error()})
		}
		in.ended(f)
		return f, nil

	case FaultFreeze:
		if !s.db.acquire(ctx) {
			return nil, errNoTarget
		}
		defer s.db.release()
		pid := s.db.primary.PID()
		f := in.record(Fault{Kind: kind, At: s.tl.now(),
			Detail: fmt.Sprintf("primary (postmaster %d) and its processes stopped for %s", pid, st.dFreeze.Round(time.Millisecond))})
		if err := s.db.freeze(ctx, st.dFreeze); err != nil {
			s.fail(Violation{Check: "harness", Evidence: "freeze postgres: " + err.Error()})
		}
		in.ended(f)
		return f, nil

	case FaultFailover:
		if async, window := failoverMode(pick); async {
			return in.failOverAsync(ctx, st, window)
		}
		if !s.db.acquire(ctx) {
			return nil, errNoTarget
		}
		defer s.db.release()
		if !s.db.canFailOver() {
			return nil, errNoTarget
		}
		f := in.record(Fault{Kind: kind, At: s.tl.now(),
			Detail: fmt.Sprintf("primary (port %d) killed -9, its synchronous standby (port %d) promoted after %s",
				s.db.primary.Port(), s.db.standby.Port(), d1.Round(time.Millisecond))})
		if err := s.db.failover(ctx, d1); err != nil {
			s.fail(Violation{Check: "harness", Evidence: "fail over postgres: " + err.Error()})
		}
		in.ended(f)
		return f, nil

	case FaultPartition:
		slot, how, ok := in.partitionTarget(pick)
		if !ok {
			return nil, errNoTarget
		}
		l := s.db.link(slot)
		in.mu.Lock()
		busy := in.cut[slot]
		in.cut[slot] = true
		in.mu.Unlock()
		if busy || l == nil {
			return nil, errNoTarget
		}
		defer func() {
			in.mu.Lock()
			delete(in.cut, slot)
			in.mu.Unlock()
		}()
		l.cut()
		f := in.record(Fault{Kind: kind, At: s.tl.now(),
			Detail: fmt.Sprintf("reaperd #%d (%s) cut from PostgreSQL for %s", slot, how, st.dCut.Round(time.Millisecond))})
		sleep(ctx, st.dCut)
		l.heal()
		in.ended(f)
		return f, nil

	case FaultBurst:
		n := 3 + int(pick%6)
		at := s.tl.now()
		if err := s.wl.submit(ctx, n); err != nil {
			return nil, err
		}
		return in.record(Fault{Kind: kind, At: at, Ended: s.tl.now(), Detail: fmt.Sprintf("%d runs at once", n)}), nil
	}
	if s.kube != nil {
		return in.injectKube(ctx, st) // the kube editions' own faults
	}
	return nil, fmt.Errorf("unknown fault kind %q", kind)
}

// partitionTarget picks the replica a partition cuts: the leader's slot
// (an even pick) or any slot (an odd one, from the rest of the pick).
func (in *injector) partitionTarget(pick uint64) (slot int, how string, ok bool) {
	if pick%2 == 0 {
		d, _ := in.s.leaderDaemon()
		if d == nil {
			return 0, "", false
		}
		return d.slot, "the leader", true
	}
	n := len(in.s.daemons)
	if n == 0 {
		return 0, "", false
	}
	return 1 + int((pick/2)%uint64(n)), "drawn", true
}

// target picks a running execution whose agent is not paused.
func (in *injector) target(pick uint64) (Execution, bool) {
	var cands []Execution
	in.mu.Lock()
	for _, e := range in.s.obs.running() {
		// A pid below 2 is never signalled: a real node's journal line whose
		// process was not found has a stand-in below zero.
		if !in.paused[e.AgentPID] && e.AgentPID > 1 {
			cands = append(cands, e)
		}
	}
	in.mu.Unlock()
	if len(cands) == 0 {
		return Execution{}, false
	}
	e := cands[pick%uint64(len(cands))]
	// Still the same agent process?
	l, ok := in.s.obs.agentOf(e.AgentPID)
	if !ok {
		return Execution{}, false
	}
	if info, err := proc.Stat(l.PID); err != nil || info.Zombie || (l.StartTicks != 0 && info.Start != l.StartTicks) {
		return Execution{}, false
	}
	return e, true
}

// escaped picks a live escaped child: a process of this soak, named by a
// pid file an escaping task wrote, still running sleep.
func (in *injector) escaped(pick uint64) (int, bool) {
	files, _ := filepath.Glob(filepath.Join(in.s.escDir, "*"))
	sort.Strings(files)
	var pids []int
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil || pid <= 1 {
			continue
		}
		if in.s.marked(pid) {
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			if strings.TrimSpace(string(comm)) == "sleep" {
				pids = append(pids, pid)
			}
		}
	}
	if len(pids) == 0 {
		return 0, false
	}
	return pids[pick%uint64(len(pids))], true
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

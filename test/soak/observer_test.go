package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/lite/proc"
)

// timeline maps CLOCK_MONOTONIC readings (the agents' journals, the
// observer's looks) onto one wall-clock timeline, anchored once, so that
// they compare with the database's clock_timestamp().
type timeline struct {
	wall time.Time
	mono int64
}

func newTimeline() timeline { return timeline{wall: time.Now(), mono: agent.MonoNow()} }

func (tl timeline) at(mono int64) time.Time {
	return tl.wall.Add(time.Duration(mono - tl.mono)).Round(0)
}

func (tl timeline) now() time.Time { return tl.at(agent.MonoNow()) }

// observer follows the agents' journals and the process table: the life of
// every agent and of every task group, as the processes tell it.
type observer struct {
	dir string
	tl  timeline
	// resolve, when set, rewrites the entries read from one journal file
	// before they are folded in (the real node's agents journal the pids
	// of their pod's namespace; resolve makes them the host's). Called
	// with pollMu held, one file's new entries at a time, in file order.
	resolve func(path string, es []agent.JournalEntry)

	// pollMu makes one poll at a time: the observer's own loop and each
	// invariant check poll, and two readers of one journal offset would
	// fold the same lines in twice (one execution counted as two).
	pollMu  sync.Mutex
	mu      sync.Mutex
	offsets map[string]int64
	agents  map[int]*AgentLife // by pid, the live ones and the finished ones
	lives   []*AgentLife
	execs   []*Execution
	open    []*Execution // not yet gone
	polls   int
	// marked: pid -> true for every process carrying the soak's marker seen
	// in the last look (for the leftovers check and the injector).
	procs map[int]procInfo
}

// procInfo is what a look at the process table keeps of one process.
type procInfo struct {
	info proc.Info
	comm string
}

func newObserver(dir string, tl timeline) *observer {
	return &observer{dir: dir, tl: tl, offsets: map[string]int64{}, agents: map[int]*AgentLife{}}
}

// run looks every period until ctx ends.
func (o *observer) run(ctx context.Context, period time.Duration) { every(ctx, period, o.poll) }

// every calls f at once and then every period until ctx ends.
func every(ctx context.Context, period time.Duration, f func()) {
	tk := time.NewTicker(period)
	defer tk.Stop()
	for {
		f()
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
	}
}

// poll reads what the journals added, then looks at the process table:
// whatever the journals named before the look and the look did not find
// is gone.
func (o *observer) poll() {
	o.pollMu.Lock()
	defer o.pollMu.Unlock()
	entries := o.readJournals()
	o.mu.Lock()
	for _, e := range entries {
		o.apply(e)
	}
	o.mu.Unlock()

	before := o.tl.now()
	procs := scanProcs()
	after := o.tl.now()

	o.mu.Lock()
	defer o.mu.Unlock()
	o.polls++
	o.procs = procs
	groups := map[int]bool{}
	for _, p := range procs {
		if !p.info.Zombie {
			groups[p.info.PGID] = true
		}
	}
	for _, l := range o.lives {
		if l.Gone {
			continue
		}
		if p, ok := procs[l.PID]; ok && !p.info.Zombie && (l.StartTicks == 0 || p.info.Start == l.StartTicks) {
			l.LastSeenAlive = before
		} else {
			l.Gone, l.GoneSeen = true, after
		}
	}
	open := o.open[:0]
	for _, e := range o.execs {
		if e.Gone {
			continue
		}
		leader, hasLeader := procs[e.PGID]
		reused := hasLeader && leader.info.Start != e.LeaderStart && leader.info.PGID == e.PGID
		if groups[e.PGID] && !reused {
			e.LastSeenAlive = before
			open = append(open, e)
		} else {
			e.Gone, e.GoneSeen = true, after
		}
	}
	o.open = open
}

// apply folds one journal entry in. Called with mu held.
func (o *observer) apply(e agent.JournalEntry) {
	at := o.tl.at(e.Mono)
	a := e.Attempt()
	switch e.Event {
	case agent.JournalAgentStart:
		l := &AgentLife{Attempt: a, PID: e.PID, StartTicks: e.AgentStart, Began: at, LastSeenAlive: at}
		o.agents[e.PID] = l
		o.lives = append(o.lives, l)
	case agent.JournalAgentExit:
		if l := o.agents[e.PID]; l != nil && l.Attempt == a {
			l.Exited = at
		}
	case agent.JournalTaskStart:
		o.execs = append(o.execs, &Execution{Attempt: a, AgentPID: e.PID, PGID: e.PGID, LeaderStart: e.LeaderStart,
			Start: at, LastSeenAlive: at})
	case agent.JournalTaskEnd:
		for i := len(o.execs) - 1; i >= 0; i-- {
			if x := o.execs[i]; x.Attempt == a && x.AgentPID == e.PID {
				x.End, x.EndState, x.EndReason = at, e.State, e.Reason
				break
			}
		}
	}
}

// readJournals reads the complete lines every journal gained since the
// last read. Called with pollMu held.
func (o *observer) readJournals() []agent.JournalEntry {
	files, _ := filepath.Glob(filepath.Join(o.dir, "*.journal"))
	sort.Strings(files)
	var out []agent.JournalEntry
	for _, path := range files {
		o.mu.Lock()
		off := o.offsets[path]
		o.mu.Unlock()
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		_, _ = f.Seek(off, io.SeekStart)
		data, _ := io.ReadAll(f)
		f.Close()
		end := bytes.LastIndexByte(data, '\n')
		if end < 0 {
			continue
		}
		var got []agent.JournalEntry
		for _, line := range bytes.Split(data[:end], []byte{'\n'}) {
			var e agent.JournalEntry
			if json.Unmarshal(line, &e) == nil {
				got = append(got, e)
			}
		}
		if o.resolve != nil {
			o.resolve(path, got)
		}
		out = append(out, got...)
		o.mu.Lock()
		o.offsets[path] = off + int64(end) + 1
		o.mu.Unlock()
	}
	// Files are read in name order; the entries apply in time order.
	sort.SliceStable(out, func(i, j int) bool { return out[i].Mono < out[j].Mono })
	return out
}

// scanProcs reads every process of the host.
func scanProcs() map[int]procInfo {
	out := map[int]procInfo{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		info, err := proc.Stat(pid)
		if err != nil {
			continue
		}
		comm, _ := os.ReadFile("/proc/" + ent.Name() + "/comm")
		out[pid] = procInfo{info: info, comm: strings.TrimSpace(string(comm))}
	}
	return out
}

// snapshot copies what the observer knows into h.
func (o *observer) snapshot(h *History) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, e := range o.execs {
		h.Executions = append(h.Executions, *e)
	}
	for _, l := range o.lives {
		h.Agents = append(h.Agents, *l)
	}
}

// running lists the executions whose group and agent were both alive at
// the last look and whose agent has not journaled their end, in attempt
// order (the injector's targets).
func (o *observer) running() []Execution {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []Execution
	for _, e := range o.open {
		if !e.End.IsZero() {
			continue
		}
		if l := o.agents[e.AgentPID]; l == nil || l.Gone || l.Attempt != e.Attempt {
			continue
		}
		out = append(out, *e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Attempt.String() < out[j].Attempt.String() })
	return out
}

// agentOf returns the life of the agent with pid, if it is alive.
func (o *observer) agentOf(pid int) (AgentLife, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	l := o.agents[pid]
	if l == nil || l.Gone {
		return AgentLife{}, false
	}
	return *l, true
}

// children lists the live processes whose parent is ppid.
func (o *observer) children(ppid int) []procInfo {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []procInfo
	for _, p := range o.procs {
		if p.info.PPID == ppid && !p.info.Zombie {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].info.PID < out[j].info.PID })
	return out
}

// counts reports how many agents and executions were seen.
func (o *observer) counts() (agents, execs, polls int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.lives), len(o.execs), o.polls
}

// attemptsOf is the set of attempts that ran a task.
func attemptsOf(es []Execution) map[sdk.Attempt]bool {
	out := map[sdk.Attempt]bool{}
	for _, e := range es {
		out[e.Attempt] = true
	}
	return out
}

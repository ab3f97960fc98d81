package steps

import (
	"context"
	"sync"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
)

// gate is one dispatch's view of the open slots: each pool's and each
// bounded run's, as read at its start and taken as it starts attempts.
type gate struct {
	open map[string]int // pool -> open slots; a pool absent is unbounded (see Driver.Pools)
	// closed pools: configured pools with no slot open, and unknown ones.
	known map[string]bool
	runs  map[string]lifecycle.RunUse
}

// newGate reads what is open. It reads the pools' use only when the
// driver has pools configured.
func (d Driver) newGate(ctx context.Context, now time.Time) (*gate, error) {
	g := &gate{open: map[string]int{}, known: map[string]bool{}}
	runs, err := d.W.BoundedRuns(ctx)
	if err != nil {
		return nil, err
	}
	g.runs = runs
	if len(d.Pools) == 0 {
		return g, nil
	}
	use, err := d.W.PoolUsage(ctx, now)
	if err != nil {
		return nil, err
	}
	for name, slots := range d.Pools {
		g.known[name], g.open[name] = true, slots
	}
	for _, u := range use {
		if g.known[u.Pool] {
			g.open[u.Pool] -= u.Taken()
		}
	}
	return g, nil
}

// unbounded: the driver's pools leave pool unbounded (DefaultPool when
// the configuration does not name it; any pool when none is configured).
func (d Driver) unbounded(pool string) bool {
	if len(d.Pools) == 0 {
		return true
	}
	_, named := d.Pools[pool]
	return !named && pool == lifecycle.DefaultPool
}

// fits: ti's slots are open in its pool, and its run is under its bound.
func (d Driver) fits(g *gate, ti board.TaskInstance) bool {
	if u, ok := g.runs[ti.RunID]; ok && u.Active >= u.Max {
		return false
	}
	if d.unbounded(ti.Pool) {
		return true
	}
	return g.known[ti.Pool] && g.open[ti.Pool] >= int(max(ti.PoolSlots, 1))
}

// take books ti's slots, once it started.
func (d Driver) take(g *gate, ti board.TaskInstance) {
	if u, ok := g.runs[ti.RunID]; ok {
		u.Active++
		g.runs[ti.RunID] = u
	}
	if !d.unbounded(ti.Pool) {
		g.open[ti.Pool] -= int(max(ti.PoolSlots, 1))
	}
}

// closedPools are the configured pools with no slot open; closedRuns the
// runs at their bound. The listing leaves their task instances out. A
// pool nobody configured is not listed: its tasks are read, and never fit.
func (g *gate) closed() (pools, runs []string) {
	for name, n := range g.open {
		if n <= 0 {
			pools = append(pools, name)
		}
	}
	for id, u := range g.runs {
		if u.Active >= u.Max {
			runs = append(runs, id)
		}
	}
	return pools, runs
}

// PoolReadEvery is how often ReadPools reads the pools' use for the
// gauges: a read walks every queued and running attempt (about 0.1 s at
// 150,000 on two cores), which a gauge need not pay every tick.
const PoolReadEvery = 10 * time.Second

// PoolReads spaces a runner's ReadPools PoolReadEvery apart. Its zero
// value reads at the first call.
type PoolReads struct {
	mu   sync.Mutex
	last time.Time
}

// due reports whether a read is due at now, and takes it.
func (p *PoolReads) due(now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.last.IsZero() && now.Sub(p.last) < PoolReadEvery && !now.Before(p.last) {
		return false
	}
	p.last = now
	return true
}

// ReadPools records every pool's use in t (Tally.Pools), for the host's
// gauges: what the board holds at the end of the cycle, at most every
// PoolReadEvery (Driver.PoolReads; nil: every cycle). A cycle that does
// not read leaves Tally.Pools nil, and the gauges as they were.
func (d Driver) ReadPools(ctx context.Context, now time.Time, t *Tally) error {
	if d.PoolReads != nil && !d.PoolReads.due(now) {
		return nil
	}
	use, err := d.W.PoolUsage(ctx, now.Add(-lifecycle.SilentHeartbeats*d.Heartbeat))
	if err != nil {
		return err
	}
	t.Pools = use
	return nil
}

// recoverySpent are the pools whose recovery budget has no token at now:
// the listing leaves their recovery dispatches out. The pools looked at
// are those the gate knows and the default pool; a pool the budget bounds
// that is named nowhere is judged task by task (Admit).
func (d Driver) recoverySpent(g *gate, now time.Time) []string {
	if d.Recovery == nil {
		return nil
	}
	var spent []string
	seen := map[string]bool{}
	for _, pool := range append(keysOf(g.known), lifecycle.DefaultPool) {
		if seen[pool] {
			continue
		}
		seen[pool] = true
		if d.Recovery.Spent(pool, now) {
			spent = append(spent, pool)
		}
	}
	return spent
}

func keysOf(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

package steps

import (
	"context"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// Dispatches measures a runner's dispatch latency: the time from an
// attempt's queueing (queued_at) to its agent's RUNNING report
// (running_at), for the attempts this runner queued. The zero value is
// ready; it is used by one cycle at a time (a runner's RunOnce).
type Dispatches struct {
	// pending: attempts queued whose running report has not been seen,
	// with when they were queued.
	pending map[sdk.Attempt]time.Time
}

// Queued records that the runner queued a and handed it to an executor at
// at (a process spawned, a pod created, a warm worker bound).
func (p *Dispatches) Queued(a sdk.Attempt, at time.Time) {
	if p.pending == nil {
		p.pending = map[sdk.Attempt]time.Time{}
	}
	p.pending[a] = at
}

// Pending counts the attempts whose running report is still awaited.
func (p *Dispatches) Pending() int { return len(p.pending) }

// Observe finds the recorded attempts that have since reported running and
// adds their dispatch latency to t.DispatchLatencies. An attempt that has
// not reported running once forget has passed since its queueing is
// forgotten: the reapers' then (the runners pass dispatch_lost plus a
// tick).
func (p *Dispatches) Observe(ctx context.Context, w *lifecycle.Writer, now time.Time, forget time.Duration, t *Tally) error {
	if len(p.pending) == 0 {
		return nil
	}
	pending := make([]sdk.Attempt, 0, len(p.pending))
	for a, at := range p.pending {
		if now.Sub(at) > forget {
			delete(p.pending, a)
			continue
		}
		pending = append(pending, a)
	}
	for start := 0; start < len(pending); start += ladder.PageSize {
		seen, err := w.RunningSince(ctx, pending[start:min(start+ladder.PageSize, len(pending))])
		if err != nil {
			return err
		}
		for a, qr := range seen {
			t.DispatchLatencies = append(t.DispatchLatencies, qr[1].Sub(qr[0]))
			delete(p.pending, a)
		}
	}
	return nil
}

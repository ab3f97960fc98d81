// Package gate is the leader-settling gate: after a replica gains
// leadership, no reaper runs until the fleet has had time to re-heartbeat
// (the grace), the substrate's view is complete (synced), and one reconcile
// sweep has finished under this leadership. A gate that could hold forever
// would trade false reaps for no reaps at all, so at twice the grace a valve
// opens and the reapers run anyway, loudly.
//
// Everything is measured from the moment this replica gained leadership; a
// re-election (a new term) starts over.
package gate

import (
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// Verdict is the gate's answer for one cycle.
type Verdict struct {
	// Open: the reapers run this cycle.
	Open bool
	// Valve: open only because the valve did (settling not reached by twice
	// the grace); the host WARNs and records it.
	Valve bool
	// Label is the decision to record: reap_settling_skip while closed,
	// reap_settling_valve_open while the valve holds it open, "" when
	// settled.
	Label string
	// Waiting names what has not settled yet: "grace", "synced", "sweep".
	Waiting []string
	// Since is how long this replica has led.
	Since time.Duration
}

// Gate tracks one replica's settling across terms.
type Gate struct {
	grace time.Duration

	term    int64
	leadAt  time.Time
	swept   bool
	settled bool
}

// New returns a gate with the given settling grace.
func New(grace time.Duration) *Gate { return &Gate{grace: grace} }

// Lead tells the gate the replica leads under term since leadAt. A new term
// resets the gate.
func (g *Gate) Lead(term int64, leadAt time.Time) {
	if term == g.term && leadAt.Equal(g.leadAt) {
		return
	}
	g.term, g.leadAt = term, leadAt
	g.swept, g.settled = false, false
}

// Swept records that a reconcile sweep completed under term.
func (g *Gate) Swept(term int64) {
	if term == g.term {
		g.swept = true
	}
}

// Check decides for this cycle at now, given whether the substrate reports
// its view synced. Once settled in a term, the gate stays open for the rest
// of that term.
func (g *Gate) Check(now time.Time, synced bool) Verdict {
	since := now.Sub(g.leadAt)
	v := Verdict{Since: since}
	if g.settled {
		v.Open = true
		return v
	}
	if since < g.grace {
		v.Waiting = append(v.Waiting, "grace")
	}
	if !synced {
		v.Waiting = append(v.Waiting, "synced")
	}
	if !g.swept {
		v.Waiting = append(v.Waiting, "sweep")
	}
	switch {
	case len(v.Waiting) == 0:
		g.settled = true
		v.Open = true
	case since >= 2*g.grace:
		v.Open, v.Valve = true, true
		v.Label = sdk.LabelSettlingValveOpen
	default:
		v.Label = sdk.LabelSettlingSkip
	}
	return v
}

package sdktest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// T0 is the time a harness clock starts at.
func T0() time.Time { return time.Date(2030, time.January, 7, 9, 0, 0, 0, time.UTC) }

// Harness runs reaper passes the way the host does, in-process: it builds
// each sdk.Pass from a fake clock, the ladder and the term, and carries the
// state a reaper's pass returns into its next one. Fields may be changed
// between passes.
type Harness struct {
	Board   *Board
	Exec    *Executions
	Clock   *clock.Fake
	Ladder  ladder.Ladder
	Edition string
	Term    int64 // the term passes carry; the board's own term starts equal
	DryRun  bool
	// Budget is the phase budget: a pass's deadline is now + Budget.
	Budget time.Duration
	// Last is the last pass's full result.
	Last sdk.PassResult

	states map[string][]byte // by plugin name: what its last pass returned
}

// New returns a harness for the edition ("lite" or "kube") with an empty
// board at term 1, a substrate where unscripted attempts read dead, a fake
// clock at T0, the default ladder and a budget of one maintenance interval.
func New(edition string) *Harness {
	b := NewBoard()
	if edition == ladder.EditionKube {
		b.SetDefaultExecutor(sdk.ExecutorKube)
	}
	l := ladder.Defaults()
	return &Harness{
		Board:   b,
		Exec:    NewExecutions(),
		Clock:   clock.NewFake(T0()),
		Ladder:  l,
		Edition: edition,
		Term:    1,
		Budget:  l.MaintenanceInterval,
		states:  map[string][]byte{},
	}
}

// Now is the harness clock's time.
func (h *Harness) Now() time.Time { return h.Clock.Now() }

// StateOf returns the state the named reaper's last pass returned, which its
// next pass receives.
func (h *Harness) StateOf(name string) []byte { return h.states[name] }

// SetState sets the state the named reaper's next pass receives.
func (h *Harness) SetState(name string, state []byte) { h.states[name] = state }

// Pass returns the pass the next Reap of the named reaper will run.
func (h *Harness) Pass(name string) sdk.Pass {
	now := h.Clock.Now()
	return sdk.Pass{
		Now:      now,
		Ladder:   h.Ladder,
		Term:     h.Term,
		DryRun:   h.DryRun,
		Deadline: now.Add(h.Budget),
		State:    h.states[name],
		Edition:  h.Edition,
	}
}

// Configure decodes values against the plugin's schema (filling defaults,
// as the host does) and configures it for the harness's edition and ladder.
func (h *Harness) Configure(ctx context.Context, p sdk.Plugin, values sdk.Values) error {
	schema, err := p.ConfigSchema(ctx)
	if err != nil {
		return fmt.Errorf("read config schema: %w", err)
	}
	return p.Configure(ctx, sdk.ConfigureRequest{Edition: h.Edition, Values: schema.WithDefaults(values), Ladder: h.Ladder})
}

// Reap runs one pass of r against the harness's board and substrate, keeps
// the state it returns for r's next pass (by r's name, so one harness can
// drive several reapers), and returns its decisions. After an error the
// state the pass handed back is kept, or, when it handed back none, the
// previous one, as the host does.
func (h *Harness) Reap(ctx context.Context, r sdk.Reaper) (Decisions, error) {
	info, err := r.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("read plugin info: %w", err)
	}
	var sink sdk.Collector
	res, err := r.Reap(ctx, h.Pass(info.Name), h.Board, h.Exec, &sink)
	h.Last = res
	if err != nil {
		// A failed pass that hands back a state is kept, as the host keeps
		// it; one that hands back none leaves the previous state.
		if res.State != nil {
			h.states[info.Name] = res.State
		}
		return Decisions(sink.Decisions()), err
	}
	h.states[info.Name] = res.State
	return Decisions(sink.Decisions()), nil
}

// Running puts a running attempt that entered running runningFor ago and
// last heartbeated silentFor ago.
func (h *Harness) Running(runID, taskID string, runningFor, silentFor time.Duration) sdk.Attempt {
	now := h.Now()
	return h.Board.PutRunning(runID, taskID, now.Add(-runningFor), now.Add(-silentFor))
}

// RunningNeverHeartbeated puts a running attempt that entered running
// runningFor ago and has not heartbeated in this attempt.
func (h *Harness) RunningNeverHeartbeated(runID, taskID string, runningFor time.Duration) sdk.Attempt {
	return h.Board.PutRunning(runID, taskID, h.Now().Add(-runningFor), time.Time{})
}

// Queued puts a queued attempt stamped queued queuedFor ago.
func (h *Harness) Queued(runID, taskID string, queuedFor time.Duration) sdk.Attempt {
	return h.Board.PutQueued(runID, taskID, h.Now().Add(-queuedFor))
}

// Decisions is a pass's decisions with lookups for assertions.
type Decisions []sdk.Decision

// For returns the decisions about exactly a (for a run-level decision, pass
// sdk.Attempt{RunID: id}).
func (ds Decisions) For(a sdk.Attempt) Decisions {
	var out Decisions
	for _, d := range ds {
		if d.Attempt == a {
			out = append(out, d)
		}
	}
	return out
}

// Label returns the labels of the decisions about a, joined by commas ("" if
// none).
func (ds Decisions) Label(a sdk.Attempt) string {
	return strings.Join(ds.For(a).Labels(), ",")
}

// Labels returns every decision's label, in order.
func (ds Decisions) Labels() []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Label
	}
	return out
}

// Count counts the decisions with the label.
func (ds Decisions) Count(label string) int {
	n := 0
	for _, d := range ds {
		if d.Label == label {
			n++
		}
	}
	return n
}

// Applied returns the decisions that took effect.
func (ds Decisions) Applied() Decisions {
	var out Decisions
	for _, d := range ds {
		if d.Applied {
			out = append(out, d)
		}
	}
	return out
}

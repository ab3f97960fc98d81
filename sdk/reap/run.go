package reap

import (
	"context"
	"errors"
	"fmt"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
)

// Spec describes one pass for Run: the listings to drain and what to do
// once they are drained.
type Spec struct {
	// Name is the reaper's label; errors and the pass log carry it.
	Name string
	// Logger receives the pass's summary and warnings; nil discards.
	Logger hclog.Logger
	// Stopwatch measures the pass against its budget; nil: the real
	// clock. (Decisions read pass.Now, never this clock.)
	Stopwatch clock.Clock
	// MaxPages caps the pages read from each listing; 0: as many as the
	// budget allows.
	MaxPages int
	// Listings are drained round-robin within the budget; each one's
	// cursor is kept in the pass state between passes.
	Listings []Listing
	// Backlog, when set, holds marks across the drain's pages; Run settles
	// what it still holds once the drain ends, failed or not, before Finish.
	Backlog *Backlog
	// Finish, when set, runs after a drain that did not fail: the place
	// for what needs every page of the pass judged first (the brake).
	Finish func(ctx context.Context, stats DrainStats) error
	// Save, when set, runs last, whatever happened to the pass, before the
	// state is encoded: for a reaper that keeps more in its state than the
	// cursors (see Stopping).
	Save func(st *State, stats DrainStats)
	// State, when set, is the pass state already loaded (LoadState) by a
	// reaper that keeps more in it than cursors; nil: Run loads it.
	State *State
}

// Run runs one pass the way every reaper does: read the cursors the
// previous pass left (a state that cannot be read starts every listing
// over, with a warning), drain the listings within the phase budget, finish,
// hand every decision to the recorder's sink, and return the cursors for
// the next pass. Decisions made before an error are recorded all the same,
// and the state keeps the cursor of a page that failed.
func Run(ctx context.Context, pass sdk.Pass, rec *Recorder, spec Spec) (sdk.PassResult, error) {
	log := spec.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	watch := spec.Stopwatch
	if watch == nil {
		watch = clock.Real{}
	}
	st := spec.State
	if st == nil {
		st = LoadState(pass, log)
	}
	budget := NewBudget(watch, pass, spec.MaxPages)
	stats, err := Drain(ctx, budget, *st, spec.Listings...)
	if spec.Backlog != nil {
		err = errors.Join(err, spec.Backlog.Settle(ctx))
	}
	if err == nil && spec.Finish != nil {
		err = spec.Finish(ctx, stats)
	}
	if spec.Save != nil {
		spec.Save(st, stats)
	}
	state, encErr := st.Encode()
	// The sink is still owed what was decided, even when the pass failed or
	// its context ended: a pass's own deadline must not lose its decisions.
	recErr := rec.Close(context.WithoutCancel(ctx))
	if err = errors.Join(err, encErr, recErr); err != nil {
		return sdk.PassResult{State: state}, fmt.Errorf("%s pass: %w", spec.Name, err)
	}
	if n := rec.total(); n > 0 {
		log.Debug("pass done", "decisions", n, "pages", stats.Pages, "exhausted", stats.Exhausted,
			"elapsed", budget.Elapsed())
	}
	return sdk.PassResult{State: state}, nil
}

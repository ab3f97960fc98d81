// Package stalequeue is a complete, small reaper plugin written against the
// public SDK only: the example the README walks through. It never fails
// anything. It reports, per pass, the queued attempts that have waited longer
// than a configurable threshold, with the substrate's liveness answer as
// evidence — the kind of dry observer one runs before trusting a reaper.
//
// Build it as reaper-stalequeue into reaperd's plugin_dir and configure it:
//
//	reaper "stalequeue" {
//	  threshold = "2m"
//	}
package stalequeue

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// Name is the label the plugin is configured under; its binary is
// reaper-stalequeue.
const Name = "stalequeue"

// Label is the decision this plugin reports. A plugin's own labels are its
// own; the specification's labels live in the sdk package.
const Label = "stalequeue_observed"

// Reaper observes stale queued attempts.
type Reaper struct {
	logger    hclog.Logger
	threshold time.Duration
}

var _ sdk.Reaper = (*Reaper)(nil)

// New returns the plugin; plugin.Serve calls it with a logger whose lines the
// host re-emits under the plugin's name.
func New(logger hclog.Logger) *Reaper { return &Reaper{logger: logger} }

// Info says who the plugin is.
func (r *Reaper) Info(context.Context) (sdk.Info, error) {
	return sdk.Info{Name: Name, Kind: sdk.KindReaper, Version: "1.0.0",
		Editions:    []string{ladder.EditionLite, ladder.EditionKube},
		Description: "reports queued attempts older than a threshold"}, nil
}

// ConfigSchema declares the plugin's block; the host decodes the operator's
// HCL against it, so a typo fails `reaperd validate` with file:line.
func (r *Reaper) ConfigSchema(context.Context) (sdk.Schema, error) {
	return sdk.Schema{Attributes: []sdk.Attribute{
		{Name: "threshold", Type: sdk.TypeDuration, Default: "2m", Description: "how long a queued attempt may wait"},
	}}, nil
}

// Configure receives the decoded block.
func (r *Reaper) Configure(_ context.Context, req sdk.ConfigureRequest) error {
	d, err := req.Values.Duration("threshold")
	if err != nil {
		return err
	}
	if d <= 0 {
		return fmt.Errorf("threshold must be positive, not %s", d)
	}
	r.threshold = d
	return nil
}

// Reap lists one page of queued attempts older than the threshold (the
// board applies the threshold before the page limit, oldest first), asks the
// substrate about them in one batch, and reports what it saw. It reads only
// pass.Now, never the wall clock, so a test drives it with a fake clock.
func (r *Reaper) Reap(ctx context.Context, pass sdk.Pass, board sdk.Board, exec sdk.Executions, sink sdk.Sink) (sdk.PassResult, error) {
	page, err := board.ListCandidates(ctx, sdk.CandidateQuery{
		States:    []string{sdk.StateQueued},
		OrderBy:   sdk.FieldQueuedAt,
		OlderThan: pass.Now.Add(-r.threshold),
	})
	if err != nil {
		return sdk.PassResult{}, fmt.Errorf("list queued attempts: %w", err)
	}
	if len(page.Candidates) == 0 {
		return sdk.PassResult{}, nil
	}
	attempts := make([]sdk.Attempt, len(page.Candidates))
	for i, c := range page.Candidates {
		attempts[i] = c.Attempt
	}
	live, err := exec.Liveness(ctx, sdk.LivenessRequest{Attempts: attempts, Now: pass.Now})
	if err != nil {
		return sdk.PassResult{}, fmt.Errorf("ask the substrate: %w", err)
	}
	var out []sdk.Decision
	for i, c := range page.Candidates {
		out = append(out, sdk.Decision{
			Label:   Label,
			Attempt: c.Attempt,
			Detail:  "queued longer than the threshold",
			Evidence: map[string]string{
				"queued_for": ladder.Format(pass.Now.Sub(c.QueuedAt).Truncate(time.Second)),
				"threshold":  ladder.Format(r.threshold),
				"liveness":   string(live[i].State),
			},
		})
	}
	return sdk.PassResult{}, sink.Record(ctx, out)
}

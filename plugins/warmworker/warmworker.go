// Package warmworker is the warm-worker-lost reaper (kube warm pool): an
// attempt bound to a warm worker that a live LIST shows gone is marked
// warm_worker_lost; a LIST error aborts the pass with no marks.
//
// STUB: this package serves the protocol and declares its configuration, but
// its policy is not written yet: every pass reads nothing, writes nothing and
// returns no decisions, handing its state back unchanged. It serves only the
// kube edition, which reaperd refuses in this build; the kube substrate
// issue fills it in.
package warmworker

import (
	"context"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// Name is the label the reaper is configured under.
const Name = "warmworker"

// Reaper is the warm-worker-lost reaper.
type Reaper struct {
	logger hclog.Logger
}

var _ sdk.Reaper = (*Reaper)(nil)

// New returns the reaper.
func New(logger hclog.Logger) *Reaper { return &Reaper{logger: logger} }

// Info describes the plugin.
func (r *Reaper) Info(context.Context) (sdk.Info, error) {
	return sdk.Info{Name: Name, Kind: sdk.KindReaper, Version: sdk.BuildVersion,
		Editions: []string{ladder.EditionKube}, Description: "marks attempts whose warm worker is gone (stub)"}, nil
}

// ConfigSchema declares the block's attributes.
func (r *Reaper) ConfigSchema(context.Context) (sdk.Schema, error) {
	return sdk.Schema{Attributes: []sdk.Attribute{
		{Name: "policy", Type: sdk.TypeString, Default: "replace", Description: `"replace" or "hold"`},
	}}, nil
}

// Configure accepts the decoded block.
func (r *Reaper) Configure(context.Context, sdk.ConfigureRequest) error { return nil }

// Reap returns no decisions yet (see the package doc).
func (r *Reaper) Reap(_ context.Context, pass sdk.Pass, _ sdk.Board, _ sdk.Executions, _ sdk.Sink) (sdk.PassResult, error) {
	return sdk.PassResult{State: pass.State}, nil
}

// Package plugins starts the plugins a configuration names — the substrate
// and each reaper, in order — decodes each plugin's block against the schema
// the plugin declares, and configures it. Everything it started is killed
// when any step fails, so a refused configuration leaves nothing running.
package plugins

import (
	"context"
	"fmt"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/host/config"
	"github.com/dexaflow/reaper/host/loader"
	"github.com/dexaflow/reaper/sdk"
)

// Set is the running plugins of one configuration.
type Set struct {
	Substrate *Handle
	Reapers   []*Handle // in configured order
}

// Handle is one launched and configured plugin.
type Handle struct {
	*loader.Plugin
	Block  config.PluginBlock
	Values sdk.Values
}

// Kill stops every plugin of the set.
func (s *Set) Kill() {
	if s == nil {
		return
	}
	if s.Substrate != nil {
		s.Substrate.Kill()
	}
	for _, r := range s.Reapers {
		r.Kill()
	}
}

// Start launches and configures every plugin of cfg.
func Start(ctx context.Context, cfg *config.Config, logger hclog.Logger) (set *Set, err error) {
	ld := &loader.Loader{Dir: cfg.PluginDir, Logger: logger}
	set = &Set{}
	defer func() {
		if err != nil {
			set.Kill()
			set = nil
		}
	}()
	set.Substrate, err = StartOne(ctx, ld, cfg, cfg.Substrate)
	if err != nil {
		return nil, err
	}
	for _, block := range cfg.Reapers {
		h, err := StartOne(ctx, ld, cfg, block)
		if err != nil {
			return nil, err
		}
		set.Reapers = append(set.Reapers, h)
	}
	return set, nil
}

// StartOne launches one plugin, checks that it serves the edition, decodes
// its block against its schema and configures it. The host also uses it to
// restart a plugin that crashed.
func StartOne(ctx context.Context, ld *loader.Loader, cfg *config.Config, block config.PluginBlock) (*Handle, error) {
	p, err := ld.Launch(ctx, loader.Spec{Kind: block.Kind, Name: block.Name, SHA256: block.SHA256})
	if err != nil {
		return nil, err
	}
	h := &Handle{Plugin: p, Block: block}
	if err := h.configure(ctx, cfg); err != nil {
		p.Kill()
		return nil, err
	}
	return h, nil
}

func (h *Handle) configure(ctx context.Context, cfg *config.Config) error {
	if !h.ServesEdition(cfg.Edition) {
		return fmt.Errorf("%s:%d:%d: %s plugin %q does not serve edition %q (it serves %v)",
			h.Block.Range.Filename, h.Block.Range.Start.Line, h.Block.Range.Start.Column,
			h.Block.Kind, h.Block.Name, cfg.Edition, h.Info.Editions)
	}
	schema, err := h.Base().ConfigSchema(ctx)
	if err != nil {
		return fmt.Errorf("%s plugin %q: %w", h.Block.Kind, h.Block.Name, err)
	}
	values, _, diags := config.DecodeBlock(h.Block.Body, schema)
	if diags.HasErrors() {
		return &config.Error{Diags: diags}
	}
	h.Values = values
	if err := h.Base().Configure(ctx, sdk.ConfigureRequest{Edition: cfg.Edition, Values: values, Ladder: cfg.Ladder}); err != nil {
		r := h.Block.Range
		return fmt.Errorf("%s:%d:%d: %s plugin %q refused its configuration: %w",
			r.Filename, r.Start.Line, r.Start.Column, h.Block.Kind, h.Block.Name, err)
	}
	return nil
}

// Reconfigure configures a restarted plugin with the values decoded at boot.
func (h *Handle) Reconfigure(ctx context.Context, cfg *config.Config) error {
	return h.configure(ctx, cfg)
}

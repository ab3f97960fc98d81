// Package launch starts the plugins a configuration names — the substrate
// and each reaper, in order — decodes each plugin's block against the schema
// the plugin declares, and configures it. Everything it started is killed
// when any step fails, so a refused configuration leaves nothing running.
// Every problem is a diagnostic at the position in the file it is about.
package launch

import (
	"context"
	"fmt"
	"regexp"

	"github.com/hashicorp/hcl/v2"

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

// Start launches and configures every plugin of cfg. The error is a
// *config.Error naming the first plugin that failed.
func Start(ctx context.Context, ld *loader.Loader, cfg *config.Config) (set *Set, err error) {
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

// Check launches and configures each plugin of cfg in turn, stops it, and
// returns the problems of all of them, so that one run of reaperd validate
// reports every bad block.
func Check(ctx context.Context, ld *loader.Loader, cfg *config.Config) hcl.Diagnostics {
	var diags hcl.Diagnostics
	blocks := cfg.Reapers
	if cfg.Substrate.Name != "" {
		blocks = append([]config.PluginBlock{cfg.Substrate}, blocks...)
	}
	for _, block := range blocks {
		h, d := startOne(ctx, ld, cfg, block)
		diags = append(diags, d...)
		if h != nil {
			h.Kill()
		}
	}
	return diags
}

// StartOne launches one plugin, checks that it serves the edition, decodes
// its block against its schema and configures it. The host also uses it to
// restart a plugin that crashed. The error is a *config.Error.
func StartOne(ctx context.Context, ld *loader.Loader, cfg *config.Config, block config.PluginBlock) (*Handle, error) {
	h, diags := startOne(ctx, ld, cfg, block)
	if diags.HasErrors() {
		return nil, &config.Error{Diags: diags}
	}
	return h, nil
}

func startOne(ctx context.Context, ld *loader.Loader, cfg *config.Config, block config.PluginBlock) (*Handle, hcl.Diagnostics) {
	p, err := ld.Launch(ctx, loader.Spec{Kind: block.Kind, Name: block.Name, SHA256: block.SHA256})
	if err != nil {
		return nil, blockError(block, err.Error(), "")
	}
	h := &Handle{Plugin: p, Block: block}
	if diags := h.configure(ctx, cfg); diags.HasErrors() {
		p.Kill()
		return nil, diags
	}
	return h, nil
}

func (h *Handle) configure(ctx context.Context, cfg *config.Config) hcl.Diagnostics {
	b := h.Block
	if !h.ServesEdition(cfg.Edition) {
		return blockError(b, fmt.Sprintf("%s plugin %q does not serve edition %q (it serves %v)",
			b.Kind, b.Name, cfg.Edition, h.Info.Editions), "")
	}
	schema, err := h.Base().ConfigSchema(ctx)
	if err != nil {
		return blockError(b, fmt.Sprintf("%s plugin %q: configuration schema", b.Kind, b.Name), err.Error())
	}
	values, ranges, diags := config.DecodeBlock(b.Body, schema)
	if diags.HasErrors() {
		return diags
	}
	if b.Kind == sdk.KindSubstrate && cfg.RecordDir != "" && declares(schema, config.RecordDirKey) {
		values[config.RecordDirKey] = cfg.RecordDir // resolved once, shared with the runner
	}
	h.Values = values
	if err := h.Base().Configure(ctx, sdk.ConfigureRequest{Edition: cfg.Edition, Values: values, Ladder: cfg.Ladder}); err != nil {
		d := blockError(b, fmt.Sprintf("%s plugin %q refused its configuration", b.Kind, b.Name), err.Error())
		if r, ok := attributeNamed(err.Error(), ranges); ok {
			d[0].Subject = &r
		}
		return d
	}
	return nil
}

// blockError is one error diagnostic at a plugin block's header.
func blockError(b config.PluginBlock, summary, detail string) hcl.Diagnostics {
	r := b.Range
	return hcl.Diagnostics{{Severity: hcl.DiagError, Subject: &r, Summary: summary, Detail: detail}}
}

func declares(s sdk.Schema, name string) bool {
	for _, a := range s.Attributes {
		if a.Name == name {
			return true
		}
	}
	return false
}

// quoted finds the double-quoted words of a plugin's message.
var quoted = regexp.MustCompile(`"([A-Za-z_][A-Za-z0-9_]*)"`)

// attributeNamed returns where the first attribute that msg names in quotes
// ("policy") was written in the block, when the block sets it.
func attributeNamed(msg string, ranges map[string]hcl.Range) (hcl.Range, bool) {
	for _, m := range quoted.FindAllStringSubmatch(msg, -1) {
		if r, ok := ranges[m[1]]; ok {
			return r, true
		}
	}
	return hcl.Range{}, false
}

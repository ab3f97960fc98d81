package config

import (
	"fmt"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/substrate/lite/records"
)

// PluginBlock is a substrate or reaper block. Body holds the plugin's own
// attributes, decoded against the plugin's schema once it is running.
type PluginBlock struct {
	Kind   string // sdk.KindReaper or sdk.KindSubstrate
	Name   string // the block label: the plugin's name
	DryRun bool   // dry_run in the block, or the global dry_run
	SHA256 string // optional hex sha256 the plugin binary must match
	Body   hcl.Body
	Range  hcl.Range
}

// reservedKeys are the attributes the host reserves inside every plugin
// block (not passed to the plugin).
type reservedKeys struct {
	DryRun bool   `reaper:"dry_run"` // or the global dry_run
	SHA256 string `reaper:"sha256"`  // the plugin binary's checksum, hex
}

// RecordDirKey is the attribute of the substrate "lite" block that the host
// reads too (see Config.RecordDir). It stays the plugin's attribute: the
// plugin declares it and receives the resolved value.
const RecordDirKey = "record_dir"

// decodeSubstrate decodes the substrate block; the Lite substrate's record
// directory is resolved here, once, for the plugin and the runner alike.
func (cfg *Config) decodeSubstrate(b *hcl.Block) hcl.Diagnostics {
	pb, diags := decodePluginBlock(b, sdk.KindSubstrate, cfg.DryRun)
	cfg.Substrate = pb
	if pb.Name == ladder.EditionLite {
		cfg.RecordDir = cfg.relative(peekString(pb.Body, RecordDirKey))
		if cfg.RecordDir == "" {
			cfg.RecordDir = records.DefaultPath()
		}
	}
	return diags
}

// decodeReaper decodes a reaper block, refusing a second block of a name
// already seen (at the line it is first configured).
func (cfg *Config) decodeReaper(b *hcl.Block, seen map[string]hcl.Range) hcl.Diagnostics {
	name := b.Labels[0]
	if prev, ok := seen[name]; ok {
		r := b.DefRange
		return hcl.Diagnostics{{Severity: hcl.DiagError, Subject: &r,
			Summary: "Duplicate reaper block",
			Detail:  fmt.Sprintf("reaper %q is already configured at line %d.", name, prev.Start.Line)}}
	}
	seen[name] = b.DefRange
	pb, diags := decodePluginBlock(b, sdk.KindReaper, cfg.DryRun)
	cfg.Reapers = append(cfg.Reapers, pb)
	return diags
}

func decodePluginBlock(b *hcl.Block, kind string, globalDryRun bool) (PluginBlock, hcl.Diagnostics) {
	pb := PluginBlock{Kind: kind, Name: b.Labels[0], DryRun: globalDryRun, Range: b.DefRange}
	var keys reservedKeys
	content, remain, diags := b.Body.PartialContent(bodySchema(sdk.SchemaOf(keys)))
	pb.Body = remain
	ranges, d := decodeInto(attrsOnly{content.Attributes}, &keys)
	diags = append(diags, d...)
	pb.DryRun = globalDryRun || keys.DryRun
	pb.SHA256 = strings.ToLower(keys.SHA256)
	if _, ok := ranges["sha256"]; ok && !validSHA256(pb.SHA256) {
		diags = append(diags, invalid(ranges, "sha256", "sha256 must be 64 hexadecimal digits."))
	}
	return pb, diags
}

func validSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}

// ReaperNames lists the configured reapers in order.
func (cfg *Config) ReaperNames() []string {
	out := make([]string, len(cfg.Reapers))
	for i, r := range cfg.Reapers {
		out[i] = r.Name
	}
	return out
}

// peekString reads one string attribute of a plugin block without taking
// it from the block (the plugin's schema still decodes it, and reports its
// problems). A missing or malformed value reads "".
func peekString(body hcl.Body, name string) string {
	content, _, _ := body.PartialContent(&hcl.BodySchema{Attributes: []hcl.AttributeSchema{{Name: name}}})
	a, ok := content.Attributes[name]
	if !ok {
		return ""
	}
	v, diags := a.Expr.Value(nil)
	if diags.HasErrors() || v.IsNull() || !v.IsWhollyKnown() {
		return ""
	}
	v, err := convert.Convert(v, cty.String)
	if err != nil {
		return ""
	}
	return v.AsString()
}

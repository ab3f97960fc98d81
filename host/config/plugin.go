package config

import (
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"

	"github.com/dexaflow/reaper/sdk"
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

// Keys the host reserves inside every plugin block (not passed to plugins).
const (
	keyDryRun = "dry_run"
	keySHA256 = "sha256"
)

// RecordDirKey is the attribute of the substrate "lite" block that the host
// reads too (see Config.RecordDir). It stays the plugin's attribute: the
// plugin declares it and receives the resolved value.
const RecordDirKey = "record_dir"

func decodePluginBlock(b *hcl.Block, kind string, globalDryRun bool) (PluginBlock, hcl.Diagnostics) {
	pb := PluginBlock{Kind: kind, Name: b.Labels[0], DryRun: globalDryRun, Range: b.DefRange}
	reserved := &hcl.BodySchema{Attributes: []hcl.AttributeSchema{{Name: keyDryRun}, {Name: keySHA256}}}
	content, remain, diags := b.Body.PartialContent(reserved)
	pb.Body = remain
	host, _, d := DecodeBlock(attrsOnly{content.Attributes}, sdk.Schema{Attributes: []sdk.Attribute{
		{Name: keyDryRun, Type: sdk.TypeBool},
		{Name: keySHA256, Type: sdk.TypeString},
	}})
	diags = append(diags, d...)
	if v, ok := host[keyDryRun]; ok {
		pb.DryRun = globalDryRun || v.(bool)
	}
	pb.SHA256 = strings.ToLower(host.String(keySHA256))
	if a, ok := content.Attributes[keySHA256]; ok && !validSHA256(pb.SHA256) {
		r := a.Expr.Range()
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
			Summary: `Invalid value for "sha256"`, Detail: "sha256 must be 64 hexadecimal digits."})
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

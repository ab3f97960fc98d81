package config

import (
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"

	"github.com/dexaflow/reaper/internal/settingrule"
	"github.com/dexaflow/reaper/sdk"
)

// DecodeBlock decodes a block body against a flat attribute schema: every
// attribute the block sets must be declared, of the declared type; required
// attributes must be set; durations must parse. The returned values carry
// the defaults of attributes the block leaves out, and ranges records where
// each attribute set in the block was written (for later diagnostics).
func DecodeBlock(body hcl.Body, schema sdk.Schema) (sdk.Values, map[string]hcl.Range, hcl.Diagnostics) {
	content, diags := body.Content(bodySchema(schema))
	values := sdk.Values{}
	ranges := map[string]hcl.Range{}
	for _, a := range schema.Attributes {
		if a.Default != nil {
			values[a.Name] = a.Default
		}
		attr, ok := content.Attributes[a.Name]
		if !ok {
			continue
		}
		ranges[a.Name] = attr.Expr.Range()
		v, d := decodeAttr(attr, a)
		diags = append(diags, d...)
		if !d.HasErrors() {
			values[a.Name] = v
		}
	}
	return values, ranges, diags
}

// bodySchema is the HCL body schema of a flat attribute schema.
func bodySchema(schema sdk.Schema) *hcl.BodySchema {
	bs := &hcl.BodySchema{}
	for _, a := range schema.Attributes {
		bs.Attributes = append(bs.Attributes, hcl.AttributeSchema{Name: a.Name, Required: a.Required})
	}
	return bs
}

// decodeInto decodes one of the host's own blocks into the tagged struct
// into points to, the way a plugin's block is decoded: sdk.SchemaOf the
// struct (its field values as given are the defaults) is the schema
// DecodeBlock checks the block against, with file:line diagnostics, and
// sdk.Values.Decode reads the values back into the struct. A value the block
// gets wrong leaves its field at its default. A required attribute the
// block lacks is a diagnostic already; its field is left at its zero value
// and the rest of the block is still read, so that Check reports every
// problem of the file at once. ranges records where each attribute set in
// the block was written, for the block's own checks.
func decodeInto(body hcl.Body, into any) (map[string]hcl.Range, hcl.Diagnostics) {
	schema := sdk.SchemaOf(into)
	values, ranges, diags := DecodeBlock(body, schema)
	for _, a := range schema.Attributes {
		if _, ok := values[a.Name]; !ok && a.Required {
			values[a.Name] = zeroValue(a.Type)
		}
	}
	if err := values.Decode(into); err != nil {
		// DecodeBlock has checked every value against the struct's own
		// schema, so this is a value its field cannot hold (a fraction
		// for a whole number), refused at its key, or a struct the
		// decoder cannot fill.
		var ae *sdk.AttributeError
		if errors.As(err, &ae) {
			if _, ok := ranges[ae.Name]; ok {
				return ranges, append(diags, invalid(ranges, ae.Name, ae.Name+" "+ae.Err.Error()+"."))
			}
		}
		r := body.MissingItemRange()
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
			Summary: "Configuration not decoded", Detail: err.Error() + "."})
	}
	return ranges, diags
}

// zeroValue is the zero of an attribute type, as sdk.Values carries it.
func zeroValue(t sdk.AttrType) any {
	switch t {
	case sdk.TypeNumber:
		return float64(0)
	case sdk.TypeBool:
		return false
	case sdk.TypeStrings:
		return []string{}
	case sdk.TypeDuration:
		return "0s"
	default:
		return ""
	}
}

// invalid refuses the value of key, at where the block sets it.
func invalid(ranges map[string]hcl.Range, key, detail string) *hcl.Diagnostic {
	r := ranges[key]
	return &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
		Summary: fmt.Sprintf("Invalid value for %q", key), Detail: detail}
}

// refusals are the diagnostics of a block's problems (its settings'
// rules), each at the first of its keys the block sets, else at the block
// (def).
func refusals(def hcl.Range, ranges map[string]hcl.Range, problems []settingrule.Problem) hcl.Diagnostics {
	var diags hcl.Diagnostics
	for _, p := range problems {
		r, summary := def, p.Summary
		for _, k := range p.Keys {
			if rr, ok := ranges[k]; ok {
				r = rr
				break
			}
		}
		if summary == "" && len(p.Keys) > 0 {
			summary = fmt.Sprintf("Invalid value for %q", p.Keys[0])
		}
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r, Summary: summary, Detail: p.Detail})
	}
	return diags
}

func decodeAttr(attr *hcl.Attribute, spec sdk.Attribute) (any, hcl.Diagnostics) {
	raw, diags := attr.Expr.Value(nil)
	if diags.HasErrors() {
		return nil, diags
	}
	subject := attr.Expr.Range()
	bad := func(detail string) hcl.Diagnostics {
		return hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  fmt.Sprintf("Invalid value for %q", attr.Name),
			Detail:   detail,
			Subject:  &subject,
		}}
	}
	if raw.IsNull() {
		return nil, bad(fmt.Sprintf("%q must not be null.", attr.Name))
	}
	want := cty.String
	switch spec.Type {
	case sdk.TypeNumber:
		want = cty.Number
	case sdk.TypeBool:
		want = cty.Bool
	case sdk.TypeStrings:
		want = cty.List(cty.String)
	}
	v, err := convert.Convert(raw, want)
	if err != nil {
		return nil, bad(fmt.Sprintf("%q must be a %s: %s.", attr.Name, spec.Type, err))
	}
	if !v.IsWhollyKnown() {
		return nil, bad(fmt.Sprintf("%q must be a literal value.", attr.Name))
	}
	switch spec.Type {
	case sdk.TypeNumber:
		f, _ := v.AsBigFloat().Float64()
		return f, nil
	case sdk.TypeBool:
		return v.True(), nil
	case sdk.TypeStrings:
		out := []string{}
		for _, e := range v.AsValueSlice() {
			if e.IsNull() {
				return nil, bad(fmt.Sprintf("%q must not contain null.", attr.Name))
			}
			out = append(out, e.AsString())
		}
		return out, nil
	case sdk.TypeDuration:
		s := v.AsString()
		if _, err := time.ParseDuration(s); err != nil {
			return nil, bad(fmt.Sprintf("%q must be a duration such as \"90s\" or \"10m\": %s.", attr.Name, err))
		}
		return s, nil
	default:
		return v.AsString(), nil
	}
}

// attrsOnly is a body made of already-extracted attributes, so the typed
// decoder can run over top-level and reserved attributes.
type attrsOnly struct{ attrs hcl.Attributes }

func (b attrsOnly) Content(s *hcl.BodySchema) (*hcl.BodyContent, hcl.Diagnostics) {
	c, _, d := b.PartialContent(s)
	return c, d
}

func (b attrsOnly) PartialContent(s *hcl.BodySchema) (*hcl.BodyContent, hcl.Body, hcl.Diagnostics) {
	c := &hcl.BodyContent{Attributes: hcl.Attributes{}}
	for _, as := range s.Attributes {
		if a, ok := b.attrs[as.Name]; ok {
			c.Attributes[as.Name] = a
		}
	}
	return c, attrsOnly{}, nil
}

func (b attrsOnly) JustAttributes() (hcl.Attributes, hcl.Diagnostics) { return b.attrs, nil }

func (b attrsOnly) MissingItemRange() hcl.Range { return hcl.Range{} }

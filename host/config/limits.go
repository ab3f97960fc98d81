package config

import (
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/dexaflow/reaper/internal/httplimit"
	"github.com/dexaflow/reaper/sdk"
)

// serverLimitAttrs are the keys bounding an HTTP server's connections,
// in the telemetry and attempt_api blocks alike.
var serverLimitAttrs = []sdk.Attribute{
	{Name: "read_header_timeout", Type: sdk.TypeDuration},
	{Name: "read_timeout", Type: sdk.TypeDuration},
	{Name: "write_timeout", Type: sdk.TypeDuration},
	{Name: "idle_timeout", Type: sdk.TypeDuration},
	{Name: "max_connections", Type: sdk.TypeNumber},
}

// decodeLimits reads a server block's connection bounds over defaults and
// refuses, at the key, a bound that is not positive.
func decodeLimits(b *hcl.Block, v sdk.Values, ranges map[string]hcl.Range, defaults httplimit.Limits) (httplimit.Limits, hcl.Diagnostics) {
	l := defaults
	for _, f := range []struct {
		key string
		dst *time.Duration
	}{
		{"read_header_timeout", &l.ReadHeaderTimeout}, {"read_timeout", &l.ReadTimeout},
		{"write_timeout", &l.WriteTimeout}, {"idle_timeout", &l.IdleTimeout},
	} {
		if _, ok := ranges[f.key]; ok {
			*f.dst, _ = v.Duration(f.key)
		}
	}
	var diags hcl.Diagnostics
	if rr, ok := ranges["max_connections"]; ok {
		n := v.Number("max_connections")
		if n < 1 || n != float64(int(n)) {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &rr,
				Summary: `Invalid value for "max_connections"`, Detail: "max_connections must be a whole number, 1 or more."})
			return l, diags
		}
		l.MaxConns = int(n)
	}
	if err := l.Validate(); err != nil {
		r := b.DefRange
		for _, k := range []string{"read_header_timeout", "read_timeout", "write_timeout", "idle_timeout"} {
			if rr, ok := ranges[k]; ok && strings.HasPrefix(err.Error(), k) {
				r = rr
			}
		}
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
			Summary: fmt.Sprintf("Invalid %s limits", b.Type), Detail: err.Error() + "."})
	}
	return l, diags
}

package config

import (
	"fmt"
	"strings"

	"github.com/hashicorp/hcl/v2"

	"github.com/dexaflow/reaper/internal/httplimit"
)

// limitsAsWritten are the attributes bounding an HTTP server's
// connections, embedded in the telemetry and attempt_api blocks alike:
// httplimit.Limits itself, decoded over the server's defaults. Its own
// type only so that the decoder leaves the check to the block (limits),
// which refuses a bad bound at its key.
type limitsAsWritten httplimit.Limits

// limits checks a server block's connection bounds and refuses, at the
// key, a bound that is not positive.
func (s limitsAsWritten) limits(b *hcl.Block, ranges map[string]hcl.Range) (httplimit.Limits, hcl.Diagnostics) {
	l := httplimit.Limits(s)
	var diags hcl.Diagnostics
	if _, ok := ranges["max_connections"]; ok && l.MaxConns < 1 {
		return l, append(diags, invalid(ranges, "max_connections", "max_connections must be a whole number, 1 or more."))
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

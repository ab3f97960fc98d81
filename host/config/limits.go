package config

import (
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/dexaflow/reaper/internal/httplimit"
)

// serverLimits are the attributes bounding an HTTP server's connections,
// embedded in the telemetry and attempt_api blocks alike: httplimit.Limits
// as the file writes them.
type serverLimits struct {
	ReadHeaderTimeout time.Duration `reaper:"read_header_timeout"`
	ReadTimeout       time.Duration `reaper:"read_timeout"`
	WriteTimeout      time.Duration `reaper:"write_timeout"`
	IdleTimeout       time.Duration `reaper:"idle_timeout"`
	// MaxConnections is read as a number, not an int, so that the block's
	// own check (limits) words the refusal of 0 or 1.5.
	MaxConnections float64 `reaper:"max_connections"`
}

// limitsBlock is l as a block's defaults.
func limitsBlock(l httplimit.Limits) serverLimits {
	return serverLimits{ReadHeaderTimeout: l.ReadHeaderTimeout, ReadTimeout: l.ReadTimeout,
		WriteTimeout: l.WriteTimeout, IdleTimeout: l.IdleTimeout, MaxConnections: float64(l.MaxConns)}
}

// limits reads a server block's connection bounds (decoded over defaults)
// and refuses, at the key, a bound that is not positive.
func (s serverLimits) limits(b *hcl.Block, ranges map[string]hcl.Range, defaults httplimit.Limits) (httplimit.Limits, hcl.Diagnostics) {
	l := httplimit.Limits{ReadHeaderTimeout: s.ReadHeaderTimeout, ReadTimeout: s.ReadTimeout,
		WriteTimeout: s.WriteTimeout, IdleTimeout: s.IdleTimeout, MaxConns: defaults.MaxConns}
	var diags hcl.Diagnostics
	if _, ok := ranges["max_connections"]; ok {
		n := s.MaxConnections
		if n < 1 || n != float64(int(n)) {
			return l, append(diags, invalid(ranges, "max_connections", "max_connections must be a whole number, 1 or more."))
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

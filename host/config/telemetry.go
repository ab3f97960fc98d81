package config

import (
	"fmt"
	"net"

	"github.com/hashicorp/hcl/v2"

	"github.com/dexaflow/reaper/internal/httplimit"
)

// EnvTelemetryHost, when set, replaces the host of telemetry.listen (the
// port stays): the chart sets it to the pod's IP from the downward API, so
// telemetry is served on the pod's address rather than on every interface.
const EnvTelemetryHost = "REAPER_TELEMETRY_HOST"

// TelemetryAddrDefault is telemetry.listen's default.
const TelemetryAddrDefault = "127.0.0.1:9464"

// Telemetry is the telemetry block.
type Telemetry struct {
	Listen string // host:port serving /metrics and /monitor/health
	// Loopback is a second address served when EnvTelemetryHost moved
	// Listen to the pod's IP: 127.0.0.1 on the same port, which only the
	// pod itself reaches (kubectl port-forward dials it there). "": none.
	Loopback string
	// Limits bound the server's connections: read_header_timeout,
	// read_timeout, write_timeout, idle_timeout, max_connections.
	Limits httplimit.Limits
}

// telemetryBlock is the telemetry block.
type telemetryBlock struct {
	Listen string `reaper:"listen"`
	limitsAsWritten
}

func (cfg *Config) decodeTelemetry(b *hcl.Block) hcl.Diagnostics {
	defaults := httplimit.DefaultTelemetry()
	tb := telemetryBlock{Listen: TelemetryAddrDefault, limitsAsWritten: limitsAsWritten(defaults)}
	ranges, diags := decodeInto(b.Body, &tb)
	cfg.Telemetry.Listen = tb.Listen
	if r, ok := ranges["listen"]; ok {
		cfg.ranges["telemetry.listen"] = r
	}
	var ld hcl.Diagnostics
	cfg.Telemetry.Limits, ld = tb.limits(b, ranges)
	return append(diags, ld...)
}

// telemetryHost puts host (EnvTelemetryHost) in place of telemetry.listen's
// host, and keeps loopback on the same port (see Telemetry.Loopback); ""
// leaves the address as configured.
func (cfg *Config) telemetryHost(host string) hcl.Diagnostics {
	if host == "" {
		return nil
	}
	r := cfg.rangeOf([]string{"telemetry.listen"})
	_, port, err := net.SplitHostPort(cfg.Telemetry.Listen)
	if err == nil && net.ParseIP(host) == nil {
		err = fmt.Errorf("%s=%q is not an IP address", EnvTelemetryHost, host)
	}
	if err != nil {
		return hcl.Diagnostics{{Severity: hcl.DiagError, Subject: &r,
			Summary: "Invalid telemetry address", Detail: err.Error() + "."}}
	}
	cfg.Telemetry.Listen = net.JoinHostPort(host, port)
	if ip := net.ParseIP(host); !ip.IsLoopback() {
		cfg.Telemetry.Loopback = net.JoinHostPort("127.0.0.1", port)
	}
	return nil
}

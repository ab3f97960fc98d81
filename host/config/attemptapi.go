package config

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/dexaflow/reaper/internal/httplimit"
	"github.com/dexaflow/reaper/internal/secretfile"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// AttemptAPIAddrDefault is attempt_api.listen's default.
const AttemptAPIAddrDefault = "127.0.0.1:9465"

// HeartbeatWindowDefault is attempt_api.heartbeat_window's default: how
// long a batch of heartbeats waits for company before it is written. On a
// ladder moved so low that it would break the window's rules (tests run
// heartbeats of 100ms), the default is the largest window they allow
// (defaultHeartbeatWindow); a window given in the file is held to them.
const HeartbeatWindowDefault = 20 * time.Millisecond

// defaultHeartbeatWindow is the window of a configuration that sets none:
// HeartbeatWindowDefault, or less on a ladder whose rules want less.
func defaultHeartbeatWindow(l ladder.Ladder) time.Duration {
	w := min(HeartbeatWindowDefault, l.Heartbeat/heartbeatWindowShare)
	if l.AgentLost > l.Heartbeat {
		w = min(w, (l.AgentLost-l.Heartbeat)/heartbeatWindowShare)
	}
	return max(w, 0)
}

// heartbeatWindowShare is how small the window must be beside the
// ladder's heartbeat and beside the silence agent_lost allows a live
// agent on top of it (agent_lost - heartbeat): at most a tenth of each.
const heartbeatWindowShare = 10

// AttemptAPI is the attempt_api block: where every replica serves the
// attempt API agents report through, and the keys and certificate it uses.
type AttemptAPI struct {
	Listen    string // host:port
	Advertise string // the base URL agents dial; default https://<bound address>
	// TLSCert and TLSKey are the operator's certificate and key; both empty:
	// a certificate for loopback use is generated once into StateDir.
	TLSCert, TLSKey string
	// TLSCA is the PEM agents are told to trust; default TLSCert.
	TLSCA string
	// SigningKeyFile is the operator's key file (HCL, current and previous
	// keys); empty: a key generated once into StateDir.
	SigningKeyFile string
	// StateDir holds what reaperd generates (signing key, loopback
	// certificate). Default: $TMPDIR/dexaflow-attempt-api-<uid>.
	StateDir string
	// Limits bound the server's connections (the keys of Telemetry.Limits).
	Limits httplimit.Limits
	// HeartbeatWindow is how long a batch of heartbeats waits for company
	// before it is written (attemptapi.ServerConfig.HeartbeatWindow); 0:
	// written as soon as a writer is free. Default HeartbeatWindowDefault.
	HeartbeatWindow time.Duration
	// Clients bound one client's connections and calls
	// (httplimit.DefaultAttemptAPIClients): the rates are per ladder
	// heartbeat (Per is set from the ladder).
	Clients httplimit.Clients
}

// defaultAttemptAPI is the attempt_api block's settings when the file has
// none.
func defaultAttemptAPI() AttemptAPI {
	return AttemptAPI{Listen: AttemptAPIAddrDefault, StateDir: DefaultAttemptAPIStateDir(), Limits: httplimit.DefaultAttemptAPI(),
		HeartbeatWindow: HeartbeatWindowDefault, Clients: httplimit.DefaultAttemptAPIClients(ladder.Defaults().Heartbeat)}
}

// DefaultAttemptAPIStateDir is the default attempt_api.state_dir.
func DefaultAttemptAPIStateDir() string {
	return filepath.Join(os.TempDir(), "dexaflow-attempt-api-"+strconv.Itoa(os.Getuid()))
}

// attemptAPIBlock is the attempt_api block.
type attemptAPIBlock struct {
	Listen         string `reaper:"listen"`
	Advertise      string `reaper:"advertise"`
	TLSCert        string `reaper:"tls_cert"`
	TLSKey         string `reaper:"tls_key"`
	TLSCA          string `reaper:"tls_ca"`
	SigningKeyFile string `reaper:"signing_key_file"`
	StateDir       string `reaper:"state_dir"`
	// HeartbeatWindow is read as given; validateHeartbeatWindow holds it to
	// the ladder once the whole file is read.
	HeartbeatWindow time.Duration `reaper:"heartbeat_window"`
	serverLimits
	clientBounds
}

// clientBounds are the attempt_api block's per-client bounds
// (httplimit.Clients), read as numbers so that clients checks them.
type clientBounds struct {
	MaxConnsPerAddress float64 `reaper:"max_connections_per_address"`
	AddressRequests    float64 `reaper:"address_requests_per_heartbeat"`
	TokenRequests      float64 `reaper:"token_requests_per_heartbeat"`
	TokenInFlight      float64 `reaper:"token_calls_in_flight"`
}

// clients reads the per-client bounds, refusing at its key one that is not
// a whole number of at least 1.
func (c clientBounds) clients(ranges map[string]hcl.Range) (httplimit.Clients, hcl.Diagnostics) {
	var diags hcl.Diagnostics
	whole := func(key string, n float64) int {
		if n < 1 || n != float64(int(n)) {
			diags = append(diags, invalid(ranges, key, key+" must be a whole number, 1 or more."))
			return 1
		}
		return int(n)
	}
	cl := httplimit.Clients{
		MaxConnsPerAddress: whole("max_connections_per_address", c.MaxConnsPerAddress),
		AddressRequests:    whole("address_requests_per_heartbeat", c.AddressRequests),
		SubjectRequests:    whole("token_requests_per_heartbeat", c.TokenRequests),
		SubjectInFlight:    whole("token_calls_in_flight", c.TokenInFlight),
		Per:                ladder.Defaults().Heartbeat,
	}
	return cl, diags
}

func (cfg *Config) decodeAttemptAPI(b *hcl.Block) hcl.Diagnostics {
	defaults := httplimit.DefaultAttemptAPI()
	cd := httplimit.DefaultAttemptAPIClients(ladder.Defaults().Heartbeat)
	ab := attemptAPIBlock{Listen: AttemptAPIAddrDefault, HeartbeatWindow: HeartbeatWindowDefault, serverLimits: limitsBlock(defaults),
		clientBounds: clientBounds{MaxConnsPerAddress: float64(cd.MaxConnsPerAddress), AddressRequests: float64(cd.AddressRequests),
			TokenRequests: float64(cd.SubjectRequests), TokenInFlight: float64(cd.SubjectInFlight)}}
	ranges, diags := decodeInto(b.Body, &ab)
	api := AttemptAPI{
		Listen: ab.Listen, Advertise: ab.Advertise,
		TLSCert: cfg.relative(ab.TLSCert), TLSKey: cfg.relative(ab.TLSKey),
		TLSCA: cfg.relative(ab.TLSCA), SigningKeyFile: cfg.relative(ab.SigningKeyFile),
		StateDir: cfg.relative(ab.StateDir), HeartbeatWindow: ab.HeartbeatWindow,
	}
	for _, k := range []string{"tls_cert", "tls_key", "tls_ca", "signing_key_file", "heartbeat_window"} {
		if rr, ok := ranges[k]; ok {
			cfg.ranges["attempt_api."+k] = rr
		}
	}
	var ld hcl.Diagnostics
	api.Limits, ld = ab.limits(b, ranges, defaults)
	diags = append(diags, ld...)
	api.Clients, ld = ab.clients(ranges)
	diags = append(diags, ld...)
	if api.StateDir == "" {
		api.StateDir = DefaultAttemptAPIStateDir()
	}
	if (api.TLSCert == "") != (api.TLSKey == "") {
		r := b.DefRange
		for _, k := range []string{"tls_cert", "tls_key"} {
			if rr, ok := ranges[k]; ok {
				r = rr
			}
		}
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
			Summary: "Incomplete attempt API certificate", Detail: "tls_cert and tls_key go together."})
	}
	if api.TLSCA != "" && api.TLSCert == "" {
		r := ranges["tls_ca"]
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
			Summary: "tls_ca without a certificate", Detail: "tls_ca names what agents trust for the operator's tls_cert; give tls_cert and tls_key."})
	}
	if api.TLSCert == "" && !loopbackListen(api.Listen) {
		r := b.DefRange
		if rr, ok := ranges["listen"]; ok {
			r = rr
		}
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
			Summary: "Attempt API off loopback without a certificate",
			Detail:  fmt.Sprintf("listen %q is not a loopback address: give tls_cert and tls_key (the generated certificate is for loopback use only).", api.Listen)})
	}
	cfg.AttemptAPI = api
	return diags
}

// validateHeartbeatWindow sets the default window of a configuration that
// gives none (defaultHeartbeatWindow), and refuses, at its key, a heartbeat window that is
// negative or not far below the ladder: at most a tenth of the heartbeat,
// and a tenth of agent_lost - heartbeat (the silence the agent-lost reaper
// allows a live agent past its heartbeat, which the window's delay of each
// write eats into). Run after the ladder is decoded (the block may come
// before it in the file).
func (cfg *Config) validateHeartbeatWindow() hcl.Diagnostics {
	// The per-client call rates are per heartbeat.
	cfg.AttemptAPI.Clients.Per = cfg.Ladder.Heartbeat
	if _, given := cfg.ranges["attempt_api.heartbeat_window"]; !given {
		cfg.AttemptAPI.HeartbeatWindow = defaultHeartbeatWindow(cfg.Ladder)
		return nil
	}
	w, l := cfg.AttemptAPI.HeartbeatWindow, cfg.Ladder
	var rule string
	switch {
	case w < 0:
		rule = fmt.Sprintf("attempt_api.heartbeat_window (%s) must not be negative (0: no window)", ladder.Format(w))
	case w > l.Heartbeat/heartbeatWindowShare:
		rule = fmt.Sprintf("attempt_api.heartbeat_window (%s) must be at most a tenth of the heartbeat (%s): "+
			"every heartbeat's write and answer wait up to one window", ladder.Format(w), ladder.Format(l.Heartbeat))
	case l.AgentLost > l.Heartbeat && w > (l.AgentLost-l.Heartbeat)/heartbeatWindowShare:
		rule = fmt.Sprintf("attempt_api.heartbeat_window (%s) must be at most a tenth of agent_lost - heartbeat (%s - %s): "+
			"a live agent's recorded silence grows by up to one window", ladder.Format(w),
			ladder.Format(l.AgentLost), ladder.Format(l.Heartbeat))
	default:
		return nil
	}
	subject := cfg.rangeOf([]string{"attempt_api.heartbeat_window"})
	return hcl.Diagnostics{{Severity: hcl.DiagError, Subject: &subject,
		Summary: "Invalid heartbeat window", Detail: rule + "."}}
}

// checkKeyFiles refuses, at its key, a private key file that others may
// read or write (the attempt API's tls_key and signing_key_file), and
// warns of a certificate that others may write (tls_cert, tls_ca). Files
// that do not exist are left to the daemon's load, which names them.
func (cfg *Config) checkKeyFiles() hcl.Diagnostics {
	var diags hcl.Diagnostics
	api := cfg.AttemptAPI
	for _, k := range []struct{ key, path string }{
		{"tls_key", api.TLSKey}, {"signing_key_file", api.SigningKeyFile},
	} {
		if k.path == "" {
			continue
		}
		if err := secretfile.PrivateKey(k.path); err != nil {
			r := cfg.rangeOf([]string{"attempt_api." + k.key})
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
				Summary: fmt.Sprintf("Invalid value for %q", k.key), Detail: err.Error() + "."})
		}
	}
	for _, k := range []struct{ key, path string }{{"tls_cert", api.TLSCert}, {"tls_ca", api.TLSCA}} {
		if k.path == "" {
			continue
		}
		if w := secretfile.Certificate(k.path); w != "" {
			r := cfg.rangeOf([]string{"attempt_api." + k.key})
			cfg.Warnings = append(cfg.Warnings, fmt.Sprintf("%s:%d:%d: attempt_api.%s: %s",
				r.Filename, r.Start.Line, r.Start.Column, k.key, w))
		}
	}
	return diags
}

// loopbackListen reports whether host:port names a loopback host.
func loopbackListen(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}

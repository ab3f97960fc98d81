package config

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/hashicorp/hcl/v2"

	"github.com/dexaflow/reaper/internal/httplimit"
	"github.com/dexaflow/reaper/internal/secretfile"
)

// AttemptAPIAddrDefault is attempt_api.listen's default.
const AttemptAPIAddrDefault = "127.0.0.1:9465"

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
	serverLimits
}

func (cfg *Config) decodeAttemptAPI(b *hcl.Block) hcl.Diagnostics {
	defaults := httplimit.DefaultAttemptAPI()
	ab := attemptAPIBlock{Listen: AttemptAPIAddrDefault, serverLimits: limitsBlock(defaults)}
	ranges, diags := decodeInto(b.Body, &ab)
	api := AttemptAPI{
		Listen: ab.Listen, Advertise: ab.Advertise,
		TLSCert: cfg.relative(ab.TLSCert), TLSKey: cfg.relative(ab.TLSKey),
		TLSCA: cfg.relative(ab.TLSCA), SigningKeyFile: cfg.relative(ab.SigningKeyFile),
		StateDir: cfg.relative(ab.StateDir),
	}
	for _, k := range []string{"tls_cert", "tls_key", "tls_ca", "signing_key_file"} {
		if rr, ok := ranges[k]; ok {
			cfg.ranges["attempt_api."+k] = rr
		}
	}
	var ld hcl.Diagnostics
	api.Limits, ld = ab.limits(b, ranges, defaults)
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

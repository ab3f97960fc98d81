package config

import (
	"fmt"

	"github.com/hashicorp/hcl/v2"

	"github.com/dexaflow/reaper/internal/httplimit"
	"github.com/dexaflow/reaper/internal/secretfile"
	"github.com/dexaflow/reaper/runner/attemptapi"
)

// AttemptAPIAddrDefault is attempt_api.listen's default
// (attemptapi.ListenDefault).
const AttemptAPIAddrDefault = attemptapi.ListenDefault

// HeartbeatWindowDefault is attempt_api.heartbeat_window's default
// (attemptapi.HeartbeatWindowDefault, whose rules are the attempt API's).
const HeartbeatWindowDefault = attemptapi.HeartbeatWindowDefault

// AttemptAPI is the attempt_api block: the attempt API's own settings
// (attemptapi.Settings), with their defaults and rules.
type AttemptAPI = attemptapi.Settings

// DefaultAttemptAPIStateDir is the default attempt_api.state_dir
// (attemptapi.DefaultStateDir).
func DefaultAttemptAPIStateDir() string { return attemptapi.DefaultStateDir() }

// attemptAPIBlock is the attempt_api block as written: the attempt API's
// own keys (attemptapi.Block) and the server limits it shares with the
// telemetry block.
type attemptAPIBlock struct {
	attemptapi.Block
	limitsAsWritten
}

func (cfg *Config) decodeAttemptAPI(b *hcl.Block) hcl.Diagnostics {
	defaults := httplimit.DefaultAttemptAPI()
	ab := attemptAPIBlock{Block: attemptapi.DefaultBlock(), limitsAsWritten: limitsAsWritten(defaults)}
	ranges, diags := decodeInto(b.Body, &ab)
	for _, k := range []string{"tls_cert", "tls_key", "tls_ca", "signing_key_file", "heartbeat_window"} {
		if rr, ok := ranges[k]; ok {
			cfg.ranges["attempt_api."+k] = rr
		}
	}
	api, problems := ab.Block.Settings()
	var ld hcl.Diagnostics
	api.Limits, ld = ab.limits(b, ranges)
	diags = append(diags, ld...)
	diags = append(diags, refusals(b.DefRange, ranges, problems)...)
	api.TLSCert, api.TLSKey = cfg.relative(api.TLSCert), cfg.relative(api.TLSKey)
	api.TLSCA, api.SigningKeyFile = cfg.relative(api.TLSCA), cfg.relative(api.SigningKeyFile)
	if api.StateDir = cfg.relative(api.StateDir); api.StateDir == "" {
		api.StateDir = DefaultAttemptAPIStateDir()
	}
	cfg.AttemptAPI = api
	return diags
}

// validateHeartbeatWindow holds the attempt API's settings to the ladder
// (attemptapi.Settings.FitLadder: the default window of a configuration
// that gives none, the per-heartbeat client rates) and refuses, at its
// key, a heartbeat window its rules refuse. Run after the ladder is
// decoded (the block may come before it in the file).
func (cfg *Config) validateHeartbeatWindow() hcl.Diagnostics {
	_, given := cfg.ranges["attempt_api.heartbeat_window"]
	rule := cfg.AttemptAPI.FitLadder(cfg.Ladder, given)
	if rule == "" {
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

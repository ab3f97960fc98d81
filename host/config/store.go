package config

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"

	"github.com/hashicorp/hcl/v2"

	"github.com/dexaflow/reaper/internal/secretfile"
)

// EnvDSN overrides store.dsn and store.dsn_file when set. reaperd removes
// it from its own environment once the configuration is read, so that no
// process it starts inherits it.
const EnvDSN = "REAPER_DSN"

// EnvDSNFile overrides store.dsn and store.dsn_file when set: the file the
// DSN is read from.
const EnvDSNFile = "REAPER_DSN_FILE"

// MaxDSNFile bounds the DSN file: a connection string, not a document.
const MaxDSNFile = 64 << 10

// storeBlock is the store block. dsn and dsn_file exclude each other.
type storeBlock struct {
	DSN string `reaper:"dsn"` // the board's PostgreSQL; EnvDSN overrides it
	// DSNFile is a file holding the DSN on one line (a trailing newline is
	// trimmed): a password then stays out of the configuration file and
	// out of reaperd's environment. Mode 0600 (or 0640, root's), as a key.
	DSNFile string `reaper:"dsn_file"`
}

func (cfg *Config) decodeStore(b *hcl.Block) hcl.Diagnostics {
	var sb storeBlock
	ranges, diags := decodeInto(b.Body, &sb)
	for key, r := range ranges {
		cfg.ranges["store."+key] = r
	}
	cfg.StoreDSN = sb.DSN
	cfg.StoreDSNFile = cfg.relative(sb.DSNFile)
	_, hasDSN := ranges["dsn"]
	if _, hasFile := ranges["dsn_file"]; hasDSN && hasFile {
		diags = append(diags, invalid(ranges, "dsn_file",
			"store.dsn and store.dsn_file exclude each other: give the DSN in one of them."))
	}
	return diags
}

// storeFromEnv applies EnvDSN and EnvDSNFile, then reads the DSN file when
// there is one. With wait, a file that is missing or not one line is no
// error: StoreDSNWait says why.
func (cfg *Config) storeFromEnv(getenv func(string) string, wait bool) hcl.Diagnostics {
	dsn, file := getenv(EnvDSN), getenv(EnvDSNFile)
	switch {
	case dsn != "" && file != "":
		r := cfg.file
		return hcl.Diagnostics{{Severity: hcl.DiagError, Subject: &r, Summary: "Conflicting environment",
			Detail: EnvDSN + " and " + EnvDSNFile + " exclude each other: set one of them."}}
	case dsn != "":
		cfg.StoreDSN, cfg.StoreDSNFile = dsn, ""
		return nil
	case file != "":
		cfg.StoreDSN, cfg.StoreDSNFile = "", file
	}
	if cfg.StoreDSNFile == "" {
		return nil
	}
	dsn, err := ReadDSNFile(cfg.StoreDSNFile)
	var ferr *DSNFileError
	if wait && errors.As(err, &ferr) {
		cfg.StoreDSNWait = err
		return nil
	}
	if err != nil {
		r := cfg.rangeOf([]string{"store.dsn_file"})
		if file != "" {
			err = fmt.Errorf("%s: %w", EnvDSNFile, err)
		}
		return hcl.Diagnostics{{Severity: hcl.DiagError, Subject: &r,
			Summary: `Invalid value for "dsn_file"`, Detail: err.Error() + "."}}
	}
	cfg.StoreDSN = dsn
	return nil
}

// DSNFileError is a DSN file that is missing, or whose text is not one
// line (empty, several lines, too large): what a Secret not created yet,
// or written wrong, gives. Both can be put right in place (a Secret created
// or corrected after the pod started appears in its volume), so reaperd
// run waits for the file rather than exiting. It never carries the text.
type DSNFileError struct {
	Path    string
	Problem string // e.g. "does not exist (no such file or directory)"
}

func (e *DSNFileError) Error() string { return "DSN file " + e.Path + " " + e.Problem }

// ReadDSNFile reads the DSN from path: one line, its trailing newline
// trimmed. The file is held to the key files' rule (secretfile). A file
// that is missing or not one line is a *DSNFileError.
func ReadDSNFile(path string) (string, error) {
	if err := secretfile.PrivateKey(path); err != nil {
		return "", err
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", &DSNFileError{Path: path, Problem: "does not exist (no such file or directory)"}
	}
	if err != nil {
		return "", fmt.Errorf("reading the DSN file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxDSNFile+1))
	if err != nil {
		return "", fmt.Errorf("reading the DSN file %s: %w", path, err)
	}
	if len(b) > MaxDSNFile {
		return "", &DSNFileError{Path: path, Problem: fmt.Sprintf("is larger than %d bytes", MaxDSNFile)}
	}
	dsn := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	switch {
	case dsn == "":
		return "", &DSNFileError{Path: path, Problem: "is empty"}
	case strings.ContainsAny(dsn, "\r\n"):
		return "", &DSNFileError{Path: path, Problem: "holds more than one line: give the DSN alone, on one line"}
	}
	return dsn, nil
}

// Secrets are the paths of reaperd's own secrets that this configuration
// names: the configuration file (it may hold store.dsn), the DSN file, the
// attempt API's TLS key and signing key file, and its state directory
// (where reaperd generates a signing key and a loopback key). No plugin
// may read them (the loader hides them).
func (cfg *Config) Secrets() []string {
	var out []string
	for _, p := range []string{cfg.Path, cfg.StoreDSNFile, cfg.AttemptAPI.TLSKey, cfg.AttemptAPI.SigningKeyFile,
		cfg.AttemptAPI.StateDir} {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

// APICredentials are the kubeconfig files this configuration names (the
// kubernetes leader's, the kube substrate's, as written and relative to
// the file): they reach the API server as reaperd. The substrate uses them;
// no reaper plugin may open them (nor the ServiceAccount token).
func (cfg *Config) APICredentials() []string {
	var out []string
	add := func(p string) {
		if p != "" && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	add(cfg.Leader.Kubeconfig)
	if cfg.Substrate.Body != nil {
		raw := peekString(cfg.Substrate.Body, "kubeconfig")
		add(raw)
		add(cfg.relative(raw))
	}
	return out
}

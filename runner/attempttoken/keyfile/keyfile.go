// Package keyfile reads and writes attempt token signing keys as HCL files,
// and generates and publishes them for loopback use. It is apart from
// package attempttoken so that what mints and checks tokens (runners,
// agents) depends on the standard library only.
package keyfile

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/zclconf/go-cty/cty"
	"golang.org/x/sys/unix"

	"github.com/dexaflow/reaper/internal/ownerdir"
	"github.com/dexaflow/reaper/internal/secretfile"
	"github.com/dexaflow/reaper/runner/attempttoken"
)

// A key file is HCL: one current block (the key new tokens are signed with)
// and any number of previous blocks (keys still accepted), each labelled
// with its key id and holding the secret in standard base64:
//
//	current "2026-12" {
//	  secret = "base64 of at least 32 random bytes"
//	}
//	previous "2026-11" {
//	  secret = "..."
//	}
//
// Rotation: write the new key as current and move the old one to previous;
// reaperd rereads the file (Watch); drop the previous key once one attempt
// token TTL has passed.
var keyFileSchema = &hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{
	{Type: "current", LabelNames: []string{"id"}},
	{Type: "previous", LabelNames: []string{"id"}},
}}

var keyBlockSchema = &hcl.BodySchema{Attributes: []hcl.AttributeSchema{{Name: "secret", Required: true}}}

// Load reads a key file into a keyring.
// A file that others may read or write is refused (secretfile.PrivateKey).
func Load(path string) (*attempttoken.Keyring, error) {
	if err := secretfile.PrivateKey(path); err != nil {
		return nil, err
	}
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the attempt signing key file: %w", err)
	}
	kr, diags := Parse(path, src)
	if diags.HasErrors() {
		return nil, fmt.Errorf("attempt signing key file: %w", diags)
	}
	return kr, nil
}

// Parse parses a key file's bytes.
func Parse(path string, src []byte) (*attempttoken.Keyring, hcl.Diagnostics) {
	file, diags := hclparse.NewParser().ParseHCL(src, path)
	if diags.HasErrors() {
		return nil, diags
	}
	content, diags := file.Body.Content(keyFileSchema)
	if diags.HasErrors() {
		return nil, diags
	}
	var (
		current  *attempttoken.Key
		previous []attempttoken.Key
	)
	for _, b := range content.Blocks {
		attrs, d := b.Body.Content(keyBlockSchema)
		diags = append(diags, d...)
		if d.HasErrors() {
			continue
		}
		v, d := attrs.Attributes["secret"].Expr.Value(nil)
		diags = append(diags, d...)
		if d.HasErrors() {
			continue
		}
		r := attrs.Attributes["secret"].Expr.Range()
		if v.IsNull() || v.Type() != cty.String {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
				Summary: "Invalid secret", Detail: "secret must be a base64 string."})
			continue
		}
		secret, err := base64.StdEncoding.DecodeString(strings.TrimSpace(v.AsString()))
		if err != nil {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
				Summary: "Invalid secret", Detail: "secret must be standard base64: " + err.Error()})
			continue
		}
		k := attempttoken.Key{ID: b.Labels[0], Secret: secret}
		if err := k.Check(); err != nil {
			lr := b.LabelRanges[0]
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &lr,
				Summary: "Invalid signing key", Detail: err.Error()})
			continue
		}
		if b.Type == "current" {
			if current != nil {
				dr := b.DefRange
				diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &dr,
					Summary: "Duplicate current key", Detail: "exactly one current block signs new tokens."})
				continue
			}
			current = &k
		} else {
			previous = append(previous, k)
		}
	}
	if diags.HasErrors() {
		return nil, diags
	}
	if current == nil {
		r := file.Body.MissingItemRange()
		return nil, hcl.Diagnostics{{Severity: hcl.DiagError, Subject: &r,
			Summary: "No current key", Detail: "a key file needs one current block."}}
	}
	kr, err := attempttoken.NewKeyring(*current, previous...)
	if err != nil {
		r := file.Body.MissingItemRange()
		return nil, hcl.Diagnostics{{Severity: hcl.DiagError, Subject: &r, Summary: "Invalid key file", Detail: err.Error()}}
	}
	return kr, nil
}

// Format renders keys as a key file: current first, then previous.
func Format(current attempttoken.Key, previous ...attempttoken.Key) []byte {
	var b strings.Builder
	b.WriteString("# Attempt token signing keys: current signs, every key verifies.\n")
	write := func(kind string, k attempttoken.Key) {
		fmt.Fprintf(&b, "%s %q {\n  secret = %q\n}\n", kind, k.ID, base64.StdEncoding.EncodeToString(k.Secret))
	}
	write("current", current)
	for _, k := range previous {
		write("previous", k)
	}
	return []byte(b.String())
}

// NewKey returns a random key with a random id.
func NewKey() (attempttoken.Key, error) {
	secret := make([]byte, attempttoken.MinSecretLen)
	if _, err := rand.Read(secret); err != nil {
		return attempttoken.Key{}, fmt.Errorf("generating a signing key: %w", err)
	}
	id := make([]byte, 4)
	if _, err := rand.Read(id); err != nil {
		return attempttoken.Key{}, fmt.Errorf("generating a signing key id: %w", err)
	}
	return attempttoken.Key{ID: "gen-" + hex.EncodeToString(id), Secret: secret}, nil
}

// LoadOrCreate loads the key file at path, or, when there is none,
// generates a key and writes it there first (the loopback Lite case, where
// no operator provides one). The file's directory must be private to the
// user (created 0700 when missing). Several replicas starting together
// agree on one key: the file is published with a hard link, which only the
// first writer wins.
func LoadOrCreate(path string) (*attempttoken.Keyring, error) {
	if err := PrivateDir(filepath.Dir(path)); err != nil {
		return nil, err
	}
	if _, err := os.Lstat(path); err == nil {
		return Load(path)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("attempt signing key file: %w", err)
	}
	k, err := NewKey()
	if err != nil {
		return nil, err
	}
	if err := PublishFile(path, Format(k)); err != nil {
		return nil, err
	}
	return Load(path)
}

// PrivateDir makes dir (0700) when it is missing and refuses it unless only
// the user can write it.
func PrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("making %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("checking %s: %w", dir, err)
	}
	if why := ownerdir.Refusal(&st); why != nil {
		return fmt.Errorf("directory %s refused: %w", dir, why)
	}
	return nil
}

// PublishFile writes data (mode 0600) to path unless a file is already
// there: written to a temporary file first and hard-linked into place, so a
// reader never sees it half written and of two writers the first wins (the
// loser's error is nil: the winner's file stands).
func PublishFile(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	_, werr := tmp.Write(data)
	serr := tmp.Sync()
	cerr := tmp.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("publishing %s: %w", path, err)
	}
	return nil
}

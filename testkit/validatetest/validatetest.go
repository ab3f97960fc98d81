// Package validatetest runs `reaperd validate` on a configuration with real
// plugin binaries, for the tests of the shipped configurations (deploy/) and
// of the Helm chart's rendered one (deploy/helm).
package validatetest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
)

// Build builds the given main packages (paths as the go command takes them,
// relative to the test's directory) into a fresh directory and returns it.
func Build(t testing.TB, pkgs ...string) string {
	t.Helper()
	bin := t.TempDir()
	cmd := exec.Command("go", append([]string{"build", "-o", bin + string(filepath.Separator)}, pkgs...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("validatetest: building %v: %v\n%s", pkgs, err, out)
	}
	return bin
}

var pluginDir = regexp.MustCompile(`(?m)^plugin_dir\s*=\s*"[^"]*"`)

// Validate writes src, its plugin_dir pointed at bin, to a file and runs
// bin/reaperd validate on it with env added to the environment. It fails t
// when src sets no plugin_dir; it returns what reaperd printed and how it
// exited.
func Validate(t testing.TB, bin string, src []byte, env ...string) (string, error) {
	t.Helper()
	if !pluginDir.Match(src) {
		t.Fatalf("validatetest: the configuration sets no plugin_dir:\n%s", src)
	}
	path := filepath.Join(t.TempDir(), "reaper.hcl")
	src = pluginDir.ReplaceAll(src, []byte("plugin_dir = "+strconv.Quote(bin)))
	if err := os.WriteFile(path, src, 0o600); err != nil {
		t.Fatal(err)
	}
	// TMPDIR holds the plugins' unix sockets (and the Lite record
	// directory); a socket path must stay under about 100 bytes, so the
	// directory is a short one, not t.TempDir().
	tmp, err := os.MkdirTemp("", "rv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	cmd := exec.Command(filepath.Join(bin, "reaperd"), "validate", "-config", path)
	cmd.Env = append(append(os.Environ(), "TMPDIR="+tmp), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

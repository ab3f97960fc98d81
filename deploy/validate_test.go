package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestExampleConfigurationsValidate runs `reaperd validate` on the shipped
// configurations, with real plugin binaries: the file parses, its ladder is in
// order, and every plugin it names starts and accepts its block. Only
// plugin_dir is pointed at the binaries built for the test.
func TestExampleConfigurationsValidate(t *testing.T) {
	if testing.Short() {
		t.Skip("builds reaperd and the Lite plugins")
	}
	bin := t.TempDir()
	cmd := exec.Command("go", "build", "-o", bin+string(filepath.Separator),
		"../host/cmd/reaperd", "../substrate/lite/cmd/reaper-substrate-lite",
		"../plugins/dispatchlost/cmd/reaper-dispatchlost", "../plugins/agentlost/cmd/reaper-agentlost",
		"../plugins/orphanrun/cmd/reaper-orphanrun")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building: %v\n%s", err, out)
	}
	pluginDir := regexp.MustCompile(`(?m)^plugin_dir\s*=\s*"[^"]*"`)
	for _, file := range []string{liteHCLPath, "../config.hcl.example"} {
		t.Run(filepath.Base(file), func(t *testing.T) {
			src := readFile(t, file)
			if !pluginDir.Match(src) {
				t.Fatalf("%s sets no plugin_dir", file)
			}
			dir := t.TempDir()
			path := filepath.Join(dir, "reaper.hcl")
			src = pluginDir.ReplaceAll(src, []byte("plugin_dir = "+strconv.Quote(bin)))
			if err := os.WriteFile(path, src, 0o600); err != nil {
				t.Fatal(err)
			}
			// TMPDIR holds the plugins' unix sockets and the Lite record
			// directory; a socket path must stay under about 100 bytes, so
			// the directory is a short one, not t.TempDir().
			tmp, err := os.MkdirTemp("", "rv")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(tmp) })
			cmd := exec.Command(filepath.Join(bin, "reaperd"), "validate", "-config", path)
			cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), ": valid (edition lite") {
				t.Fatalf("reaperd validate %s: %v\n%s", file, err, out)
			}
		})
	}
}

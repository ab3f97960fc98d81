package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStartUpErrorsAreOneLine runs the real reaperd with each way its start
// can fail and checks that it exits non-zero with one plain line naming the
// cause: never a panic, never a Go stack trace. An unreachable database is
// not among them on purpose: reaperd starts, reports itself unhealthy and
// retries (TestDatabaseDownAtStart).
func TestStartUpErrorsAreOneLine(t *testing.T) {
	t.Parallel()
	real := filepath.Join(binDir, realDir)
	const dsn = "postgres://reaper@127.0.0.1:1/reaper?sslmode=disable"
	base := func(pluginDir, substrate, extra string) string {
		return fmt.Sprintf("edition = \"lite\"\nplugin_dir = %q\nstore {\n  dsn = %q\n}\n%s\n%s\nreaper \"agentlost\" {}\n",
			pluginDir, dsn, extra, substrate)
	}
	telemetry := "telemetry {\n  listen = \"127.0.0.1:0\"\n}\n"

	// A record directory that is a symlink, and one that others may write.
	symlink := filepath.Join(t.TempDir(), "records")
	if err := os.Symlink(t.TempDir(), symlink); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(t.TempDir(), "records")
	if err := os.Mkdir(open, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil { // past the umask
		t.Fatal(err)
	}
	// A telemetry address already taken.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() }) // the subtests run after this function returns
	taken := fmt.Sprintf("telemetry {\n  listen = %q\n}\n", ln.Addr().String())

	for _, tc := range []struct {
		name, config, cause string
	}{
		{"MissingPluginBinary", base(t.TempDir(), `substrate "lite" {}`, telemetry), "binary not found"},
		{"RecordDirIsASymlink", base(real, fmt.Sprintf("substrate \"lite\" {\n  record_dir = %q\n}", symlink), telemetry), "symlink"},
		{"RecordDirWritableByOthers", base(real, fmt.Sprintf("substrate \"lite\" {\n  record_dir = %q\n}", open), telemetry), "writable"},
		{"TelemetryAddressTaken", base(real, `substrate "lite" {}`, taken), "address already in use"},
		// Given in the file (not in a DSN file, which reaperd waits for),
		// a DSN that does not parse is said without its text.
		{"BadDSN", strings.Replace(base(real, `substrate "lite" {}`, telemetry), dsn, "postgres://reaper:"+dsnCanary+"@%zz/reaper", 1), "dsn"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "reaper.hcl")
			if err := os.WriteFile(path, []byte(tc.config), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, filepath.Join(binDir, "reaperd"), "run", "-config", path)
			cmd.Env = append(os.Environ(), "REAPER_DSN=")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			out := stderr.String()
			if ctx.Err() != nil {
				t.Fatalf("reaperd did not exit: %s", out)
			}
			if code := cmd.ProcessState.ExitCode(); err == nil || code != 1 {
				t.Fatalf("exit code %d (%v), want 1; stderr:\n%s", code, err, out)
			}
			if strings.Contains(out, "panic") || strings.Contains(out, "goroutine ") {
				t.Fatalf("reaperd panicked:\n%s", out)
			}
			var lines []string
			for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
				if strings.HasPrefix(l, "reaperd: ") {
					lines = append(lines, l)
				}
			}
			if len(lines) != 1 || !strings.Contains(strings.ToLower(lines[0]), tc.cause) {
				t.Fatalf("want one line naming %q, got %q; stderr:\n%s", tc.cause, lines, out)
			}
			if strings.Contains(out, dsnCanary) || strings.Contains(out, "%zz") {
				t.Fatalf("the DSN's text is in reaperd's output:\n%s", out)
			}
		})
	}
}

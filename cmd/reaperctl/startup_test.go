package main_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStartUpErrorsAreOneLine runs the real binary with each way a command
// can fail before it reads anything and checks its exit status and its one
// line naming the cause.
func TestStartUpErrorsAreOneLine(t *testing.T) {
	dir := t.TempDir()
	config := func(dsn string) string {
		path := filepath.Join(t.TempDir(), "reaper.hcl")
		src := "edition = \"lite\"\nsubstrate \"lite\" {}\nstore {\n  dsn = \"" + dsn + "\"\n}\n"
		if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	for _, tc := range []struct {
		name  string
		args  []string
		code  int
		cause string
	}{
		{"BoardUnreachable", []string{"status", "-config", config("postgres://reaper@127.0.0.1:1/reaper?sslmode=disable")}, 1, "cannot reach the board"},
		{"BadDSN", []string{"explain", "-config", config("postgres://%zz"), "run", "task"}, 1, "cannot parse"},
		{"NoSuchConfigFile", []string{"status", "-config", filepath.Join(dir, "absent.hcl")}, 1, "no such file"},
		{"NoConfig", []string{"held"}, 2, "-config FILE is required"},
		{"UnknownCommand", []string{"reap-everything"}, 2, "unknown command"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := reaperctl(t, tc.args...)
			out := strings.TrimSpace(stderr)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, tc.code, out)
			}
			if strings.Contains(out, "\n") || !strings.Contains(out, tc.cause) || !strings.HasPrefix(out, "reaperctl") {
				t.Fatalf("want one line naming %q, got:\n%s", tc.cause, out)
			}
		})
	}
}

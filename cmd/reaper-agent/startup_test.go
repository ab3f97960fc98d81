package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestStartUpErrorsAreOneLine runs the real binary with each kind of bad
// start and checks that it exits with the usage status and one line naming
// every problem, never a stack trace.
func TestStartUpErrorsAreOneLine(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "reaper-agent")
	link := filepath.Join(t.TempDir(), "records")
	if err := os.Symlink(t.TempDir(), link); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		name  string
		args  []string
		env   []string
		cause []string
	}{
		{"NothingGiven", nil, nil, []string{"-run is required", "-task is required", "-command is required"}},
		{"WorkerWithoutItsName", []string{"-mode", "worker"}, nil, []string{"-mode worker needs -worker"}},
		{"RecordDirIsASymlink", []string{"-run", "r", "-task", "t", "-command", "true", "-reporter", "file",
			"-report-file", filepath.Join(t.TempDir(), "report"), "-record-dir", link},
			nil, []string{"record directory refused"}},
		{"APIReporterWithoutItsCredential", []string{"-run", "r", "-task", "t", "-command", "true", "-reporter", "api",
			"-record-dir", t.TempDir()}, []string{"REAPER_ATTEMPT_TOKEN=", "REAPER_ATTEMPT_API="}, []string{"cannot reach the attempt API"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin, tc.args...)
			cmd.Env = append(os.Environ(), tc.env...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			out := strings.TrimSpace(stderr.String())
			if code := cmd.ProcessState.ExitCode(); err == nil || code != exitUsage {
				t.Fatalf("exit %d (%v), want %d; stderr:\n%s", code, err, exitUsage, out)
			}
			if strings.Contains(out, "\n") || strings.Contains(out, "goroutine ") {
				t.Fatalf("want one line, got:\n%s", out)
			}
			for _, c := range tc.cause {
				if !strings.Contains(out, c) {
					t.Errorf("%q does not name %q", out, c)
				}
			}
		})
	}
}

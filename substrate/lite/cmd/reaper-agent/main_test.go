package main

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dexaflow/reaper/substrate/lite/agent"
)

func TestBadCommandLineIsAUsageError(t *testing.T) {
	if code := run([]string{"-run", "r"}); code != exitUsage {
		t.Fatalf("exit %d, want %d", code, exitUsage)
	}
}

func TestNoGoAheadRunsNothing(t *testing.T) {
	dir := t.TempDir()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	w.Close() // the spawner went away before releasing the agent
	// run takes ownership of the descriptor it is given: hand it a copy.
	fd, err := unix.Dup(int(r.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	marker := filepath.Join(dir, "ran")
	report := filepath.Join(dir, "report.jsonl")
	code := run([]string{"-record-dir", filepath.Join(dir, "rec"), "-run", "r", "-task", "t", "-try", "1",
		"-command", "touch " + marker, "-report-file", report, "-gate-fd", strconv.Itoa(fd)})
	if code != exitNoGoAhead {
		t.Fatalf("exit %d, want %d", code, exitNoGoAhead)
	}
	for _, p := range []string{marker, report} {
		if _, err := os.Stat(p); err == nil {
			t.Fatalf("%s exists: the agent acted without a go-ahead", p)
		}
	}
}

func TestRunsAndReports(t *testing.T) {
	dir := t.TempDir()
	report, output := filepath.Join(dir, "report.jsonl"), filepath.Join(dir, "out")
	code := run([]string{"-record-dir", filepath.Join(dir, "rec"), "-run", "r", "-task", "t", "-try", "1",
		"-command", "echo hi; exit 3", "-report-file", report, "-output", output})
	if code != exitFailed {
		t.Fatalf("exit %d, want %d", code, exitFailed)
	}
	events, err := agent.ReadReportFile(report)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 2 || events[1].Outcome == nil || events[1].Outcome.ExitCode != 3 {
		t.Fatalf("events %+v", events)
	}
	if out, _ := os.ReadFile(output); string(out) != "hi\n" {
		t.Fatalf("output %q", out)
	}
}

package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/substrate/kube/podrecord"
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

func TestJournalKeptWhenTheEnvironmentNamesItsDirectory(t *testing.T) {
	dir := t.TempDir()
	jdir := filepath.Join(dir, "journal")
	if err := os.Mkdir(jdir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv(agent.JournalDirEnv, jdir)
	code := run([]string{"-record-dir", filepath.Join(dir, "rec"), "-run", "r", "-task", "t", "-try", "2",
		"-command", "exit 4", "-report-file", filepath.Join(dir, "report.jsonl"), "-output", filepath.Join(dir, "out")})
	if code != exitFailed {
		t.Fatalf("exit %d, want %d", code, exitFailed)
	}
	files, err := filepath.Glob(filepath.Join(jdir, "*.journal"))
	if err != nil || len(files) != 1 {
		t.Fatalf("journal files %v (%v), want one", files, err)
	}
	entries, err := agent.ReadJournal(files[0])
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	for _, e := range entries {
		events = append(events, e.Event)
		if e.Try != 2 || e.TaskID != "t" || e.PID != os.Getpid() {
			t.Fatalf("entry %+v names another attempt or agent", e)
		}
	}
	want := []string{agent.JournalAgentStart, agent.JournalTaskStart, agent.JournalTaskEnd, agent.JournalAgentExit}
	if strings.Join(events, ",") != strings.Join(want, ",") {
		t.Fatalf("events %v, want %v", events, want)
	}
	if last := entries[len(entries)-1]; last.ExitCode == nil || *last.ExitCode != exitFailed {
		t.Fatalf("agent_exit %+v, want exit code %d", last, exitFailed)
	}
}

func readRecord(t *testing.T, path string) podrecord.Record {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rec, ok := podrecord.Parse(string(data))
	if !ok {
		t.Fatalf("termination message %q is no record", data)
	}
	return rec
}

// The kube runner sets only the record file's variable: that alone selects
// pod mode.
func TestRecordFileInTheEnvironmentSelectsPodMode(t *testing.T) {
	dir := t.TempDir()
	msg := filepath.Join(dir, "termination-log")
	t.Setenv(agent.TerminationMessagePathEnv, msg)
	code := run([]string{"-record-dir", filepath.Join(dir, "rec"), "-run", "r", "-task", "t", "-try", "1", "-epoch", "2",
		"-command", "exit 3", "-report-file", filepath.Join(dir, "report.jsonl"), "-output", filepath.Join(dir, "out")})
	if code != exitFailed {
		t.Fatalf("exit %d, want %d", code, exitFailed)
	}
	rec := readRecord(t, msg)
	if rec.Outcome != podrecord.Failed || rec.Epoch != 2 || rec.ExitCode == nil || *rec.ExitCode != 3 {
		t.Fatalf("record %+v", rec)
	}
}

// An attempt API that cannot be reached is an answer that never came: past
// -start-retry the agent writes the infra marker and exits 6.
func TestPodModeUnreachableAttemptAPIWritesTheInfraMarker(t *testing.T) {
	dir := t.TempDir()
	msg := filepath.Join(dir, "termination-log")
	t.Setenv(attempttoken.EnvAPI, "https://"+attemptapitest.FreeAddr(t)) // nothing listens there
	t.Setenv(attempttoken.EnvToken, "rat1.unverified")
	marker := filepath.Join(dir, "ran")
	code := run([]string{"-mode", agent.ModePod, "-termination-message-path", msg, "-reporter", agent.ReporterAPI,
		"-start-retry", "1s", "-record-dir", filepath.Join(dir, "rec"), "-run", "r", "-task", "t", "-try", "1",
		"-command", "touch " + marker})
	if code != exitUnanswered {
		t.Fatalf("exit %d, want %d", code, exitUnanswered)
	}
	rec := readRecord(t, msg)
	if !rec.HonoredInfra() {
		t.Fatalf("record %+v is not the agent's infra marker", rec)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the task ran")
	}
}

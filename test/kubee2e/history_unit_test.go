package kubee2e_test

import (
	"github.com/dexaflow/reaper/sdk"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/testkit/history"
)

// The task logs' lines become executions: an end line ends one, the
// harness's killed line ends one killed, a start alone leaves one open.
func TestHistoryReadsTaskLogs(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "victim.log")
	log := strings.Join([]string{
		"start 1 0 4242 1700000000.100000000",
		"killed 1 0 4242 1700000005.200000000",
		"double 1 1",
		"start 1 1 4300 1700000010.000000000",
		"end 1 1 4300 1700000011.500000000",
		"start 2 0 4400 1700000020",
		"start 2 0 45",
	}, "\n") + "\n"
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	xs, err := readExecutions(path, "victim")
	if err != nil {
		t.Fatal(err)
	}
	if len(xs) != 3 {
		t.Fatalf("%d executions, want 3: %+v", len(xs), xs)
	}
	if x := xs[0]; x.Attempt.Try != 1 || x.Attempt.Epoch != 0 || x.Outcome != history.OutcomeKilled ||
		x.End.Sub(x.Start) != 5100*time.Millisecond {
		t.Errorf("the killed execution: %+v", x)
	}
	if x := xs[1]; x.Attempt.Epoch != 1 || x.Outcome != "end line" || x.ID != "victim try 1 epoch 1 #4300" {
		t.Errorf("the ended execution: %+v", x)
	}
	if x := xs[2]; x.Attempt.Try != 2 || !x.End.IsZero() {
		t.Errorf("the open execution: %+v", x)
	}
	if open := openExecutions(path); len(open) != 1 || open[0].id != "4400" {
		t.Errorf("open executions: %+v", open)
	}

	if err := os.WriteFile(path, []byte("end 1 0 9 1700000000.1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readExecutions(path, "victim"); err == nil {
		t.Error("an end of no open execution was taken")
	}
}

// The real node's ledger numbers its task's executions and records, when
// the scenario reopens the task, each open one killed then.
func TestLedgerLinesMakeExecutions(t *testing.T) {
	dir := t.TempDir()
	lg := &ledger{taskDir: dir, open: map[string][]ledgerExec{}, starts: map[string]int{}, first: map[string]bool{},
		gates: map[string]bool{}}
	get := func(path string) {
		lg.serve(httptest.NewRecorder(), httptest.NewRequest("GET", path, nil))
	}
	get("/start?task=victim&try=1&epoch=0")
	lg.reopen(sdk.Attempt{RunID: runID, TaskID: "victim", Try: 1, Epoch: 0})
	get("/start?task=victim&try=1&epoch=1")
	get("/end?task=victim&try=1&epoch=1")
	get("/start?task=by&try=1&epoch=0")
	get("/start?task=by&try=1&epoch=0") // a double
	get("/end?task=by&try=1&epoch=0")
	get("/end?task=by&try=1&epoch=0")

	xs, err := readExecutions(filepath.Join(dir, "victim.log"), "victim")
	if err != nil {
		t.Fatal(err)
	}
	if len(xs) != 2 || xs[0].Outcome != history.OutcomeKilled || xs[1].Outcome != "end line" || xs[1].Attempt.Epoch != 1 {
		t.Fatalf("victim's executions: %+v", xs)
	}
	by, err := readExecutions(filepath.Join(dir, "by.log"), "by")
	if err != nil {
		t.Fatal(err)
	}
	if len(by) != 2 || by[0].ID == by[1].ID || by[0].End.IsZero() || by[1].End.IsZero() {
		t.Fatalf("by's executions: %+v", by)
	}
	if l := lg.execLogOf(t, "by"); l.doubles != 1 || l.starts != 2 || l.ends != 2 {
		t.Errorf("execLog of by: %+v", l)
	}
}

// execLogOf reads a task log of the ledger's directory as execLog does.
func (lg *ledger) execLogOf(t *testing.T, task string) execLog {
	t.Helper()
	s := &scenario{taskDir: lg.taskDir}
	return s.execLog(task)
}

// A scenario that reopens a dead attempt after its successor has started
// (the OOM scenario: try 2 may start before the test sees try 1's end)
// forgets the dead attempt's execution only: the successor's end is its
// own.
func TestLedgerReopenForgetsOnlyTheDeadAttempt(t *testing.T) {
	dir := t.TempDir()
	lg := &ledger{taskDir: dir, open: map[string][]ledgerExec{}, starts: map[string]int{}, first: map[string]bool{},
		gates: map[string]bool{}}
	get := func(path string) {
		lg.serve(httptest.NewRecorder(), httptest.NewRequest("GET", path, nil))
	}
	get("/start?task=victim&try=1&epoch=0")
	get("/start?task=victim&try=2&epoch=0")
	lg.reopen(sdk.Attempt{RunID: runID, TaskID: "victim", Try: 1, Epoch: 0})
	get("/end?task=victim&try=2&epoch=0")
	xs, err := readExecutions(filepath.Join(dir, "victim.log"), "victim")
	if err != nil {
		t.Fatal(err)
	}
	if len(xs) != 2 || xs[0].Outcome != history.OutcomeKilled || xs[1].Outcome != "end line" || xs[1].Attempt.Try != 2 {
		t.Fatalf("victim's executions: %+v", xs)
	}
}

package e2e_test

import (
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/boardhistory"
	"github.com/dexaflow/reaper/testkit/history"
)

// The monitor's executions as the history records them: an end line ends
// one; one killed ends, killed, at the scan that found its group gone (not
// at its last sight); one still running has no end. The try is the one
// the row held on that epoch when the execution started.
func TestHistoryExecutions(t *testing.T) {
	at := func(s float64) time.Time { return time.Unix(1000, 0).Add(time.Duration(s * float64(time.Second))) }
	execs := []execution{
		{Task: "victim", Epoch: 0, PID: 10, Start: at(0), LastSeen: at(5), GoneAt: at(5.1)},
		{Task: "victim", Epoch: 1, PID: 20, Start: at(9), End: at(10)},
		{Task: "by1", Epoch: 0, PID: 30, Start: at(1), LastSeen: at(12)},
	}
	moves := []boardhistory.Transition{
		{At: at(8), From: first("victim"), To: sdk.Attempt{RunID: runID, TaskID: "victim", Try: 1, Epoch: 1}},
		{At: at(11), From: sdk.Attempt{RunID: runID, TaskID: "victim", Try: 1, Epoch: 1},
			To: sdk.Attempt{RunID: runID, TaskID: "victim", Try: 2, Epoch: 1}},
	}
	xs := historyExecutions(execs, moves)
	if x := xs[0]; x.Outcome != history.OutcomeKilled || !x.End.Equal(at(5.1)) || x.Attempt != first("victim") {
		t.Errorf("the killed execution: %+v", x)
	}
	if x := xs[1]; x.Outcome != "end line" || !x.End.Equal(at(10)) || x.Attempt.Epoch != 1 || x.Attempt.Try != 1 {
		t.Errorf("the ended execution: %+v", x)
	}
	if x := xs[2]; !x.End.IsZero() {
		t.Errorf("the running execution has an end: %+v", x)
	}
	if xs[0].ID == xs[1].ID {
		t.Errorf("two executions share an id: %q", xs[0].ID)
	}
}

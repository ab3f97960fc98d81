package e2e_test

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/boardhistory"
	"github.com/dexaflow/reaper/testkit/history"
)

// Each scenario's fault history (package testkit/history): its database
// records every write with triggers (package testkit/boardhistory,
// installed before any replica starts); at the finish the writes, the
// executions the monitor saw, the faults thrown and the board's final rows
// make the history, written to history.jsonl in the scenario's directory
// and judged by the checker. A violation fails the scenario.

// historyFile is the name of a scenario's history in its directory.
const historyFile = "history.jsonl"

// installHistory installs the history triggers in the scenario's board.
func (s *scenario) installHistory() {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx(), 3*queryBound)
	defer cancel()
	if err := boardhistory.Install(ctx, s.pool); err != nil {
		s.t.Fatal(err)
	}
}

// judgeHistory builds the scenario's history once every replica has
// stopped and the executions are read, has the checker judge it, fails the
// scenario on each violation and returns the verdict.
func (s *scenario) judgeHistory(execs []execution) (history.Verdict, bool) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx(), 3*queryBound)
	defer cancel()
	path := filepath.Join(s.dir, historyFile)
	v, err := boardhistory.JudgeBoard(ctx, s.pool, path, func(b boardhistory.Board) ([]boardhistory.Execution, error) {
		return historyExecutions(execs, b.Transitions), nil
	}, historyFaults(s.faults), time.Now())
	if err != nil {
		s.t.Errorf("history: %v", err)
		return history.Verdict{}, false
	}
	s.t.Logf("%s (%s)", v.Summary(), path)
	for _, x := range v.Violations {
		s.t.Errorf("history: %s", x)
	}
	return v, true
}

// historyExecutions are the monitor's executions as the history records
// them. One with an end line ends there; one killed without writing it
// ends "killed" at the scan that first found its group gone (the moment
// the harness established it ended); one still running has no end.
func historyExecutions(execs []execution, moves []boardhistory.Transition) []boardhistory.Execution {
	out := make([]boardhistory.Execution, 0, len(execs))
	for _, e := range execs {
		x := boardhistory.Execution{Attempt: attemptOf(e, moves), Start: e.Start,
			ID: fmt.Sprintf("%s epoch %d pid %d", e.Task, e.Epoch, e.PID)}
		switch {
		case !e.End.IsZero():
			x.End, x.Outcome = e.End, "end line"
		case !e.GoneAt.IsZero():
			x.End, x.Outcome = e.GoneAt, history.OutcomeKilled
			x.Note = "no end line; its group last seen at " + e.LastSeen.Format(time.RFC3339Nano) + ", found gone"
		}
		out = append(out, x)
	}
	return out
}

// attemptOf is the attempt an execution ran as. Its line names the epoch
// only: the try is the one the task's row held on that epoch when the
// execution started (the last change to it before then), 1 when none is
// known.
func attemptOf(e execution, moves []boardhistory.Transition) sdk.Attempt {
	a := sdk.Attempt{RunID: runID, TaskID: e.Task, Try: 1, Epoch: int32(e.Epoch)}
	for _, m := range moves {
		if m.To.TaskID == e.Task && m.To.RunID == runID && m.To.Epoch == a.Epoch && !m.At.After(e.Start) {
			a.Try = m.To.Try
		}
	}
	return a
}

// historyFaults are the scenario's faults as fault events.
func historyFaults(faults []*fault) []boardhistory.Fault {
	out := make([]boardhistory.Fault, 0, len(faults))
	for _, f := range faults {
		note := f.what
		if f.target != nil {
			note += " (" + f.target.String() + ")"
		}
		out = append(out, boardhistory.Fault{At: f.at, Note: note})
	}
	return out
}

package lite_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/lite"
	"github.com/dexaflow/reaper/substrate/lite/proc"
	"github.com/dexaflow/reaper/substrate/lite/records"
)

// The detail of each answer is its own notes only, in the words operators
// and the audit see, however many attempts one batch judges before it.
func TestLivenessDetailIsEachAttemptsOwnNotes(t *testing.T) {
	dir, err := records.Open(filepath.Join(t.TempDir(), "records"))
	if err != nil {
		t.Fatal(err)
	}
	boot, _ := proc.BootID()
	agentPID, leaderPID := benchLeader(t), benchLeader(t)
	agent, err := proc.Stat(agentPID)
	if err != nil {
		t.Fatal(err)
	}
	leader, err := proc.Stat(leaderPID)
	if err != nil {
		t.Fatal(err)
	}
	deadAgent, deadLeader := benchDeadPID(t), benchDeadPID(t)

	attempt := func(i int) sdk.Attempt {
		return sdk.Attempt{RunID: "run-detail", TaskID: fmt.Sprintf("task_%d", i), Try: 1}
	}
	live, dead, agentOnly, none := attempt(1), attempt(2), attempt(3), attempt(4)
	write := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	write(dir.WriteGroup(records.GroupRecord{Attempt: live, PGID: leader.PID, AgentPID: agent.PID,
		AgentStart: agent.Start, LeaderStart: leader.Start, Boot: boot}))
	write(dir.WriteGroup(records.GroupRecord{Attempt: dead, PGID: deadLeader, AgentPID: deadAgent,
		AgentStart: 12345, LeaderStart: 12345, Boot: boot}))
	write(dir.WriteAgent(records.AgentRecord{Attempt: agentOnly, PID: deadAgent, Start: 12345, Boot: boot}))

	// Twice each, so an answer follows one of every other kind.
	batch := []sdk.Attempt{live, dead, agentOnly, none, live, dead, agentOnly, none}
	got, err := lite.Probe(context.Background(), dir, batch, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[sdk.Attempt]string{
		live:      fmt.Sprintf("agent %d alive; group %d alive", agent.PID, leader.PID),
		dead:      fmt.Sprintf("agent %d gone; group %d gone", deadAgent, deadLeader),
		agentOnly: fmt.Sprintf("no group recorded; agent %d gone", deadAgent),
		none:      "no group recorded; no agent record",
	}
	for _, l := range got {
		if l.Detail != want[l.Attempt] {
			t.Errorf("%s: detail %q, want %q", l.Attempt, l.Detail, want[l.Attempt])
		}
	}
}

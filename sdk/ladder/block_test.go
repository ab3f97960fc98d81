package ladder_test

import (
	"slices"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// TestLadderBlockKeys: the ladder block's keys are the Ladder's tags, in
// the block's order, each a duration defaulting to the specification's
// value; maintenance.interval and auth.max_attempt_credential_lifetime are
// other blocks' keys, so decoding the ladder block leaves them alone.
func TestLadderBlockKeys(t *testing.T) {
	s := sdk.SchemaOf(ladder.Defaults())
	var names []string
	for _, a := range s.Attributes {
		names = append(names, a.Name)
		if a.Type != sdk.TypeDuration || a.Required {
			t.Errorf("%s: type %s, required %v: want an optional duration", a.Name, a.Type, a.Required)
		}
	}
	want := []string{"heartbeat", "agent_lost", "settling_grace", "attempt_token_ttl", "dispatch_lost",
		"pod_lost_floor", "orphan_run", "infra_confirm_valve", "task_termination_grace"}
	if !slices.Equal(names, want) {
		t.Fatalf("keys %v, want %v", names, want)
	}
	if got := s.Attributes[1].Default; got != (90 * time.Second).String() {
		t.Errorf("agent_lost default %v, want 1m30s", got)
	}

	l := ladder.Defaults()
	l.MaintenanceInterval, l.CredentialCeiling = time.Minute, 0
	if err := (sdk.Values{"agent_lost": "100s"}).Decode(&l); err != nil {
		t.Fatal(err)
	}
	want2 := ladder.Defaults()
	want2.AgentLost, want2.MaintenanceInterval, want2.CredentialCeiling = 100*time.Second, time.Minute, 0
	if l != want2 {
		t.Fatalf("decoded %+v, want %+v", l, want2)
	}
	if err := (sdk.Values{"interval": "1m"}).Decode(&l); err == nil {
		t.Fatal("maintenance's interval decoded into the ladder block")
	}
}

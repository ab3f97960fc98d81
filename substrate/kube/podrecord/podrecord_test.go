package podrecord

import (
	"strings"
	"testing"

	"github.com/dexaflow/reaper/sdk"
)

func TestRecordRoundTripNamesItsAttempt(t *testing.T) {
	a := sdk.Attempt{RunID: "r1", TaskID: "load_a", Try: 2, Epoch: 1}
	code := int32(3)
	r := For(a, Failed)
	r.ExitCode, r.Reason = &code, "exit_code: task exited with code 3"
	msg, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, ok := Parse(msg)
	if !ok || got.Attempt() != a || got.Outcome != Failed || *got.ExitCode != 3 || got.Version != Version {
		t.Fatalf("Parse(%s) = %+v, %v", msg, got, ok)
	}
}

func TestInfraMarkerHonoredOnlyInTheAgentsShape(t *testing.T) {
	a := sdk.Attempt{RunID: "r1", TaskID: "t", Try: 1}
	code := int32(0)
	withCode := For(a, Infra)
	withCode.ExitCode, withCode.Reason = &code, "x"
	for name, c := range map[string]struct {
		r    Record
		want bool
	}{
		"ReasonNoExitCode": {r: Record{Outcome: Infra, Reason: "Unavailable"}, want: true},
		"NoReason":         {r: Record{Outcome: Infra}},
		"WithExitCode":     {r: withCode},
		"NotInfra":         {r: Record{Outcome: Failed, Reason: "x"}},
	} {
		if got := c.r.HonoredInfra(); got != c.want {
			t.Errorf("%s: HonoredInfra = %v, want %v", name, got, c.want)
		}
	}
}

func TestNotARecord(t *testing.T) {
	for _, msg := range []string{"", "plain text", `{"dexaflow_outcome":2,"outcome":"SUCCESS","run_id":"r","task_id":"t"}`,
		`{"dexaflow_outcome":1,"outcome":"MAYBE","run_id":"r","task_id":"t"}`, `{"dexaflow_outcome":1,"outcome":"SUCCESS"}`} {
		if _, ok := Parse(msg); ok {
			t.Errorf("Parse(%q) read a record", msg)
		}
	}
	r := For(sdk.Attempt{RunID: "r", TaskID: "t"}, Failed)
	r.Reason = strings.Repeat("x", MaxBytes)
	if _, err := r.Encode(); err == nil {
		t.Error("a record over the termination message's limit encoded")
	}
}

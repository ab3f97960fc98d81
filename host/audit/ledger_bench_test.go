package audit_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/dexaflow/reaper/host/audit"
	"github.com/dexaflow/reaper/sdk"
)

// applying is a board that applies every mark at once: the benchmark
// measures the ledger's own bookkeeping, not a database.
type applying struct{ sdk.Board }

func (applying) Mark(_ context.Context, ms []sdk.Mark) ([]sdk.MarkResult, error) {
	out := make([]sdk.MarkResult, len(ms))
	for i, m := range ms {
		out[i] = sdk.MarkResult{Attempt: m.Attempt, Applied: true}
	}
	return out, nil
}

// BenchmarkLedger_MassRecovery: what the ledger adds to a pass that marks
// 10,000 attempts in batches of 1,000 and delivers every decision.
func BenchmarkLedger_MassRecovery(b *testing.B) {
	const n, per = 10_000, 1_000
	marks := make([]sdk.Mark, n)
	ds := make([]sdk.Decision, n)
	for i := range marks {
		a := sdk.Attempt{RunID: fmt.Sprintf("run%05d", i), TaskID: "task", Try: 1}
		marks[i] = sdk.Mark{Attempt: a, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost}
		ds[i] = sdk.Decision{Label: sdk.LabelAgentLost, Attempt: a, Applied: true}
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		l := audit.NewLedger(applying{})
		for start := 0; start < n; start += per {
			if _, err := l.Mark(ctx, marks[start:start+per]); err != nil {
				b.Fatal(err)
			}
		}
		l.Close()
		if lost := l.Unaudited("agentlost", ds, "done"); len(lost) != 0 {
			b.Fatalf("%d unaudited", len(lost))
		}
	}
}

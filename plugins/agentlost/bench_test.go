package agentlost

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/reap"
	"github.com/dexaflow/reaper/sdk/sdktest"
)

// discardSink takes decisions and lets them go.
type discardSink struct{}

func (discardSink) Record(context.Context, []sdk.Decision) error { return nil }

// BenchmarkJudgeDeadPage is the plugin's own share of a mass recovery: one
// page of 999 silent Lite candidates whose agent and group both read dead,
// judged, given their evidence and planned as marks (the board and the
// substrate are in-memory stand-ins here, so only the reaper's work is
// timed). Reports ns and allocations a candidate.
func BenchmarkJudgeDeadPage(b *testing.B) {
	now := time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)
	l := ladder.Defaults()
	page := make([]sdk.Candidate, reap.MarkBatch-1)
	exec := sdktest.NewExecutions()
	for i := range page {
		a := sdk.Attempt{RunID: fmt.Sprintf("run%06d", i/10), TaskID: fmt.Sprintf("task%02d", i%10), Try: 1}
		page[i] = sdk.Candidate{Attempt: a, State: sdk.StateRunning, Executor: sdk.ExecutorLite,
			QueuedAt: now.Add(-51 * time.Minute), RunningAt: now.Add(-50 * time.Minute),
			LastHeartbeatAt: now.Add(-10 * time.Minute)}
		exec.Set(a, sdk.AttemptLiveness{State: sdk.Dead, Agent: sdk.Dead, Group: sdk.Dead,
			Detail: "agent 4242 gone; group 4243 gone"})
	}
	pass := sdk.Pass{Now: now, Ladder: l, Term: 7, Edition: ladder.EditionLite}
	cfg := Config{}
	board := sdktest.NewBoard()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		p := newPass(nil, cfg, pass, board, exec, discardSink{})
		p.state = &reap.State{}
		// One short of MarkBatch: the page's marks wait in the backlog,
		// unwritten, so the in-memory board's own work is not timed.
		if err := p.judgePage(context.Background(), page); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(page)), "ns/candidate")
}

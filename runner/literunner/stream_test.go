package literunner_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/eventually"
)

// TestAgentHeartbeatsOnTheStream: the real reaper-agent, spawned by the
// Lite runner as reaperd spawns it, against a real attempt API on a real
// board, sends its heartbeats on the heartbeat stream: one stream opened,
// its heartbeats land, its token is renewed on it (a short TTL, so that
// renewals are due every few heartbeats) and the renewed token keeps
// verifying, and when its attempt moves on the stream's answer tells it to
// stop, and it stops its task.
func TestAgentHeartbeatsOnTheStream(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	meter := &attemptapitest.Meter{}
	b := setup(t, opts{heartbeat: 100 * time.Millisecond,
		api: &attemptapitest.Options{Meter: meter, TTL: 8 * time.Second}})
	wait := `while [ ! -f ` + filepath.Join(b.work, "go") + ` ]; do sleep 0.05; done`
	b.mkRun(t, "run", task("long", wait, 0))
	if !eventually.Until(30*time.Second, func() bool {
		b.cycle(t)
		return b.ti(t, "run", "long").State == sdk.StateRunning
	}, eventually.Every(20*time.Millisecond)) {
		t.Fatalf("never running: %s", show(b.ti(t, "run", "long")))
	}
	a := b.ti(t, "run", "long").Attempt

	// Two renewals (a quarter of the 8 s TTL each) on the stream: the
	// agent took each renewed token and went on heartbeating with it.
	eventually.True(t, 30*time.Second, "two renewals", func() bool {
		return meter.Renewals("renewed") >= 2
	}, eventually.Every(20*time.Millisecond))
	beats := meter.Count("heartbeat/ok")
	eventually.True(t, 30*time.Second, "heartbeats after the second renewal", func() bool {
		return meter.Count("heartbeat/ok") >= beats+5
	}, eventually.Every(20*time.Millisecond))
	if n := meter.Conns(attemptapi.ConnStreamOpened); n != 1 {
		t.Fatalf("%d heartbeat streams opened, want the agent's one for all its heartbeats: %s", n, meter)
	}
	if ti := b.ti(t, "run", "long"); ti.State != sdk.StateRunning || ti.CredentialRenewedAt.IsZero() ||
		time.Since(ti.LastHeartbeatAt) > 5*time.Second {
		t.Fatalf("the attempt after its heartbeats: %s renewed=%v heartbeat=%v", show(ti), ti.CredentialRenewedAt,
			ti.LastHeartbeatAt)
	}
	if n := b.agentLogSaid(t, "heartbeat failed"); n != 0 {
		t.Fatalf("the agent logged %d failed heartbeats", n)
	}

	// The attempt moves on (failed by hand, as a reaper would): the next
	// heartbeat's answer on the stream is should_terminate, and the agent
	// stops its task and exits.
	if _, err := b.w.ReportOutcome(ctx, a, lifecycle.TerminalReport{State: sdk.StateFailed, Reason: "moved_on"},
		b.clk.Now()); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, 30*time.Second, "should_terminate answered", func() bool {
		return meter.Count("heartbeat/should_terminate") >= 1
	}, eventually.Every(20*time.Millisecond))
	eventually.True(t, 30*time.Second, "the agent telling of should_terminate", func() bool {
		return b.agentLogSaid(t, "the control plane answered should_terminate to a heartbeat") == 1
	}, eventually.Every(20*time.Millisecond))
	eventually.True(t, 30*time.Second, "the agent stopping its task and exiting", func() bool {
		return b.runner.ReapAgents() == 0
	}, eventually.Every(20*time.Millisecond))
	if n := meter.Conns(attemptapi.ConnStreamOpened); n != 1 {
		t.Fatalf("%d heartbeat streams opened, want 1", n)
	}
}

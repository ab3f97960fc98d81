package lifecycle_test

import (
	"context"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
)

// The agent's calls apply only for the credential the row records: a
// re-dispatch of the same try and epoch records a new mint, and the calls
// made with the earlier one are answered should_terminate, changing
// nothing, in the same statement as the current one's.
func TestCredentialFence(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	a := b.task(t)
	b.to(t, a, sdk.StateQueued, base)
	// Microseconds the token does not carry: the fence compares to the
	// millisecond.
	ghost := base.Add(time.Second + 123456*time.Nanosecond)
	fresh := base.Add(5*time.Second + 987654*time.Nanosecond)
	if ok, err := b.w.RecordMint(ctx, a, ghost); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if ok, err := b.w.RecordMint(ctx, a, fresh); err != nil || !ok {
		t.Fatal(ok, err)
	}
	tokenMint := func(m time.Time) time.Time { return time.UnixMilli(m.UnixMilli()).UTC() }
	at := base.Add(10 * time.Second)
	if stop, err := b.w.RunningFor(ctx, a, tokenMint(ghost), at); err != nil || !stop {
		t.Fatalf("ghost running: stop=%v err=%v", stop, err)
	}
	if got := b.ti(t).State; got != sdk.StateQueued {
		t.Fatalf("ghost running moved the row to %s", got)
	}
	if stop, err := b.w.RunningFor(ctx, a, tokenMint(fresh), at); err != nil || stop {
		t.Fatalf("fresh running: stop=%v err=%v", stop, err)
	}
	at = at.Add(15 * time.Second)
	stop, err := b.w.HeartbeatCredentials(ctx, []lifecycle.HeartbeatCall{
		{Attempt: a, MintedAt: tokenMint(ghost), Renewal: lifecycle.Renewed, At: at.Add(time.Second)},
		{Attempt: a, MintedAt: tokenMint(fresh), At: at},
		{Attempt: a, MintedAt: tokenMint(ghost), At: at.Add(2 * time.Second)},
	})
	if err != nil || len(stop) != 3 || !stop[0] || stop[1] || !stop[2] {
		t.Fatalf("one batch of both: %v %v, want [true false true]", stop, err)
	}
	ti := b.ti(t)
	if !ti.LastHeartbeatAt.Equal(at) || !ti.CredentialRenewedAt.IsZero() {
		t.Fatalf("the ghost's heartbeats were written: last %s renewed %s", ti.LastHeartbeatAt, ti.CredentialRenewedAt)
	}
	// A caller that holds no credential is not fenced.
	if stop, err := b.w.Heartbeat(ctx, a, at.Add(3*time.Second)); err != nil || stop {
		t.Fatalf("unfenced heartbeat: %v %v", stop, err)
	}
	before := b.ti(t)
	res, err := b.w.ReportOutcomeFor(ctx, a, tokenMint(ghost), lifecycle.TerminalReport{State: sdk.StateFailed, Reason: "exit_code"}, at.Add(4*time.Second))
	if err != nil || !res.ShouldTerminate {
		t.Fatalf("ghost report: %+v %v", res, err)
	}
	unchanged(t, before, b.ti(t))
	res, err = b.w.ReportOutcomeFor(ctx, a, tokenMint(fresh), lifecycle.TerminalReport{State: sdk.StateSuccess}, at.Add(5*time.Second))
	if err != nil || res.ShouldTerminate {
		t.Fatalf("fresh report: %+v %v", res, err)
	}
}

// A row with no recorded mint (from before credentials) takes any
// credential's calls.
func TestCredentialFenceLetsAnUnrecordedMintPass(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	a := b.task(t)
	b.to(t, a, sdk.StateQueued, base)
	m := base.Add(time.Second)
	if stop, err := b.w.RunningFor(ctx, a, m, base.Add(2*time.Second)); err != nil || stop {
		t.Fatal(stop, err)
	}
	stop, err := b.w.HeartbeatCredentials(ctx, []lifecycle.HeartbeatCall{{Attempt: a, MintedAt: m, At: base.Add(3 * time.Second)}})
	if err != nil || stop[0] {
		t.Fatal(stop, err)
	}
	if res, err := b.w.ReportOutcomeFor(ctx, a, m, lifecycle.TerminalReport{State: sdk.StateSuccess}, base.Add(4*time.Second)); err != nil || res.ShouldTerminate {
		t.Fatal(res, err)
	}
}

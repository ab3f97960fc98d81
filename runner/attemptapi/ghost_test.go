package attemptapi_test

import (
	"context"
	"testing"
	"time"

	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/sdk"
)

// An execution of an attempt whose dispatch the board lost (a failover
// promoted a standby that never saw the queueing and the RUNNING report)
// keeps a token of the same try and epoch. Once the board has dispatched
// the attempt again, with a new credential, the first execution's calls
// are refused and answered should_terminate; the new one's apply.
func TestAGhostOfALostDispatchIsToldToStop(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	a, ghost := b.oneRunning(t)
	if r, err := ghost.Heartbeat(ctx, a); err != nil || r.ShouldTerminate {
		t.Fatalf("ghost heartbeat before the failover: %+v %v", r, err)
	}
	// The promoted board never saw the dispatch: the row is back where it
	// was before it.
	if _, err := b.pool.Exec(ctx, `UPDATE task_instances SET state = 'none', queued_at = NULL, running_at = NULL,
        last_heartbeat_at = NULL, credential_minted_at = NULL, credential_exchanged_at = NULL,
        credential_renewed_at = NULL WHERE run_id = $1 AND task_id = $2`, a.RunID, a.TaskID); err != nil {
		t.Fatal(err)
	}
	b.clk.Advance(2 * time.Second)
	fresh := b.dispatch(t, a)
	minted := b.ti(t, a).CredentialMintedAt

	// Before the new execution reports running, and after.
	if r, err := ghost.Heartbeat(ctx, a); err != nil || !r.ShouldTerminate || r.Token != "" {
		t.Fatalf("ghost heartbeat on the queued re-dispatch: %+v %v, want should_terminate", r, err)
	}
	if term, err := ghost.Running(ctx, a); err != nil || !term {
		t.Fatalf("ghost running on the queued re-dispatch: %v %v, want should_terminate", term, err)
	}
	if got := b.ti(t, a); got.State != sdk.StateQueued {
		t.Fatalf("the ghost's running report moved the row to %s", got.State)
	}
	if term, err := fresh.Running(ctx, a); err != nil || term {
		t.Fatalf("fresh running: %v %v", term, err)
	}
	b.clk.Advance(15 * time.Second)
	for i := range 3 {
		// Both at once: they may share a batch (the board test
		// TestCredentialFence writes both in one).
		hbs := []*attemptapi.Client{ghost, fresh}
		if i == 1 {
			hbs = []*attemptapi.Client{fresh, ghost}
		}
		answers := make(chan attemptapi.Response, 2)
		errs := make(chan error, 2)
		for _, c := range hbs {
			go func() {
				r, err := c.Heartbeat(ctx, a)
				if err == nil && (r.ShouldTerminate != (c == ghost)) {
					t.Errorf("heartbeat of the %s: should_terminate %v", map[bool]string{true: "ghost", false: "fresh one"}[c == ghost], r.ShouldTerminate)
				}
				answers <- r
				errs <- err
			}()
		}
		for range hbs {
			<-answers
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		b.clk.Advance(15 * time.Second)
	}
	before := b.ti(t, a)
	if term, err := ghost.Report(ctx, a, attemptapi.ReportBody{State: sdk.StateFailed, Reason: "exit_code", Message: "exit 1"}); err != nil || !term {
		t.Fatalf("ghost report: %v %v, want should_terminate", term, err)
	}
	after := b.ti(t, a)
	if after.State != sdk.StateRunning || !after.LastHeartbeatAt.Equal(before.LastHeartbeatAt) ||
		!after.CredentialMintedAt.Equal(minted) {
		t.Fatalf("the ghost's report changed the row: %+v", after)
	}
	if term, err := fresh.Report(ctx, a, attemptapi.ReportBody{State: sdk.StateSuccess}); err != nil || term {
		t.Fatalf("fresh report: %v %v", term, err)
	}
	if got := b.ti(t, a); got.State != sdk.StateSuccess {
		t.Fatalf("state %s after the fresh report", got.State)
	}
}

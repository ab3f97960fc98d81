package attemptapi_test

import (
	"context"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/internal/attemptapi"
	"github.com/dexaflow/reaper/sdk"
)

// bindWarm creates a running run of one warm task and binds its first
// attempt to worker, as the kube runner's warm dispatch does (queued with
// the worker, the credential's mint time recorded).
func (b *bundle) bindWarm(t *testing.T, runID, worker string) sdk.Attempt {
	t.Helper()
	ctx := context.Background()
	now := b.clk.Now()
	if err := b.w.CreateRun(ctx, lifecycle.NewRun{RunID: runID, DagID: "dag", Tasks: []lifecycle.NewTask{
		{TaskID: "t", Executor: sdk.ExecutorWarm, Command: "echo warm", ExecutionTimeout: 90 * time.Second}}}, now); err != nil {
		t.Fatal(err)
	}
	a := sdk.Attempt{RunID: runID, TaskID: "t", Try: 1}
	if ok, err := b.w.Enqueue(ctx, a, now); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if ok, err := b.w.QueueWarm(ctx, a, worker, now); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if ok, err := b.w.RecordMint(ctx, a, now); err != nil || !ok {
		t.Fatal(ok, err)
	}
	return a
}

func (b *bundle) workerClient(t *testing.T, worker string) *attemptapi.Client {
	t.Helper()
	cred, err := b.issuer.MintWorker(worker, b.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	c, err := attemptapi.NewClient(b.url, cred.Token, b.ca)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestWarmWorkerClaim(t *testing.T) {
	ctx := context.Background()

	t.Run("WorkerClaimsItsBoundAttemptAndRunsItWithTheAttemptsOwnToken", func(t *testing.T) {
		b := setup(t)
		a := b.bindWarm(t, "r1", "warm-a")
		b.bindWarm(t, "r2", "warm-b") // another worker's
		wc := b.workerClient(t, "warm-a")
		before := wc.Token()
		b.clk.Advance(2 * time.Second)
		got, err := wc.Claim(ctx, "warm-a", 4, nil)
		if err != nil || len(got) != 1 || got[0].Attempt() != a || got[0].Command != "echo warm" ||
			got[0].ExecutionTimeoutSeconds != 90 {
			t.Fatalf("claim: %+v, %v", got, err)
		}
		if wc.Token() == before {
			t.Fatal("the claim did not renew the worker's token")
		}
		claims, err := b.keys.get().VerifyFor(got[0].Token, a, b.clk.Now())
		if err != nil || !claims.MintedAt.Equal(base) {
			t.Fatalf("the attempt's token %+v, %v: want its credential counted from the bind", claims, err)
		}
		ac, err := attemptapi.NewClient(b.url, got[0].Token, b.ca)
		if err != nil {
			t.Fatal(err)
		}
		defer ac.Close()
		if term, err := ac.Running(ctx, a); err != nil || term {
			t.Fatalf("running: %v %v", term, err)
		}
		if term, err := ac.Report(ctx, a, attemptapi.Outcome{State: sdk.StateSuccess}); err != nil || term {
			t.Fatalf("report: %v %v", term, err)
		}
		if ti := b.ti(t, a); ti.State != sdk.StateSuccess {
			t.Fatalf("state %s", ti.State)
		}
		// Started (and ended): no longer claimable.
		if got, err := wc.Claim(ctx, "warm-a", 4, nil); err != nil || len(got) != 0 {
			t.Fatalf("claim after the run: %+v, %v", got, err)
		}
	})

	t.Run("SecondExecutionOfAClaimedAttemptIsToldToStop", func(t *testing.T) {
		b := setup(t)
		a := b.bindWarm(t, "r1", "warm-a")
		wc := b.workerClient(t, "warm-a")
		first, err := wc.Claim(ctx, "warm-a", 1, nil)
		if err != nil || len(first) != 1 {
			t.Fatal(first, err)
		}
		again, err := wc.Claim(ctx, "warm-a", 1, nil) // an answer lost, asked again
		if err != nil || len(again) != 1 {
			t.Fatal(again, err)
		}
		for i, c := range []attemptapi.Claimed{first[0], again[0]} {
			ac, err := attemptapi.NewClient(b.url, c.Token, b.ca)
			if err != nil {
				t.Fatal(err)
			}
			term, err := ac.Running(ctx, a)
			ac.Close()
			if err != nil || term != (i == 1) {
				t.Fatalf("running #%d: should_terminate %v, %v", i, term, err)
			}
		}
	})

	t.Run("WorkerTokenCannotReportForAnAttempt", func(t *testing.T) {
		b := setup(t)
		a := b.bindWarm(t, "r1", "warm-a")
		wc := b.workerClient(t, "warm-a")
		_, err := wc.Running(ctx, a)
		refusedWith(t, err, attemptapi.CodeWrongKind)
		_, err = wc.Report(ctx, a, attemptapi.Outcome{State: sdk.StateSuccess})
		refusedWith(t, err, attemptapi.CodeWrongKind)
		_, err = wc.Heartbeat(ctx, a)
		refusedWith(t, err, attemptapi.CodeWrongKind)
		if ti := b.ti(t, a); ti.State != sdk.StateQueued {
			t.Fatalf("state %s after refused calls", ti.State)
		}
		if b.meter.count("running/"+attemptapi.CodeWrongKind) != 1 {
			t.Fatalf("meter %v", b.meter.calls)
		}
	})

	t.Run("AttemptTokenCannotClaim", func(t *testing.T) {
		b := setup(t)
		b.bindWarm(t, "r1", "warm-a")
		other := sdk.Attempt{RunID: "r2", TaskID: "t1", Try: 1}
		b.run(t, "r2", "t1")
		ac := b.dispatch(t, other)
		_, err := ac.Claim(ctx, "warm-a", 1, nil)
		refusedWith(t, err, attemptapi.CodeWrongKind)
	})

	t.Run("WorkerTokenClaimsOnlyForItsOwnWorker", func(t *testing.T) {
		b := setup(t)
		b.bindWarm(t, "r1", "warm-a")
		wc := b.workerClient(t, "warm-b")
		_, err := wc.Claim(ctx, "warm-a", 1, nil)
		refusedWith(t, err, attemptapi.CodeWrongScope)
	})

	t.Run("ClaimNeverExtendsACredentialPastItsCeiling", func(t *testing.T) {
		b := setup(t)
		a := b.bindWarm(t, "r1", "warm-a")
		b.clk.Advance(ceiling + ttl/2) // bound, never claimed
		wc := b.workerClient(t, "warm-a")
		got, err := wc.Claim(ctx, "warm-a", 1, nil)
		if err != nil || len(got) != 1 || !got[0].ExpiresAt.Equal(base.Add(ceiling+ttl)) {
			t.Fatalf("claim past the ceiling: %+v, %v: want the token to lapse one TTL after the ceiling", got, err)
		}
		b.clk.Advance(ttl)
		wc = b.workerClient(t, "warm-a")
		if got, err := wc.Claim(ctx, "warm-a", 1, nil); err != nil || len(got) != 0 {
			t.Fatalf("claim of a lapsed credential: %+v, %v: want %s not handed out", got, err, a)
		}
	})

	t.Run("ExpiredWorkerTokenCannotClaim", func(t *testing.T) {
		b := setup(t)
		b.bindWarm(t, "r1", "warm-a")
		wc := b.workerClient(t, "warm-a")
		b.clk.Advance(ttl)
		_, err := wc.Claim(ctx, "warm-a", 1, nil)
		refusedWith(t, err, attemptapi.CodeExpired)
	})
}

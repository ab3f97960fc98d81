package attemptapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/attemptapi"
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
		if term, err := ac.Report(ctx, a, attemptapi.ReportBody{State: sdk.StateSuccess}); err != nil || term {
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
		_, err = wc.Report(ctx, a, attemptapi.ReportBody{State: sdk.StateSuccess})
		refusedWith(t, err, attemptapi.CodeWrongKind)
		_, err = wc.Heartbeat(ctx, a)
		refusedWith(t, err, attemptapi.CodeWrongKind)
		if ti := b.ti(t, a); ti.State != sdk.StateQueued {
			t.Fatalf("state %s after refused calls", ti.State)
		}
		if b.meter.Count("running/"+attemptapi.CodeWrongKind) != 1 {
			t.Fatalf("meter %v", b.meter)
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

	t.Run("WorkerTokenRenewsOnlyUntilItsCeiling_RefusalLoggedAndMetered", func(t *testing.T) {
		b := setup(t)
		wc := b.workerClient(t, "warm-a") // minted at base: the ceiling counts from here
		renewals := 0
		for b.clk.Advance(ttl / 2); b.clk.Now().Sub(base) < workerCeiling; b.clk.Advance(ttl / 2) {
			before := wc.Token()
			if _, err := wc.Claim(ctx, "warm-a", 1, nil); err != nil {
				t.Fatalf("claim at +%s: %v", b.clk.Now().Sub(base), err)
			}
			if wc.Token() == before {
				t.Fatalf("claim at +%s, under the ceiling, did not renew the worker's token", b.clk.Now().Sub(base))
			}
			claims, err := b.keys.get().VerifyWorker(wc.Token(), b.clk.Now())
			if err != nil || !claims.MintedAt.Equal(base) {
				t.Fatalf("renewed worker token %+v, %v: want its first mint kept", claims, err)
			}
			renewals++
		}
		// At the ceiling: the claim is answered, the token is not renewed.
		last := wc.Token()
		if _, err := wc.Claim(ctx, "warm-a", 1, nil); err != nil {
			t.Fatalf("claim at the ceiling: %v", err)
		}
		if wc.Token() != last {
			t.Fatal("a claim past the worker credential ceiling renewed the worker's token")
		}
		if got := b.meter.Renewals(attemptapi.RenewalWorkerCapped); got != 1 {
			t.Fatalf("worker_capped metered %d times, want 1 (%v)", got, b.meter)
		}
		if got := b.meter.Renewals(attemptapi.RenewalWorkerRenewed); got != renewals {
			t.Fatalf("worker_renewed metered %d times, want %d", got, renewals)
		}
		if !strings.Contains(b.log.String(), "past its ceiling: its token is not renewed") {
			t.Fatalf("the capped renewal was not logged:\n%s", b.log.String())
		}
		// Its last token lapses one TTL after its last renewal: no more claims.
		b.clk.Advance(ttl)
		_, err := wc.Claim(ctx, "warm-a", 1, nil)
		refusedWith(t, err, attemptapi.CodeExpired)
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

// claimRecord reads worker's claim record: its time and its running list
// (as text; "" when the claim did not say). ok is false when there is none.
func (b *bundle) claimRecord(t *testing.T, worker string) (at time.Time, running string, ok bool) {
	t.Helper()
	var list *string
	err := b.pool.QueryRow(context.Background(),
		`SELECT claimed_at, running::text FROM warm_worker_claims WHERE worker = $1`, worker).Scan(&at, &list)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	if list != nil {
		running = *list
	}
	return at, running, true
}

// wantNoClaimRecord fails unless the board holds no claim of worker.
func (b *bundle) wantNoClaimRecord(t *testing.T, worker string) {
	t.Helper()
	if at, running, ok := b.claimRecord(t, worker); ok {
		t.Fatalf("warm worker %s has a claim record (%s, %q): want none", worker, at, running)
	}
}

// rawClaim posts a hand-made claim body with the token and returns the
// status.
func (b *bundle) rawClaim(t *testing.T, token, body string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.url+attemptapi.PathClaim, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	status, err := insecureDo(b, req)
	if err != nil {
		t.Fatal(err)
	}
	return status
}

// TestWarmWorkerClaimRecord: every accepted claim records what the worker
// said it runs, timed by the issue time of the worker token it presented
// (the kube sweep confirms a live worker's warm mark from it); a claim the
// API refuses records nothing.
func TestWarmWorkerClaimRecord(t *testing.T) {
	ctx := context.Background()
	runs := func(a sdk.Attempt) string {
		return fmt.Sprintf(`[{"try": %d, "epoch": %d, "run_id": %q, "task_id": %q}]`, a.Try, a.Epoch, a.RunID, a.TaskID)
	}

	t.Run("ClaimRecordsWhatTheWorkerRunsAtItsTokensIssueTime", func(t *testing.T) {
		b := setup(t)
		a := b.bindWarm(t, "r1", "warm-a")
		wc := b.workerClient(t, "warm-a") // issued at base
		b.clk.Advance(3 * time.Second)
		if _, err := wc.Claim(ctx, "warm-a", 1, []sdk.Attempt{a}); err != nil {
			t.Fatal(err)
		}
		at, running, ok := b.claimRecord(t, "warm-a")
		if !ok || !at.Equal(base) || running != runs(a) {
			t.Fatalf("claim record (%s, %q, %v): want the token's issue time %s and %s", at, running, ok, base, runs(a))
		}
		// The next claim presents the token the first one renewed.
		b.clk.Advance(2 * time.Second)
		if _, err := wc.Claim(ctx, "warm-a", 1, nil); err != nil {
			t.Fatal(err)
		}
		at, running, ok = b.claimRecord(t, "warm-a")
		if !ok || !at.Equal(base.Add(3*time.Second)) || running != "[]" {
			t.Fatalf("claim record (%s, %q, %v): want the renewed token's issue time and an empty list", at, running, ok)
		}
		if n := b.meter.Count(attemptapi.CallClaim + "/ok"); n != 2 {
			t.Fatalf("%d claims metered ok, want 2", n)
		}
	})

	t.Run("ClaimThatDoesNotSayWhatItRuns_RecordedAsUnknown", func(t *testing.T) {
		b := setup(t)
		cred, err := b.issuer.MintWorker("warm-a", b.clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		if st := b.rawClaim(t, cred.Token, `{"worker": "warm-a", "slots": 1}`); st != http.StatusOK {
			t.Fatalf("status %d", st)
		}
		if at, running, ok := b.claimRecord(t, "warm-a"); !ok || !at.Equal(base) || running != "" {
			t.Fatalf("claim record (%s, %q, %v): want one at %s with no list (unknown, not \"runs nothing\")", at, running, ok, base)
		}
	})

	t.Run("ALateClaimWithAnOlderTokenNeverReplacesANewerRecord", func(t *testing.T) {
		b := setup(t)
		a := b.bindWarm(t, "r1", "warm-a")
		stale := b.workerClient(t, "warm-a") // a request sent before the handover, arriving late
		b.clk.Advance(time.Second)
		fresh := b.workerClient(t, "warm-a")
		if _, err := fresh.Claim(ctx, "warm-a", 1, []sdk.Attempt{a}); err != nil {
			t.Fatal(err)
		}
		b.clk.Advance(time.Second)
		if _, err := stale.Claim(ctx, "warm-a", 1, nil); err != nil {
			t.Fatal(err)
		}
		if at, running, _ := b.claimRecord(t, "warm-a"); !at.Equal(base.Add(time.Second)) || running != runs(a) {
			t.Fatalf("claim record (%s, %q): the late claim of the older token replaced the newer one", at, running)
		}
	})

	t.Run("AnotherWorkersTokenRecordsNoClaim_RefusedLoggedMetered", func(t *testing.T) {
		b := setup(t)
		b.bindWarm(t, "r1", "warm-a")
		wc := b.workerClient(t, "warm-b")
		before := wc.Token()
		_, err := wc.Claim(ctx, "warm-a", 1, nil) // "warm-a runs nothing", said by warm-b
		refusedWith(t, err, attemptapi.CodeWrongScope)
		b.wantNoClaimRecord(t, "warm-a")
		b.wantNoClaimRecord(t, "warm-b")
		if wc.Token() != before {
			t.Fatal("a refused claim renewed the worker's token")
		}
		if n := b.meter.Count(attemptapi.CallClaim + "/" + attemptapi.CodeWrongScope); n != 1 {
			t.Fatalf("%d refused claims metered, want 1", n)
		}
		if logs := b.log.String(); !strings.Contains(logs, "code=wrong_scope") || !strings.Contains(logs, "call=claim") {
			t.Fatalf("the refusal was not logged: %s", logs)
		}
	})

	t.Run("OversizedRunningList_RefusedLoggedMeteredChangesNothing", func(t *testing.T) {
		b := setup(t)
		a := b.bindWarm(t, "r1", "warm-a")
		wc := b.workerClient(t, "warm-a")
		if _, err := wc.Claim(ctx, "warm-a", 1, []sdk.Attempt{a}); err != nil {
			t.Fatal(err)
		}
		recAt, recRunning, _ := b.claimRecord(t, "warm-a")
		before := wc.Token()
		b.clk.Advance(time.Second)
		long := make([]sdk.Attempt, attemptapi.MaxClaimRunning+1)
		for i := range long {
			long[i] = sdk.Attempt{RunID: fmt.Sprintf("other-%d", i), TaskID: "t", Try: 1}
		}
		got, err := wc.Claim(ctx, "warm-a", 1, long)
		refusedWith(t, err, attemptapi.CodeBadRequest)
		if len(got) != 0 || wc.Token() != before {
			t.Fatalf("a refused claim handed out %d attempts or renewed the token", len(got))
		}
		if at, running, _ := b.claimRecord(t, "warm-a"); !at.Equal(recAt) || running != recRunning {
			t.Fatalf("claim record (%s, %q) after a refused claim: want it unchanged (%s, %q)", at, running, recAt, recRunning)
		}
		if n := b.meter.Count(attemptapi.CallClaim + "/" + attemptapi.CodeBadRequest); n != 1 {
			t.Fatalf("%d refused claims metered, want 1", n)
		}
		if logs := b.log.String(); !strings.Contains(logs, "running attempts, at most") {
			t.Fatalf("the refusal was not logged: %s", logs)
		}
		// A list of exactly the bound is accepted.
		if _, err := wc.Claim(ctx, "warm-a", 1, long[:attemptapi.MaxClaimRunning]); err != nil {
			t.Fatalf("a list of %d (the bound): %v", attemptapi.MaxClaimRunning, err)
		}
	})

	t.Run("MalformedRunningAttempt_RefusedChangesNothing", func(t *testing.T) {
		b := setup(t)
		cred, err := b.issuer.MintWorker("warm-a", b.clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		for _, body := range []string{
			`{"worker": "warm-a", "slots": 1, "running": [{"run_id": "", "task_id": "t", "try": 1, "epoch": 0}]}`,
			`{"worker": "warm-a", "slots": 1, "running": [{"run_id": "r", "task_id": "t", "try": -1, "epoch": 0}]}`,
			`{"worker": "warm-a", "slots": 1, "running": [{"run_id": "r", "task_id": "t", "try": 1, "epoch": 0, "pid": 1}]}`,
			`{"worker": "warm-a", "slots": 1, "running": {"run_id": "r"}}`,
		} {
			if st := b.rawClaim(t, cred.Token, body); st != http.StatusBadRequest {
				t.Fatalf("status %d for %s, want 400", st, body)
			}
		}
		b.wantNoClaimRecord(t, "warm-a")
	})
}

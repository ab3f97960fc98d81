package attemptapi_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/sdk"
)

// snapshot is the whole task instance row of a, as JSON: what "the board
// is unchanged" compares.
func (b *bundle) snapshot(t *testing.T, a sdk.Attempt) string {
	t.Helper()
	var row string
	if err := b.pool.QueryRow(context.Background(), `SELECT to_jsonb(ti)::text FROM task_instances ti
        WHERE run_id = $1 AND task_id = $2`, a.RunID, a.TaskID).Scan(&row); err != nil {
		t.Fatal(err)
	}
	return row
}

// exchangedAt reads credential_exchanged_at of the task's row (zero: NULL).
func (b *bundle) exchangedAt(t *testing.T, a sdk.Attempt) time.Time {
	t.Helper()
	var at *time.Time
	if err := b.pool.QueryRow(context.Background(), `SELECT credential_exchanged_at FROM task_instances
        WHERE run_id = $1 AND task_id = $2`, a.RunID, a.TaskID).Scan(&at); err != nil {
		t.Fatal(err)
	}
	if at == nil {
		return time.Time{}
	}
	return *at
}

// raw makes one call with token as the bearer, bypassing the client's own
// rules (it never sends a working token to the exchange), and returns the
// status and the error code ("" when accepted).
func (b *bundle) raw(t *testing.T, path, token string, req attemptapi.Request) (int, string) {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(b.ca))
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	defer hc.CloseIdleConnections()
	body, _ := json.Marshal(req)
	r, _ := http.NewRequest(http.MethodPost, b.url+path, bytes.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+token)
	res, err := hc.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var eb attemptapi.ErrorBody
	_ = json.NewDecoder(res.Body).Decode(&eb)
	return res.StatusCode, eb.Code
}

func attemptRequest(a sdk.Attempt) attemptapi.Request {
	return attemptapi.Request{RunID: a.RunID, TaskID: a.TaskID, Try: a.Try, Epoch: a.Epoch}
}

// TestBootstrapExchange proves the single use of the credential a runner
// puts in a pod spec (or a Lite agent's environment): the bootstrap token
// is exchanged once, before RUNNING, for the attempt's working token, and
// once exchanged the copy authorises nothing.
func TestBootstrapExchange(t *testing.T) {
	ctx := context.Background()

	t.Run("ExchangeGivesTheWorkingToken_AgentRunsToAnOutcome", func(t *testing.T) {
		b := setup(t)
		b.run(t, "r1", "t1")
		a := sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1}
		c, boot := b.dispatchBootstrap(t, a)
		if !attempttoken.IsBootstrap(boot) {
			t.Fatalf("the issuer handed %q: want a bootstrap token", boot)
		}
		b.clk.Advance(20 * time.Second)
		if term, err := c.Exchange(ctx, a); err != nil || term {
			t.Fatalf("exchange: %v %v", term, err)
		}
		work := c.Token()
		wc, err := b.keys.get().VerifyFor(work, a, b.clk.Now())
		if err != nil {
			t.Fatalf("the working token: %v", err)
		}
		if !wc.MintedAt.Equal(base) || !wc.IssuedAt.Equal(b.clk.Now()) {
			t.Fatalf("working token minted %v issued %v: want the bootstrap's mint %v, issued at the exchange", wc.MintedAt, wc.IssuedAt, base)
		}
		if got := b.exchangedAt(t, a); !got.Equal(b.clk.Now()) {
			t.Fatalf("credential_exchanged_at = %v, want %v", got, b.clk.Now())
		}
		if term, err := c.Running(ctx, a); err != nil || term {
			t.Fatalf("running: %v %v", term, err)
		}
		b.clk.Advance(15 * time.Second)
		if resp, err := c.Heartbeat(ctx, a); err != nil || resp.ShouldTerminate {
			t.Fatalf("heartbeat: %+v %v", resp, err)
		}
		if term, err := c.Report(ctx, a, attemptapi.ReportBody{State: sdk.StateSuccess}); err != nil || term {
			t.Fatalf("report: %v %v", term, err)
		}
		ti := b.ti(t, a)
		if ti.State != sdk.StateSuccess || !ti.CredentialMintedAt.Equal(base) {
			t.Fatalf("row %s minted %v, want success and the mint kept", ti.State, ti.CredentialMintedAt)
		}
		if n := b.meter.Count("exchange/ok"); n != 1 {
			t.Fatalf("exchange/ok metered %d times", n)
		}
	})

	t.Run("SecondExchangeRefused_MeteredAndBoardUnchanged", func(t *testing.T) {
		b := setup(t)
		b.run(t, "r1", "t1")
		a := sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1}
		c, boot := b.dispatchBootstrap(t, a)
		if term, err := c.Exchange(ctx, a); err != nil || term {
			t.Fatalf("exchange: %v %v", term, err)
		}
		// The copy read from the pod spec, replayed while the attempt is
		// still queued, then once it runs.
		thief, err := attemptapi.NewClient(b.url, boot, b.ca)
		if err != nil {
			t.Fatal(err)
		}
		defer thief.Close()
		before := b.snapshot(t, a)
		b.clk.Advance(time.Second)
		_, err = thief.Exchange(ctx, a)
		refusedWith(t, err, attemptapi.CodeBootstrapSpent)
		if thief.Token() != boot {
			t.Fatal("a refused exchange gave the thief a token")
		}
		if after := b.snapshot(t, a); after != before {
			t.Fatalf("a refused exchange wrote the row:\nbefore %s\nafter  %s", before, after)
		}
		if term, err := c.Running(ctx, a); err != nil || term {
			t.Fatalf("running: %v %v", term, err)
		}
		before = b.snapshot(t, a)
		_, err = thief.Exchange(ctx, a)
		refusedWith(t, err, attemptapi.CodeBootstrapSpent)
		if after := b.snapshot(t, a); after != before {
			t.Fatalf("a refused exchange wrote the running row:\nbefore %s\nafter  %s", before, after)
		}
		if n := b.meter.Count("exchange/" + attemptapi.CodeBootstrapSpent); n != 2 {
			t.Fatalf("exchange/%s metered %d times, want 2", attemptapi.CodeBootstrapSpent, n)
		}
		if n := strings.Count(b.log.String(), "code="+attemptapi.CodeBootstrapSpent); n != 2 {
			t.Fatalf("the refused exchange logged %d times, want 2:\n%s", n, b.log.String())
		}
	})

	t.Run("BootstrapTokenCannotHeartbeatRenewReportOrReadState", func(t *testing.T) {
		b := setup(t)
		b.run(t, "r1", "t1")
		a := sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1}
		c, boot := b.dispatchBootstrap(t, a)
		// Before the exchange: the bootstrap token cannot stand in for the
		// working token, not even for RUNNING.
		for _, path := range []string{attemptapi.PathRunning, attemptapi.PathHeartbeat, attemptapi.PathReport,
			attemptapi.PathState, attemptapi.PathClaim} {
			before := b.snapshot(t, a)
			if status, code := b.raw(t, path, boot, attemptRequest(a)); status != http.StatusForbidden || code != attemptapi.CodeWrongKind {
				t.Fatalf("%s with the bootstrap token: %d %s, want 403 %s", path, status, code, attemptapi.CodeWrongKind)
			}
			if after := b.snapshot(t, a); after != before {
				t.Fatalf("%s with the bootstrap token wrote the row", path)
			}
		}
		if term, err := c.Exchange(ctx, a); err != nil || term {
			t.Fatalf("exchange: %v %v", term, err)
		}
		if term, err := c.Running(ctx, a); err != nil || term {
			t.Fatalf("running: %v %v", term, err)
		}
		// After: the copy from the pod spec, against a running attempt.
		report := attemptRequest(a)
		report.Outcome = &attemptapi.ReportBody{State: sdk.StateFailed, Reason: "forged"}
		for _, r := range []struct {
			path string
			req  attemptapi.Request
		}{{attemptapi.PathHeartbeat, attemptRequest(a)}, {attemptapi.PathReport, report}, {attemptapi.PathState, attemptRequest(a)}} {
			before := b.snapshot(t, a)
			if status, code := b.raw(t, r.path, boot, r.req); status != http.StatusForbidden || code != attemptapi.CodeWrongKind {
				t.Fatalf("%s with the spent bootstrap token: %d %s, want 403 %s", r.path, status, code, attemptapi.CodeWrongKind)
			}
			if after := b.snapshot(t, a); after != before {
				t.Fatalf("%s with the spent bootstrap token wrote the row", r.path)
			}
		}
		if b.meter.Renewals("renewed") != 0 {
			t.Fatalf("a bootstrap token was renewed: %v", b.meter)
		}
		if n := b.meter.Count("heartbeat/" + attemptapi.CodeWrongKind); n != 2 {
			t.Fatalf("heartbeat/%s metered %d times, want 2", attemptapi.CodeWrongKind, n)
		}
	})

	t.Run("BootstrapMintedLongAgoExpiresFromItsMint", func(t *testing.T) {
		b := setup(t)
		b.run(t, "r1", "t1", "t2")
		a := sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1}
		c, _ := b.dispatchBootstrap(t, a)
		a2 := sdk.Attempt{RunID: "r1", TaskID: "t2", Try: 1}
		c2, _ := b.dispatchBootstrap(t, a2)
		// Just inside the TTL: the exchange applies, but the mint stays the
		// dispatch's, so start_expired and the ceiling count from it.
		b.clk.Advance(ttl - time.Millisecond)
		if term, err := c2.Exchange(ctx, a2); err != nil || term {
			t.Fatalf("exchange inside the TTL: %v %v", term, err)
		}
		if ti := b.ti(t, a2); !ti.CredentialMintedAt.Equal(base) {
			t.Fatalf("the exchange moved credential_minted_at to %v, want the mint %v", ti.CredentialMintedAt, base)
		}
		wc, err := b.keys.get().VerifyFor(c2.Token(), a2, b.clk.Now())
		if err != nil || !wc.MintedAt.Equal(base) {
			t.Fatalf("working token minted %v (%v), want %v", wc.MintedAt, err, base)
		}
		// One TTL after the mint, however the attempt waited (a Pending
		// pod pulling its image): the exchange is refused, nothing written.
		b.clk.Advance(time.Millisecond)
		before := b.snapshot(t, a)
		_, err = c.Exchange(ctx, a)
		refusedWith(t, err, attemptapi.CodeExpired)
		if after := b.snapshot(t, a); after != before {
			t.Fatalf("an expired exchange wrote the row")
		}
	})

	t.Run("WorkingTokenCannotExchange", func(t *testing.T) {
		b := setup(t)
		b.run(t, "r1", "t1")
		a := sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1}
		c, _ := b.dispatchBootstrap(t, a)
		// A working token minted for the queued attempt, never exchanged:
		// it cannot perform (or spend) the exchange.
		work, _, err := b.keys.get().Mint(a, b.clk.Now(), ttl)
		if err != nil {
			t.Fatal(err)
		}
		before := b.snapshot(t, a)
		if status, code := b.raw(t, attemptapi.PathExchange, work, attemptRequest(a)); status != http.StatusForbidden || code != attemptapi.CodeWrongKind {
			t.Fatalf("exchange with a working token: %d %s, want 403 %s", status, code, attemptapi.CodeWrongKind)
		}
		if after := b.snapshot(t, a); after != before {
			t.Fatalf("an exchange with a working token wrote the row")
		}
		// And the working token the exchange gave cannot exchange again.
		if term, err := c.Exchange(ctx, a); err != nil || term {
			t.Fatalf("exchange: %v %v", term, err)
		}
		if status, code := b.raw(t, attemptapi.PathExchange, c.Token(), attemptRequest(a)); status != http.StatusForbidden || code != attemptapi.CodeWrongKind {
			t.Fatalf("exchange with the exchanged working token: %d %s", status, code)
		}
	})

	t.Run("BootstrapForOneAttemptCannotExchangeForAnother", func(t *testing.T) {
		b := setup(t)
		b.run(t, "r1", "t1", "t2")
		b.run(t, "r2", "t1")
		a := sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1}
		_, boot := b.dispatchBootstrap(t, a)
		others := []sdk.Attempt{{RunID: "r1", TaskID: "t2", Try: 1}, {RunID: "r2", TaskID: "t1", Try: 1}}
		for _, o := range others {
			b.dispatchBootstrap(t, o)
		}
		others = append(others, sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 2}, sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1, Epoch: 1})
		for _, o := range others {
			before, beforeA := b.snapshot(t, o), b.snapshot(t, a)
			if status, code := b.raw(t, attemptapi.PathExchange, boot, attemptRequest(o)); status != http.StatusForbidden || code != attemptapi.CodeWrongScope {
				t.Fatalf("A's bootstrap exchanged for %s: %d %s, want 403 %s", o, status, code, attemptapi.CodeWrongScope)
			}
			if b.snapshot(t, o) != before || b.snapshot(t, a) != beforeA {
				t.Fatalf("a wrong-scope exchange for %s wrote a row", o)
			}
		}
		if n := b.meter.Count("exchange/" + attemptapi.CodeWrongScope); n != len(others) {
			t.Fatalf("exchange/%s metered %d times, want %d", attemptapi.CodeWrongScope, n, len(others))
		}
	})

	t.Run("MovedOnAttemptExchangesNothing_RailsClearTheExchange", func(t *testing.T) {
		b := setup(t)
		b.run(t, "r1", "t1")
		a := sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1}
		c := b.dispatch(t, a)
		if term, err := c.Running(ctx, a); err != nil || term {
			t.Fatalf("running: %v %v", term, err)
		}
		if term, err := c.Report(ctx, a, attemptapi.ReportBody{State: sdk.StateUpForRetry, Reason: "exit_code"}); err != nil || term {
			t.Fatalf("report: %v %v", term, err)
		}
		rel, err := b.w.Retry(ctx, a, b.clk.Now())
		if err != nil || !rel.Applied {
			t.Fatalf("retry: %+v %v", rel, err)
		}
		if at := b.exchangedAt(t, rel.Attempt); !at.IsZero() {
			t.Fatalf("the retry kept credential_exchanged_at %v for the new attempt", at)
		}
		// A bootstrap of the released attempt: the row holds another one.
		old, _, err := b.keys.get().MintBootstrap(a, b.clk.Now(), ttl)
		if err != nil {
			t.Fatal(err)
		}
		stale, err := attemptapi.NewClient(b.url, old, b.ca)
		if err != nil {
			t.Fatal(err)
		}
		defer stale.Close()
		before := b.snapshot(t, a)
		if term, err := stale.Exchange(ctx, a); err != nil || !term {
			t.Fatalf("exchange of a released attempt: %v %v, want should_terminate", term, err)
		}
		if b.snapshot(t, a) != before || stale.Token() != old {
			t.Fatal("the exchange of a released attempt wrote the row or gave a token")
		}
		// The new attempt, dispatched in a finished run: nothing.
		next, _ := b.dispatchBootstrap(t, rel.Attempt)
		if ok, err := b.w.FinishRun(ctx, "r1", sdk.RunFailed, "stopped", b.clk.Now()); err != nil || !ok {
			t.Fatalf("finish: %v %v", ok, err)
		}
		before = b.snapshot(t, a)
		if term, err := next.Exchange(ctx, rel.Attempt); err != nil || !term {
			t.Fatalf("exchange in a finished run: %v %v, want should_terminate", term, err)
		}
		if b.snapshot(t, a) != before {
			t.Fatal("the exchange in a finished run wrote the row")
		}
	})
}

package attemptapi_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/sdk"
)

// workerExchanges counts the worker exchange records.
func (b *bundle) workerExchanges(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM worker_credential_exchanges`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestWarmWorkerBootstrapExchange: a warm worker's pod spec carries a
// worker bootstrap token, exchanged once for the worker token before the
// first claim; the copy claims nothing afterwards.
func TestWarmWorkerBootstrapExchange(t *testing.T) {
	ctx := context.Background()

	t.Run("ExchangeGivesTheWorkerToken_TheWorkerClaims", func(t *testing.T) {
		b := setup(t)
		a := b.bindWarm(t, "r1", "warm-a")
		cred, err := b.issuer.MintWorkerBootstrap("warm-a", b.clk.Now())
		if err != nil || !attempttoken.IsWorkerBootstrap(cred.Token) {
			t.Fatalf("mint: %.4s %v", cred.Token, err)
		}
		wc, err := attemptapi.NewClient(b.url, cred.Token, b.ca)
		if err != nil {
			t.Fatal(err)
		}
		defer wc.Close()
		if _, err := wc.Claim(ctx, "warm-a", 1, nil); err == nil {
			t.Fatal("the worker bootstrap token claimed")
		} else {
			refusedWith(t, err, attemptapi.CodeWrongKind)
		}
		b.clk.Advance(time.Second)
		if err := wc.ExchangeWorker(ctx, "warm-a"); err != nil {
			t.Fatal(err)
		}
		if _, err := b.keys.get().VerifyWorker(wc.Token(), b.clk.Now()); err != nil {
			t.Fatalf("the token the exchange gave: %v", err)
		}
		got, err := wc.Claim(ctx, "warm-a", 1, nil)
		if err != nil || len(got) != 1 || got[0].Attempt() != a {
			t.Fatalf("claim: %+v %v", got, err)
		}
	})

	t.Run("SecondExchangeRefused_MeteredAndNothingWritten", func(t *testing.T) {
		b := setup(t)
		b.bindWarm(t, "r1", "warm-a")
		cred, _ := b.issuer.MintWorkerBootstrap("warm-a", b.clk.Now())
		worker, _ := attemptapi.NewClient(b.url, cred.Token, b.ca)
		defer worker.Close()
		if err := worker.ExchangeWorker(ctx, "warm-a"); err != nil {
			t.Fatal(err)
		}
		thief, _ := attemptapi.NewClient(b.url, cred.Token, b.ca)
		defer thief.Close()
		n := b.workerExchanges(t)
		refusedWith(t, thief.ExchangeWorker(ctx, "warm-a"), attemptapi.CodeBootstrapSpent)
		if thief.Token() != cred.Token || b.workerExchanges(t) != n {
			t.Fatal("a refused worker exchange gave a token or wrote a record")
		}
		if _, err := thief.Claim(ctx, "warm-a", 1, nil); err == nil {
			t.Fatal("the spent worker bootstrap token claimed")
		}
		if c := b.meter.Count(attemptapi.CallWorkerExchange + "/" + attemptapi.CodeBootstrapSpent); c != 1 {
			t.Fatalf("worker_exchange/%s metered %d times, want 1", attemptapi.CodeBootstrapSpent, c)
		}
	})

	t.Run("WrongKindOrWorkerCannotExchange", func(t *testing.T) {
		b := setup(t)
		b.run(t, "r1", "t1")
		cred, _ := b.issuer.MintWorkerBootstrap("warm-a", b.clk.Now())
		work, _, _ := b.keys.get().MintWorker("warm-a", b.clk.Now(), ttl)
		boot, _, _ := b.keys.get().MintBootstrap(sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1}, b.clk.Now(), ttl)
		for _, c := range []struct {
			name, token, worker, code string
		}{
			{"AWorkerToken", work, "warm-a", attemptapi.CodeWrongKind},
			{"AnAttemptBootstrapToken", boot, "warm-a", attemptapi.CodeWrongKind},
			{"AnotherWorkersBootstrap", cred.Token, "warm-b", attemptapi.CodeWrongScope},
		} {
			if status, code := b.raw(t, attemptapi.PathWorkerExchange, c.token, attemptapi.Request{Worker: c.worker}); status != http.StatusForbidden || code != c.code {
				t.Fatalf("%s: %d %s, want 403 %s", c.name, status, code, c.code)
			}
		}
		// The worker bootstrap token is not an attempt's either.
		if status, code := b.raw(t, attemptapi.PathExchange, cred.Token, attemptRequest(sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1})); status != http.StatusForbidden || code != attemptapi.CodeWrongKind {
			t.Fatalf("a worker bootstrap on the attempt exchange: %d %s", status, code)
		}
		if b.workerExchanges(t) != 0 {
			t.Fatal("a refused worker exchange wrote a record")
		}
	})

	t.Run("ExpiredRecordsArePruned", func(t *testing.T) {
		b := setup(t)
		for _, w := range []string{"warm-a", "warm-b"} {
			cred, _ := b.issuer.MintWorkerBootstrap(w, b.clk.Now())
			c, _ := attemptapi.NewClient(b.url, cred.Token, b.ca)
			if err := c.ExchangeWorker(ctx, w); err != nil {
				t.Fatal(err)
			}
			c.Close()
		}
		b.clk.Advance(ttl)
		cred, _ := b.issuer.MintWorkerBootstrap("warm-c", b.clk.Now())
		c, _ := attemptapi.NewClient(b.url, cred.Token, b.ca)
		defer c.Close()
		if err := c.ExchangeWorker(ctx, "warm-c"); err != nil {
			t.Fatal(err)
		}
		if n := b.workerExchanges(t); n != 1 {
			t.Fatalf("%d worker exchange records, want 1: those of expired tokens pruned", n)
		}
	})
}

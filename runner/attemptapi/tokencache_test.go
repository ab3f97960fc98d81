package attemptapi_test

import (
	"context"
	"net/http"
	"net/http/httptrace"
	"testing"

	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/sdk"
)

// The connection's cached token (connTokens) serves only the same bytes
// under the same keyring, and every call is still checked for its expiry
// on the server's clock and for its scope: on one kept-alive connection, a
// token once accepted is refused once it expires, for another attempt's
// body, once its key is retired, and a different token (another attempt's,
// a forged copy) is judged on its own.
func TestTheConnectionsTokenCacheGrantsNothingNew(t *testing.T) {
	b := setup(t)
	b.run(t, "r1", "t1", "t2")
	a1, a2 := sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1}, sdk.Attempt{RunID: "r1", TaskID: "t2", Try: 1}
	var tokens []string
	for _, a := range []sdk.Attempt{a1, a2} {
		c := b.dispatch(t, a)
		if term, err := c.Running(context.Background(), a); err != nil || term {
			t.Fatalf("running %s: %v %v", a, term, err)
		}
		tokens = append(tokens, c.Token())
	}
	// One connection, kept alive, carries every call below.
	tr, err := attemptapi.NewTransport(b.ca)
	if err != nil {
		t.Fatal(err)
	}
	tr.MaxConnsPerHost = 1
	hc := &http.Client{Transport: tr}
	t.Cleanup(tr.CloseIdleConnections)
	client := func(tok string) *attemptapi.Client {
		c, err := attemptapi.NewClientOver(b.url, tok, hc)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c1, c2 := client(tokens[0]), client(tokens[1])
	// beat sends a heartbeat and says whether it rode the connection of
	// the call before.
	beat := func(c *attemptapi.Client, a sdk.Attempt) (bool, error) {
		var reused bool
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }})
		resp, err := c.Heartbeat(ctx, a)
		if err == nil && resp.ShouldTerminate {
			t.Fatalf("%s told to terminate", a)
		}
		return reused, err
	}
	ok := func(c *attemptapi.Client, a sdk.Attempt, wantReused bool) {
		t.Helper()
		reused, err := beat(c, a)
		if err != nil {
			t.Fatalf("heartbeat of %s: %v", a, err)
		}
		if reused != wantReused {
			t.Fatalf("heartbeat of %s: connection reused %v, want %v", a, reused, wantReused)
		}
	}
	refused := func(c *attemptapi.Client, a sdk.Attempt, code string) {
		t.Helper()
		reused, err := beat(c, a)
		refusedWith(t, err, code)
		if !reused {
			t.Fatalf("refused %s on a new connection: the cache was not put to the test", code)
		}
	}

	ok(c1, a1, false)
	ok(c1, a1, true) // the cached envelope
	// The cached token, for another attempt's body.
	refused(c1, a2, attemptapi.CodeWrongScope)
	// Another attempt's token on the same connection is its own; the
	// first is still judged right after it.
	ok(c2, a2, true)
	refused(c2, a1, attemptapi.CodeWrongScope)
	ok(c1, a1, true)
	// A copy of the cached token with its signature changed.
	forged := []byte(tokens[0])
	if forged[len(forged)-2] == 'A' {
		forged[len(forged)-2] = 'B'
	} else {
		forged[len(forged)-2] = 'A'
	}
	refused(client(string(forged)), a1, attemptapi.CodeForged) // closes the connection: refused unread

	// The key retired (a keyring without it): the cached token, same bytes,
	// is refused.
	ok(c1, a1, false)
	ok(c1, a1, true)
	k1 := b.keys.get()
	rotated, err := attempttoken.NewKeyring(newKey("k2"))
	if err != nil {
		t.Fatal(err)
	}
	b.keys.set(rotated)
	refused(c1, a1, attemptapi.CodeUnknownKey)
	b.keys.set(k1)

	// Expiry on the server's clock, on the connection that cached it.
	ok(c1, a1, false)
	ok(c1, a1, true)
	b.clk.Advance(ttl)
	refused(c1, a1, attemptapi.CodeExpired)
}

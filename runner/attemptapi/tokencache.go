package attemptapi

import (
	"context"
	"net"
	"sync"

	"github.com/dexaflow/reaper/runner/attempttoken"
)

// connTokens is one connection's verified attempt token: the last one
// whose envelope (kind, key, signature, payload) verified on the
// connection, kept so that the agent's next call on it, which carries the
// same token until a renewal replaces it, is not checked for its signature
// again.
//
// What it may serve stale, and for how long: nothing. An entry answers
// only a token of exactly the same bytes under exactly the same keyring
// (the *Keyring the server's Keys returned: a rotation or a reload of the
// key file hands out another, and the entry no longer answers), and what
// it answers, the envelope's verdict, depends on nothing else. It lives as
// long as its connection (at most the API's idle_timeout past the last
// call). The expiry, on the server's clock, and the scope, against the
// call's body, are checked on every call as for a token not cached, and
// the board's guards on every write: the cache saves an HMAC, and the
// token can do nothing on a connection it could not do on a fresh one.
type connTokens struct {
	mu      sync.Mutex
	keys    *attempttoken.Keyring
	token   string
	claims  attempttoken.Claims
	subject string
}

// connTokensKey is the connection's context key of its connTokens.
type connTokensKey struct{}

// withConnTokens is the http.Server's ConnContext: each connection gets
// its own (empty) connTokens.
func withConnTokens(ctx context.Context, _ net.Conn) context.Context {
	return context.WithValue(ctx, connTokensKey{}, &connTokens{})
}

// connTokensOf is ctx's connection's connTokens; nil (nothing cached) when
// the handler is served without Serve.
func connTokensOf(ctx context.Context) *connTokens {
	t, _ := ctx.Value(connTokensKey{}).(*connTokens)
	return t
}

// envelope is keys.Envelope(token) and its subject, from the connection's
// entry when it holds exactly token under exactly keys; a token that
// verifies becomes the entry. A nil t caches nothing.
func (t *connTokens) envelope(keys *attempttoken.Keyring, token string) (attempttoken.Claims, string, error) {
	if t != nil {
		t.mu.Lock()
		if t.keys == keys && t.token == token {
			c, subject := t.claims, t.subject
			t.mu.Unlock()
			return c, subject, nil
		}
		t.mu.Unlock()
	}
	c, err := keys.Envelope(token)
	if err != nil {
		return attempttoken.Claims{}, "", err
	}
	subject := attempttoken.AttemptSubject(c)
	if t != nil {
		t.mu.Lock()
		t.keys, t.token, t.claims, t.subject = keys, token, c, subject
		t.mu.Unlock()
	}
	return c, subject, nil
}

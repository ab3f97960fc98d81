package attempttoken

import (
	"fmt"
	"strings"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// The bootstrap credential: what a runner puts where others may read it (a
// pod spec's environment, which anyone allowed to get pods reads). It is
// bound to one attempt like an attempt token and carries the same claims,
// but it is of its own kind (the first part of the wire form, covered by
// the MAC):
//
//	rbt1.<key id>.<base64url payload>.<base64url mac>
//
// with the attempt token's payload. A bootstrap token is good for exactly
// one call, the exchange (the attempt API's PathExchange): the agent's
// first call, before it reports RUNNING, which the board records on the
// attempt and answers with the attempt's working token (an attempt token
// with the same first mint time). A second exchange of the same attempt is
// refused, so a bootstrap token copied from the pod spec after the agent
// started is worth nothing; and being of its own kind, it can never
// heartbeat, renew, report or read state, and an attempt token can never
// be exchanged.
const bootstrapPrefix = "rbt1"

// MintBootstrap signs the bootstrap token of a's credential, minted and
// issued at now, expiring after ttl: the exchange must come before that,
// so the deadline for an agent to start counts from the mint.
func (kr *Keyring) MintBootstrap(a sdk.Attempt, now time.Time, ttl time.Duration) (string, Claims, error) {
	c := Claims{Attempt: a, MintedAt: now, IssuedAt: now, ExpiresAt: now.Add(ttl)}
	if a.RunID == "" || a.TaskID == "" {
		return "", c, fmt.Errorf("signing a bootstrap token: attempt %s names no run or task", a)
	}
	if ttl <= 0 {
		return "", c, fmt.Errorf("signing a bootstrap token for %s: TTL %s is not positive", a, ttl)
	}
	return kr.seal(bootstrapPrefix, encode(c)), c, nil
}

// VerifyBootstrapFor checks a bootstrap token's kind, key, signature and
// expiry at now, and that it is for exactly the attempt a, and returns its
// claims. An attempt or worker token is ErrWrongKind.
func (kr *Keyring) VerifyBootstrapFor(token string, a sdk.Attempt, now time.Time) (Claims, error) {
	raw, err := kr.open(token, bootstrapPrefix)
	if err != nil {
		return Claims{}, err
	}
	c, err := decode(raw)
	if err != nil {
		return Claims{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if !now.Before(c.ExpiresAt) {
		return c, fmt.Errorf("%w: bootstrap token of attempt %s, expired %s ago (minted %s)", ErrExpired, c.Attempt,
			now.Sub(c.ExpiresAt).Round(time.Second), c.MintedAt.Format(time.RFC3339))
	}
	if c.Attempt != a {
		return c, fmt.Errorf("%w: the bootstrap token is for %s, the call names %s", ErrWrongScope, c.Attempt, a)
	}
	return c, nil
}

// IsBootstrap reports whether token is of the bootstrap kind (by its
// prefix only; nothing is verified).
func IsBootstrap(token string) bool { return strings.HasPrefix(token, bootstrapPrefix+".") }

// Package attempttoken holds the per-attempt credential: a bearer token
// bound to exactly one attempt (run, task, try, epoch), with the time its
// credential was first minted (at dispatch), the time this token was
// issued and the time it expires, signed with HMAC-SHA256 under a named key.
//
// The runner mints a bootstrap token at dispatch (Issuer.Mint, see
// MintBootstrap) and hands it to the attempt's agent in its environment;
// the agent exchanges it once, before RUNNING, for the attempt's working
// token. reaperd's attempt API verifies the working token on every call
// (Keyring.Verify) and, while the attempt heartbeats and is younger than
// the credential ceiling, answers with a renewed token (Keyring.Renew),
// which keeps the first mint time.
//
// The wire form is
//
//	rat1.<key id>.<base64url payload>.<base64url mac>
//
// where the payload is a compact binary encoding (see encode) and the MAC is
// HMAC-SHA256 over "rat1." + key id + "." + payload. A keyring signs with
// its current key and verifies with the current key and any previous one,
// so a key can be rotated without failing a live agent: add the new key
// first, keep the old one as previous until every token it signed has
// expired (one attempt token TTL), then drop it.
package attempttoken

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// prefix names the token format and its version.
const prefix = "rat1"

// MinSecretLen is the shortest key secret accepted (256 bits).
const MinSecretLen = 32

// Errors of Verify. Every refusal wraps exactly one of them.
var (
	// ErrMalformed: not a token of this format.
	ErrMalformed = errors.New("attempt token malformed")
	// ErrUnknownKey: signed with a key this keyring does not hold (forged,
	// or signed with a key already retired).
	ErrUnknownKey = errors.New("attempt token signed with an unknown key")
	// ErrForged: the signature does not match.
	ErrForged = errors.New("attempt token signature invalid")
	// ErrExpired: past its expiry.
	ErrExpired = errors.New("attempt token expired")
	// ErrWrongScope: valid, but for another attempt than the one named.
	ErrWrongScope = errors.New("attempt token is for another attempt")
	// ErrWrongKind: a token of another kind (a worker or bootstrap token
	// where an attempt token is needed, an attempt token where a bootstrap
	// token is needed, ...).
	ErrWrongKind = errors.New("token of the wrong kind")
)

// Claims are what a token says.
type Claims struct {
	// Attempt is the one attempt the token may act for.
	Attempt sdk.Attempt
	// MintedAt is when the attempt's credential was first minted (the
	// dispatch). Renewal keeps it: the credential ceiling counts from it.
	MintedAt time.Time
	// IssuedAt is when this token was issued (the mint or a renewal).
	IssuedAt time.Time
	// ExpiresAt is when the token stops being accepted.
	ExpiresAt time.Time
}

// Key is one signing key.
type Key struct {
	ID     string // short, printable, no '.'; names the key in every token
	Secret []byte // at least MinSecretLen bytes
}

// Check says why the key cannot sign, or nil.
func (k Key) Check() error {
	if k.ID == "" || strings.ContainsAny(k.ID, ". \t\n") || len(k.ID) > 64 {
		return fmt.Errorf("signing key id %q: must be 1 to 64 characters without dots or spaces", k.ID)
	}
	if len(k.Secret) < MinSecretLen {
		return fmt.Errorf("signing key %q: secret of %d bytes, at least %d needed", k.ID, len(k.Secret), MinSecretLen)
	}
	return nil
}

// Keyring signs with Current and verifies with Current and Previous.
type Keyring struct {
	current  Key
	previous map[string]Key
}

// NewKeyring checks the keys and builds a keyring: the first key signs,
// every key verifies.
func NewKeyring(current Key, previous ...Key) (*Keyring, error) {
	if err := current.Check(); err != nil {
		return nil, err
	}
	kr := &Keyring{current: current, previous: map[string]Key{}}
	for _, k := range previous {
		if err := k.Check(); err != nil {
			return nil, err
		}
		if k.ID == current.ID {
			return nil, fmt.Errorf("signing key id %q is used twice", k.ID)
		}
		if _, dup := kr.previous[k.ID]; dup {
			return nil, fmt.Errorf("signing key id %q is used twice", k.ID)
		}
		kr.previous[k.ID] = k
	}
	return kr, nil
}

// CurrentID names the key new tokens are signed with.
func (kr *Keyring) CurrentID() string { return kr.current.ID }

// SignedWithCurrent reports whether token names the current key (it says
// nothing of whether it verifies: Verify first).
func (kr *Keyring) SignedWithCurrent(token string) bool {
	parts := strings.SplitN(token, ".", 3)
	return len(parts) == 3 && parts[1] == kr.current.ID
}

// Sign encodes and signs claims with the current key.
func (kr *Keyring) Sign(c Claims) (string, error) {
	if c.Attempt.RunID == "" || c.Attempt.TaskID == "" {
		return "", fmt.Errorf("signing an attempt token: attempt %s names no run or task", c.Attempt)
	}
	if !c.ExpiresAt.After(c.IssuedAt) {
		return "", fmt.Errorf("signing an attempt token for %s: expiry %s not after issue %s", c.Attempt, c.ExpiresAt, c.IssuedAt)
	}
	return kr.seal(prefix, encode(c)), nil
}

// seal signs payload as a token of kind with the current key.
func (kr *Keyring) seal(kind string, payload []byte) string {
	head := kind + "." + kr.current.ID + "." + base64.RawURLEncoding.EncodeToString(payload)
	return head + "." + base64.RawURLEncoding.EncodeToString(mac(kr.current.Secret, head))
}

// Mint signs a new credential for a, minted and issued at now, expiring
// after ttl.
func (kr *Keyring) Mint(a sdk.Attempt, now time.Time, ttl time.Duration) (string, Claims, error) {
	c := Claims{Attempt: a, MintedAt: now, IssuedAt: now, ExpiresAt: now.Add(ttl)}
	tok, err := kr.Sign(c)
	return tok, c, err
}

// Renew signs a fresh token for the same credential (same attempt, same
// first mint time), issued at now and expiring after ttl.
func (kr *Keyring) Renew(c Claims, now time.Time, ttl time.Duration) (string, Claims, error) {
	c.IssuedAt, c.ExpiresAt = now, now.Add(ttl)
	tok, err := kr.Sign(c)
	return tok, c, err
}

// Verify checks the token's format, key, signature and expiry at now, and
// returns its claims. The error wraps one of the package's errors; a
// worker token (see MintWorker) is ErrWrongKind. It is Envelope then
// Expired.
func (kr *Keyring) Verify(token string, now time.Time) (Claims, error) {
	c, err := kr.Envelope(token)
	if err != nil {
		return Claims{}, err
	}
	return c, Expired(c, now)
}

// Envelope checks an attempt token's format, key and signature and returns
// its claims, its expiry unchecked: what Verify checks but the time, which
// depends on nothing but the token's bytes and the keyring. A caller that
// keeps its result for the same bytes and the same keyring must still
// check Expired (and the scope) at every use.
func (kr *Keyring) Envelope(token string) (Claims, error) {
	raw, err := kr.open(token, prefix)
	if err != nil {
		return Claims{}, err
	}
	c, err := decode(raw)
	if err != nil {
		return Claims{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return c, nil
}

// Expired is Verify's time check of claims that passed Envelope: nil while
// now is before their expiry, else an error wrapping ErrExpired.
func Expired(c Claims, now time.Time) error {
	if !now.Before(c.ExpiresAt) {
		return fmt.Errorf("%w: attempt %s, expired %s ago", ErrExpired, c.Attempt,
			now.Sub(c.ExpiresAt).Round(time.Second))
	}
	return nil
}

// open checks a token's envelope: its kind (kind, the other kind is
// ErrWrongKind), its key and its signature, and returns its payload.
func (kr *Keyring) open(token, kind string) ([]byte, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 4 {
		return nil, ErrMalformed
	}
	if parts[0] != kind {
		if parts[0] == prefix || parts[0] == workerPrefix || parts[0] == bootstrapPrefix || parts[0] == workerBootstrapPrefix {
			return nil, fmt.Errorf("%w: a %s token where a %s token is needed", ErrWrongKind, kindName(parts[0]), kindName(kind))
		}
		return nil, ErrMalformed
	}
	key, ok := kr.key(parts[1])
	if !ok {
		return nil, fmt.Errorf("%w (key id %q)", ErrUnknownKey, parts[1])
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[3])
	if err != nil {
		return nil, fmt.Errorf("%w: signature: %v", ErrMalformed, err)
	}
	head := parts[0] + "." + parts[1] + "." + parts[2]
	if !hmac.Equal(sig, mac(key.Secret, head)) {
		return nil, ErrForged
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return nil, fmt.Errorf("%w: payload: %v", ErrMalformed, err)
	}
	return raw, nil
}

// VerifyFor is Verify plus the scope check: the token must be for exactly
// the attempt a.
func (kr *Keyring) VerifyFor(token string, a sdk.Attempt, now time.Time) (Claims, error) {
	c, err := kr.Verify(token, now)
	if err != nil {
		return c, err
	}
	return c, Scoped(c, a)
}

// Scoped is VerifyFor's scope check: nil when claims are for exactly the
// attempt a, else an error wrapping ErrWrongScope.
func Scoped(c Claims, a sdk.Attempt) error {
	if c.Attempt != a {
		return fmt.Errorf("%w: the token is for %s, the call names %s", ErrWrongScope, c.Attempt, a)
	}
	return nil
}

// AttemptSubject is what Subject names an attempt token with claims c.
func AttemptSubject(c Claims) string { return "attempt " + c.Attempt.String() }

func (kr *Keyring) key(id string) (Key, bool) {
	if id == kr.current.ID {
		return kr.current, true
	}
	k, ok := kr.previous[id]
	return k, ok
}

func mac(secret []byte, head string) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(head))
	return h.Sum(nil)
}

// encode is the payload: try, epoch (int32 each), minted, issued, expires
// (Unix milliseconds, int64 each), then the run and task ids, each a uvarint
// length and its bytes. Big-endian throughout.
func encode(c Claims) []byte {
	b := make([]byte, 0, 32+len(c.Attempt.RunID)+len(c.Attempt.TaskID)+4)
	b = binary.BigEndian.AppendUint32(b, uint32(c.Attempt.Try))
	b = binary.BigEndian.AppendUint32(b, uint32(c.Attempt.Epoch))
	for _, t := range []time.Time{c.MintedAt, c.IssuedAt, c.ExpiresAt} {
		b = binary.BigEndian.AppendUint64(b, uint64(t.UnixMilli()))
	}
	for _, s := range []string{c.Attempt.RunID, c.Attempt.TaskID} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return b
}

func decode(b []byte) (Claims, error) {
	const fixed = 4 + 4 + 3*8
	if len(b) < fixed {
		return Claims{}, errors.New("payload too short")
	}
	var c Claims
	c.Attempt.Try = int32(binary.BigEndian.Uint32(b[0:]))
	c.Attempt.Epoch = int32(binary.BigEndian.Uint32(b[4:]))
	times := make([]time.Time, 3)
	for i := range times {
		times[i] = time.UnixMilli(int64(binary.BigEndian.Uint64(b[8+8*i:]))).UTC()
	}
	c.MintedAt, c.IssuedAt, c.ExpiresAt = times[0], times[1], times[2]
	rest := b[fixed:]
	ids := make([]string, 2)
	for i := range ids {
		n, k := binary.Uvarint(rest)
		if k <= 0 || n > uint64(len(rest)-k) {
			return Claims{}, errors.New("payload ids truncated")
		}
		ids[i] = string(rest[k : k+int(n)])
		rest = rest[k+int(n):]
	}
	if len(rest) != 0 {
		return Claims{}, errors.New("payload has trailing bytes")
	}
	c.Attempt.RunID, c.Attempt.TaskID = ids[0], ids[1]
	return c, nil
}

package attempttoken

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"
)

// The worker bootstrap credential: what a warm worker's pod spec carries
// instead of its worker token, for the same reason as an attempt's
// bootstrap token (anyone allowed to get pods reads a pod spec). It is
// bound to the worker's name, of its own kind
//
//	rwb1.<key id>.<base64url payload>.<base64url mac>
//
// with the worker token's payload (issued and expires, Unix milliseconds,
// then the worker name), and is good for exactly one call: the worker's
// first, the exchange (the attempt API's PathWorkerExchange), answered with
// the worker token. The board records the exchange, so a second one is
// refused and the copy left in the pod spec claims nothing.
const workerBootstrapPrefix = "rwb1"

// MintWorkerBootstrap signs the bootstrap token of worker's credential,
// issued at now, expiring after ttl.
func (kr *Keyring) MintWorkerBootstrap(worker string, now time.Time, ttl time.Duration) (string, WorkerClaims, error) {
	c := WorkerClaims{Worker: worker, IssuedAt: now, ExpiresAt: now.Add(ttl)}
	if worker == "" {
		return "", c, errors.New("signing a worker bootstrap token: no worker named")
	}
	if ttl <= 0 {
		return "", c, fmt.Errorf("signing a worker bootstrap token for %s: TTL %s is not positive", worker, ttl)
	}
	b := make([]byte, 0, 16+len(worker)+2)
	b = binary.BigEndian.AppendUint64(b, uint64(c.IssuedAt.UnixMilli()))
	b = binary.BigEndian.AppendUint64(b, uint64(c.ExpiresAt.UnixMilli()))
	b = binary.AppendUvarint(b, uint64(len(worker)))
	b = append(b, worker...)
	return kr.seal(workerBootstrapPrefix, b), c, nil
}

// VerifyWorkerBootstrapFor checks a worker bootstrap token's kind, key,
// signature and expiry at now, and that it is for exactly worker, and
// returns its claims. Any other kind is ErrWrongKind.
func (kr *Keyring) VerifyWorkerBootstrapFor(token, worker string, now time.Time) (WorkerClaims, error) {
	raw, err := kr.open(token, workerBootstrapPrefix)
	if err != nil {
		return WorkerClaims{}, err
	}
	if len(raw) < 16 {
		return WorkerClaims{}, fmt.Errorf("%w: worker bootstrap payload too short", ErrMalformed)
	}
	c := WorkerClaims{
		IssuedAt:  time.UnixMilli(int64(binary.BigEndian.Uint64(raw[0:]))).UTC(),
		ExpiresAt: time.UnixMilli(int64(binary.BigEndian.Uint64(raw[8:]))).UTC(),
	}
	rest := raw[16:]
	n, k := binary.Uvarint(rest)
	if k <= 0 || n == 0 || n != uint64(len(rest)-k) {
		return WorkerClaims{}, fmt.Errorf("%w: worker name truncated or trailed", ErrMalformed)
	}
	c.Worker = string(rest[k:])
	if !now.Before(c.ExpiresAt) {
		return c, fmt.Errorf("%w: worker bootstrap token of %s, expired %s ago", ErrExpired, c.Worker, now.Sub(c.ExpiresAt).Round(time.Second))
	}
	if c.Worker != worker {
		return c, fmt.Errorf("%w: the worker bootstrap token is for %s, the call names %q", ErrWrongScope, c.Worker, worker)
	}
	return c, nil
}

// IsWorkerBootstrap reports whether token is of the worker bootstrap kind
// (by its prefix only; nothing is verified).
func IsWorkerBootstrap(token string) bool { return strings.HasPrefix(token, workerBootstrapPrefix+".") }

// MintWorkerBootstrap mints the credential a warm worker's pod is created
// with: its worker bootstrap token, which the worker exchanges once for its
// worker token, and the environment entries (EnvWorkerToken, EnvAPI,
// EnvCA).
func (is Issuer) MintWorkerBootstrap(worker string, now time.Time) (WorkerCredential, error) {
	return is.mintWorker(worker, now, func(kr *Keyring) (string, WorkerClaims, error) {
		return kr.MintWorkerBootstrap(worker, now, is.TTL)
	})
}

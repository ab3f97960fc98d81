package attempttoken

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// The worker credential: what a warm pool worker (a long-lived pod that
// runs attempts one after another) shows to claim the attempts bound to
// it. It is bound to the worker's name and to nothing else, and is signed
// with the same keys as the attempt tokens but is of its own kind: the
// kind is the first part of the wire form and is covered by the MAC, so a
// worker token can never pass as an attempt token (it cannot report for
// any attempt) and an attempt token can never claim.
//
//	rwt1.<key id>.<base64url payload>.<base64url mac>
//
// The payload is issued and expires (Unix milliseconds, int64 each,
// big-endian), then the worker name as a uvarint length and its bytes,
// then when the worker's credential was first minted (Unix milliseconds):
// a renewal keeps it, and the worker credential ceiling counts from it. A
// token without the mint time (signed before it was added) counts from
// its own issue.
const workerPrefix = "rwt1"

// EnvWorkerToken names, in a warm worker's environment, its worker token
// (the API's address and CA are EnvAPI and EnvCA, as for an attempt).
const EnvWorkerToken = "REAPER_WORKER_TOKEN"

// WorkerClaims are what a worker token says.
type WorkerClaims struct {
	// Worker is the warm worker (its pod's name) the token may claim for.
	Worker string
	// MintedAt is when the worker's credential was first minted (its pod's
	// creation). A renewal keeps it: the worker credential ceiling counts
	// from it.
	MintedAt  time.Time
	IssuedAt  time.Time
	ExpiresAt time.Time
}

func kindName(kind string) string {
	switch kind {
	case workerPrefix:
		return "worker"
	case bootstrapPrefix:
		return "bootstrap"
	case workerBootstrapPrefix:
		return "worker bootstrap"
	}
	return "attempt"
}

// MintWorker signs a new worker credential for worker, minted and issued
// at now, expiring after ttl. A claim renews it (RenewWorker: the answer
// carries a fresh token) until the worker credential ceiling.
func (kr *Keyring) MintWorker(worker string, now time.Time, ttl time.Duration) (string, WorkerClaims, error) {
	return kr.signWorker(WorkerClaims{Worker: worker, MintedAt: now, IssuedAt: now, ExpiresAt: now.Add(ttl)}, ttl)
}

// RenewWorker signs a fresh token of the worker credential c, issued at now
// and expiring after ttl; it keeps c's first mint time.
func (kr *Keyring) RenewWorker(c WorkerClaims, now time.Time, ttl time.Duration) (string, WorkerClaims, error) {
	return kr.signWorker(WorkerClaims{Worker: c.Worker, MintedAt: c.MintedAt, IssuedAt: now, ExpiresAt: now.Add(ttl)}, ttl)
}

func (kr *Keyring) signWorker(c WorkerClaims, ttl time.Duration) (string, WorkerClaims, error) {
	worker := c.Worker
	if worker == "" {
		return "", c, errors.New("signing a worker token: no worker named")
	}
	if ttl <= 0 {
		return "", c, fmt.Errorf("signing a worker token for %s: TTL %s is not positive", worker, ttl)
	}
	if c.MintedAt.After(c.IssuedAt) {
		return "", c, fmt.Errorf("signing a worker token for %s: minted %s after its issue %s", worker, c.MintedAt, c.IssuedAt)
	}
	b := make([]byte, 0, 24+len(worker)+2)
	b = binary.BigEndian.AppendUint64(b, uint64(c.IssuedAt.UnixMilli()))
	b = binary.BigEndian.AppendUint64(b, uint64(c.ExpiresAt.UnixMilli()))
	b = binary.AppendUvarint(b, uint64(len(worker)))
	b = append(b, worker...)
	b = binary.BigEndian.AppendUint64(b, uint64(c.MintedAt.UnixMilli()))
	return kr.seal(workerPrefix, b), c, nil
}

// VerifyWorker checks a worker token's kind, key, signature and expiry at
// now and returns its claims. An attempt token is ErrWrongKind.
func (kr *Keyring) VerifyWorker(token string, now time.Time) (WorkerClaims, error) {
	raw, err := kr.open(token, workerPrefix)
	if err != nil {
		return WorkerClaims{}, err
	}
	if len(raw) < 16 {
		return WorkerClaims{}, fmt.Errorf("%w: worker payload too short", ErrMalformed)
	}
	c := WorkerClaims{
		IssuedAt:  time.UnixMilli(int64(binary.BigEndian.Uint64(raw[0:]))).UTC(),
		ExpiresAt: time.UnixMilli(int64(binary.BigEndian.Uint64(raw[8:]))).UTC(),
	}
	rest := raw[16:]
	n, k := binary.Uvarint(rest)
	if k <= 0 || n == 0 || n > uint64(len(rest)-k) {
		return WorkerClaims{}, fmt.Errorf("%w: worker name truncated", ErrMalformed)
	}
	c.Worker = string(rest[k : k+int(n)])
	switch tail := rest[k+int(n):]; len(tail) {
	case 0: // signed before the mint time was carried: counted from its issue
		c.MintedAt = c.IssuedAt
	case 8:
		c.MintedAt = time.UnixMilli(int64(binary.BigEndian.Uint64(tail))).UTC()
	default:
		return WorkerClaims{}, fmt.Errorf("%w: worker payload trailed", ErrMalformed)
	}
	if !now.Before(c.ExpiresAt) {
		return c, fmt.Errorf("%w: worker %s, expired %s ago", ErrExpired, c.Worker, now.Sub(c.ExpiresAt).Round(time.Second))
	}
	return c, nil
}

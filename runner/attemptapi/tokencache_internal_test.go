package attemptapi

import (
	"bytes"
	"testing"
	"time"

	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/sdk"
)

// BenchmarkTokenCheck is a heartbeat's token checks: as the server made
// them before connTokens (Subject for the bounds, then VerifyFor: two
// HMACs), on a connection's first call or after a renewal (one envelope),
// and on its next calls with the same token (none).
func BenchmarkTokenCheck(b *testing.B) {
	keys, err := attempttoken.NewKeyring(attempttoken.Key{ID: "k1", Secret: bytes.Repeat([]byte{1}, 32)})
	if err != nil {
		b.Fatal(err)
	}
	now := time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)
	a := sdk.Attempt{RunID: "run000042", TaskID: "task07", Try: 1}
	tok, _, err := keys.Mint(a, now, 10*time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	check := func(b *testing.B, t *connTokens) {
		c, _, err := t.envelope(keys, tok)
		if err != nil {
			b.Fatal(err)
		}
		if attempttoken.Expired(c, now) != nil || attempttoken.Scoped(c, a) != nil {
			b.Fatal("refused")
		}
	}
	b.Run("subject+verify", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := keys.Subject(tok); err != nil {
				b.Fatal(err)
			}
			if _, err := keys.VerifyFor(tok, a, now); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("envelope", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			check(b, nil)
		}
	})
	b.Run("cached", func(b *testing.B) {
		b.ReportAllocs()
		t := &connTokens{}
		check(b, t)
		for b.Loop() {
			check(b, t)
		}
	})
}

package attemptapi

import (
	"testing"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/sdk"
)

// Each rule of a heartbeat's renewal, by name: capped at the ceiling,
// renewed when due, kept otherwise.
func TestRenewalOf(t *testing.T) {
	const ttl, ceiling = 10 * time.Minute, time.Hour
	mint := time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)
	// token is a token of the credential minted at mint, issued at issued.
	token := func(issued time.Time) attempttoken.Claims {
		return attempttoken.Claims{Attempt: sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}, MintedAt: mint,
			IssuedAt: issued, ExpiresAt: issued.Add(ttl)}
	}
	for _, tc := range []struct {
		name       string
		claims     attempttoken.Claims
		now        time.Time
		ceiling    time.Duration
		currentKey bool
		want       lifecycle.Renewal
	}{
		{"FreshToken_NotRenewed", token(mint), mint.Add(15 * time.Second), ceiling, true, lifecycle.NotRenewed},
		{"JustUnderAQuarterSpent_NotRenewed", token(mint), mint.Add(ttl/4 - time.Millisecond), ceiling, true, lifecycle.NotRenewed},
		{"AQuarterSpent_Renewed", token(mint), mint.Add(ttl / 4), ceiling, true, lifecycle.Renewed},
		{"FreshTokenOfARetiredKey_Renewed", token(mint), mint.Add(15 * time.Second), ceiling, false, lifecycle.Renewed},
		// In the last quarter TTL before the ceiling every heartbeat renews,
		// so the last renewal is the last heartbeat before it.
		{"FreshTokenAQuarterTTLBeforeTheCeiling_Renewed", token(mint.Add(ceiling - ttl/4 - time.Second)),
			mint.Add(ceiling - ttl/4), ceiling, true, lifecycle.Renewed},
		{"FreshTokenJustBeforeTheCeiling_Renewed", token(mint.Add(ceiling - 2*time.Second)),
			mint.Add(ceiling - time.Millisecond), ceiling, true, lifecycle.Renewed},
		{"FreshTokenJustOverAQuarterTTLBeforeTheCeiling_NotRenewed", token(mint.Add(ceiling - ttl/2)),
			mint.Add(ceiling - ttl/4 - time.Millisecond), ceiling, true, lifecycle.NotRenewed},
		{"AtTheCeiling_Capped", token(mint.Add(ceiling - time.Second)), mint.Add(ceiling), ceiling, true, lifecycle.Capped},
		{"PastTheCeilingEvenWhenDue_Capped", token(mint.Add(ceiling - ttl/2)), mint.Add(ceiling + time.Second), ceiling, false, lifecycle.Capped},
		{"NoCeiling_FreshToken_NotRenewed", token(mint.Add(100 * ceiling)), mint.Add(100*ceiling + time.Second), 0, true, lifecycle.NotRenewed},
		{"NoCeiling_Due_Renewed", token(mint.Add(100 * ceiling)), mint.Add(100*ceiling + ttl/2), 0, true, lifecycle.Renewed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := renewalOf(tc.claims, tc.now, ttl, tc.ceiling, tc.currentKey); got != tc.want {
				t.Fatalf("renewalOf = %v, want %v", got, tc.want)
			}
		})
	}
}

package parked

import (
	"fmt"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/reap"
)

// act is what a verdict asks for.
type act int

const (
	actNone  act = iota // not this reaper's business (yet): no decision
	actDefer            // stale, but not provably dead: a decision, no write
	actMark             // stale and dead: a guarded mark
)

// verdict is judge's answer.
type verdict struct {
	act    act
	label  string
	detail string
}

// judge applies the two gates to one listed attempt at now. It is pure: the
// listing already applied the TTL, and judge applies it again so that the
// rule holds whatever listed the attempt.
//
//  1. stale: parked (ended_at set) strictly longer than ttl ago; otherwise
//     nothing is decided.
//  2. dead: unknown or unreadable liveness defers (parked_query_error),
//     anything alive defers (parked_process_alive), and only a positive
//     dead lets the mark go ahead (parked_expired).
func judge(c sdk.Candidate, now time.Time, ttl time.Duration, live reap.Answer) verdict {
	if c.EndedAt.IsZero() || now.Sub(c.EndedAt) <= ttl {
		return verdict{}
	}
	parked := fmt.Sprintf("parked in %s for %s (ttl %s)", c.State, now.Sub(c.EndedAt).Round(time.Second), ttl)
	switch {
	case live.Unknown():
		return verdict{act: actDefer, label: LabelQueryError,
			detail: parked + ", but its liveness is not known: " + live.Why()}
	case live.State == sdk.Alive:
		return verdict{act: actDefer, label: LabelProcessAlive,
			detail: parked + ", but something of it still runs: " + live.Why()}
	case live.State == sdk.Dead:
		return verdict{act: actMark, label: LabelExpired,
			detail: parked + " and nothing of it runs: " + live.Why()}
	}
	return verdict{act: actDefer, label: LabelQueryError,
		detail: parked + ", but the substrate answered " + string(live.State)}
}

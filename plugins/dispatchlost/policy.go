package dispatchlost

import (
	"fmt"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/reap"
)

type action int

const (
	actNone         action = iota // no rule applies: no decision
	actDefer                      // leave it, say why
	actMark                       // mark it
	actStopThenMark               // Lite: stop the orphaned group, then mark
)

type judgment struct {
	act    action
	label  string
	reason string // the mark's reason
	detail string
}

// overdue: the attempt carries a queued_at stamp older than the threshold.
// A row without the stamp is too poorly observed to judge at all.
func overdue(c sdk.Candidate, now time.Time, l ladder.Ladder) bool {
	return !c.QueuedAt.IsZero() && now.Sub(c.QueuedAt) > l.DispatchLost
}

// credentialMintedAt is when the attempt credential was minted: the time
// the runner recorded when it minted it (credential_minted_at), else the
// dispatch (queued_at), for rows of a runner that records none. A release
// clears both, so a re-offered attempt counts from its new dispatch.
func credentialMintedAt(c sdk.Candidate) time.Time {
	if !c.CredentialMintedAt.IsZero() {
		return c.CredentialMintedAt
	}
	return c.QueuedAt
}

// credentialLapse is when the attempt credential minted at dispatch runs out.
func credentialLapse(c sdk.Candidate, l ladder.Ladder) time.Time {
	return credentialMintedAt(c).Add(l.AttemptTokenTTL)
}

// nearStartExpiry: the credential minted at dispatch lapses within the
// start-expiry margin, so an agent that starts now would start with a
// credential about to be refused.
func nearStartExpiry(c sdk.Candidate, now time.Time, l ladder.Ladder) bool {
	return !credentialMintedAt(c).IsZero() && !now.Before(credentialLapse(c, l).Add(-ladder.StartExpiryMargin))
}

// judgeLite: the dispatch is lost only when the agent (and any task group)
// is provably gone; an orphaned group is stopped first.
func judgeLite(c sdk.Candidate, now time.Time, l ladder.Ladder, live reap.Answer) judgment {
	if !overdue(c, now, l) {
		return judgment{act: actNone}
	}
	queued := now.Sub(c.QueuedAt)
	switch {
	case live.Unknown():
		return judgment{act: actDefer, label: sdk.LabelDispatchLostProcessQueryErr, detail: live.Why()}
	case live.State == sdk.Alive && live.Orphan:
		return judgment{act: actStopThenMark, label: sdk.LabelDispatchLostOrphanStopped, reason: sdk.LabelDispatchLost,
			detail: fmt.Sprintf("queued for %s; agent dead, task group orphaned: stopping the group before marking", queued)}
	case live.State == sdk.Alive:
		return judgment{act: actDefer, label: sdk.LabelDispatchLostProcessAlive,
			detail: fmt.Sprintf("queued for %s, but %s", queued, live.Why())}
	}
	return judgment{act: actMark, label: sdk.LabelDispatchLost, reason: sdk.LabelDispatchLost,
		detail: fmt.Sprintf("queued for %s (threshold %s); agent gone", queued.Round(time.Millisecond), l.DispatchLost)}
}

// judgeKube: the dispatch is lost only when no pod of the attempt exists;
// a Pending or Running pod means it landed and defers, an unreadable one
// defers too. The exception is a pod still only Pending, read live, when
// the credential minted at dispatch is about to lapse: start_expired.
func judgeKube(c sdk.Candidate, now time.Time, l ladder.Ladder, live reap.Answer, startExpiry bool) judgment {
	if !overdue(c, now, l) {
		return judgment{act: actNone}
	}
	queued := now.Sub(c.QueuedAt)
	switch {
	case live.Unknown():
		return judgment{act: actDefer, label: sdk.LabelDispatchLostPodQueryErr, detail: live.Why()}
	case live.State == sdk.Alive && startExpiry && live.Live && live.Pending && nearStartExpiry(c, now, l):
		return judgment{act: actMark, label: sdk.LabelStartExpired, reason: sdk.LabelStartExpired,
			detail: fmt.Sprintf("pod still Pending %s after dispatch; its credential lapses at %s",
				queued, credentialLapse(c, l).UTC().Format(time.RFC3339))}
	case live.State == sdk.Alive:
		return judgment{act: actDefer, label: sdk.LabelDispatchLostPodAlive,
			detail: fmt.Sprintf("queued for %s, but the dispatch landed: %s", queued, live.Why())}
	}
	return judgment{act: actMark, label: sdk.LabelDispatchLost, reason: sdk.LabelDispatchLost,
		detail: fmt.Sprintf("queued for %s (threshold %s); no pod of the attempt", queued, l.DispatchLost)}
}

// needsLiveRead: on kube a cached answer is enough to defer, but a mark
// rests on an authoritative read: a pod read absent, or a pod that may be
// Pending near its credential's lapse (the cache cannot tell Pending from
// Running).
func needsLiveRead(c sdk.Candidate, now time.Time, l ladder.Ladder, cached reap.Answer, startExpiry bool) bool {
	if cached.Unknown() || !overdue(c, now, l) {
		return false
	}
	return cached.State == sdk.Dead || startExpiry && nearStartExpiry(c, now, l)
}

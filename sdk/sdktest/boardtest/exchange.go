package boardtest

import (
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// queuedMinted seeds a queued attempt whose credential was minted at
// minted (and, when exchanged is not zero, exchanged then).
func queuedMinted(f Fixture, runID, taskID string, minted, exchanged time.Time) sdk.Attempt {
	a := attempt(runID, taskID)
	f.Put(Row{Attempt: a, State: sdk.StateQueued, Executor: sdk.ExecutorKube, QueuedAt: minted,
		CredentialMintedAt: minted, CredentialExchangedAt: exchanged})
	return a
}

// exchangeCases: the exchange of an attempt's bootstrap credential (what a
// pod spec carries) for its working token is recorded once, before RUNNING;
// any other exchange changes nothing.
func exchangeCases() map[string]func(t *testing.T, f Fixture) {
	minted := at(-time.Minute)
	return map[string]func(t *testing.T, f Fixture){
		"FirstExchangeOfAQueuedAttemptIsRecorded": func(t *testing.T, f Fixture) {
			a := queuedMinted(f, "r", "t", minted, time.Time{})
			before := row(t, f, a)
			if got := f.ExchangeBootstrap(a, minted, T0()); got != "exchanged" {
				t.Fatalf("exchange: %s, want exchanged", got)
			}
			after := row(t, f, a)
			sameTime(t, "credential_exchanged_at", after.CredentialExchangedAt, T0())
			after.CredentialExchangedAt = time.Time{}
			if !sameRow(before, after) {
				t.Fatalf("the exchange wrote more than its stamp:\nbefore %+v\nafter  %+v", before, after)
			}
		},
		"SecondExchangeIsSpent_ChangesNothing": func(t *testing.T, f Fixture) {
			a := queuedMinted(f, "r", "t", minted, at(-30*time.Second))
			before := row(t, f, a)
			if got := f.ExchangeBootstrap(a, minted, T0()); got != "spent" {
				t.Fatalf("second exchange while queued: %s, want spent", got)
			}
			unchanged(t, f, a, before)
			f.Put(Row{Attempt: a, State: sdk.StateRunning, Executor: sdk.ExecutorKube, QueuedAt: minted,
				RunningAt: at(-20 * time.Second), CredentialMintedAt: minted, CredentialExchangedAt: at(-30 * time.Second)})
			before = row(t, f, a)
			if got := f.ExchangeBootstrap(a, minted, T0()); got != "spent" {
				t.Fatalf("second exchange while running: %s, want spent", got)
			}
			unchanged(t, f, a, before)
		},
		"ExchangeOfAnAttemptTheRowNoLongerHolds_MovedOn": func(t *testing.T, f Fixture) {
			a := queuedMinted(f, "r", "t", minted, time.Time{})
			next := a
			next.Epoch++
			f.Put(Row{Attempt: next, State: sdk.StateQueued, Executor: sdk.ExecutorKube, QueuedAt: minted,
				CredentialMintedAt: minted})
			before := row(t, f, next)
			if got := f.ExchangeBootstrap(a, minted, T0()); got != "moved_on" {
				t.Fatalf("exchange of the released epoch: %s, want moved_on", got)
			}
			unchanged(t, f, next, before)
		},
		"ExchangeOfARunningAttemptNeverExchanged_MovedOn": func(t *testing.T, f Fixture) {
			// A warm worker's attempt: handed its working token by the claim.
			a := running(f, "r", "t", at(-time.Minute), time.Time{})
			before := row(t, f, a)
			if got := f.ExchangeBootstrap(a, minted, T0()); got != "moved_on" {
				t.Fatalf("exchange of a running attempt: %s, want moved_on", got)
			}
			unchanged(t, f, a, before)
		},
		"ExchangeInAFinishedRun_MovedOn": func(t *testing.T, f Fixture) {
			f.PutRun(RunRow{RunID: "r", State: sdk.RunFailed, StartedAt: at(-time.Hour)})
			a := queuedMinted(f, "r", "t", minted, time.Time{})
			before := row(t, f, a)
			if got := f.ExchangeBootstrap(a, minted, T0()); got != "moved_on" {
				t.Fatalf("exchange in a finished run: %s, want moved_on", got)
			}
			unchanged(t, f, a, before)
		},
		"ExchangeOfAnEarlierMint_MovedOn": func(t *testing.T, f Fixture) {
			a := queuedMinted(f, "r", "t", minted, time.Time{})
			before := row(t, f, a)
			if got := f.ExchangeBootstrap(a, minted.Add(-time.Millisecond), T0()); got != "moved_on" {
				t.Fatalf("exchange of another mint: %s, want moved_on", got)
			}
			unchanged(t, f, a, before)
		},
		"MintComparedToTheMillisecondTheTokenCarries": func(t *testing.T, f Fixture) {
			a := queuedMinted(f, "r", "t", minted.Add(700*time.Microsecond), time.Time{})
			if got := f.ExchangeBootstrap(a, minted, T0()); got != "exchanged" {
				t.Fatalf("exchange of the same mint, truncated to the millisecond: %s, want exchanged", got)
			}
		},
		"NoRecordedMintStillExchangesOnce": func(t *testing.T, f Fixture) {
			a := queuedMinted(f, "r", "t", time.Time{}, time.Time{})
			if got := f.ExchangeBootstrap(a, minted, T0()); got != "exchanged" {
				t.Fatalf("first exchange: %s, want exchanged", got)
			}
			if got := f.ExchangeBootstrap(a, minted, T0().Add(time.Second)); got != "spent" {
				t.Fatalf("second exchange: %s, want spent", got)
			}
		},
	}
}

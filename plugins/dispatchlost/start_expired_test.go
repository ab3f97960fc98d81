package dispatchlost

import (
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/reap"
)

// start_expired counts from the credential's real mint time when the
// runner recorded one, and from the dispatch (queued_at) otherwise.
func TestStartExpiredMeasuresFromTheRecordedMintTime(t *testing.T) {
	l := ladder.Defaults()
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	pending := reap.Answer{AttemptLiveness: sdk.AttemptLiveness{State: sdk.Alive, Pending: true}, Live: true}
	a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}
	cases := []struct {
		name   string
		queued time.Duration // ago
		minted time.Duration // ago; 0: none recorded
		want   string
	}{
		{"NoMintRecorded_QueuedEightMinutesAgo_StartExpired", 8 * time.Minute, 0, sdk.LabelStartExpired},
		{"MintedLaterThanQueued_NotYetNearLapse_Defers", 8 * time.Minute, 5 * time.Minute, sdk.LabelDispatchLostPodAlive},
		{"MintedEightMinutesAgo_StartExpired", 8 * time.Minute, 8 * time.Minute, sdk.LabelStartExpired},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := sdk.Candidate{Attempt: a, State: sdk.StateQueued, Executor: sdk.ExecutorKube, QueuedAt: now.Add(-tc.queued)}
			if tc.minted > 0 {
				c.CredentialMintedAt = now.Add(-tc.minted)
			}
			if j := judgeKube(c, now, l, pending, true); j.label != tc.want {
				t.Fatalf("label %q, want %q (%s)", j.label, tc.want, j.detail)
			}
		})
	}
}

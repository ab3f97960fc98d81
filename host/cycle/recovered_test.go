package cycle_test

import (
	"context"
	"slices"
	"testing"
	"time"

	pgboard "github.com/dexaflow/reaper/board"
	hostaudit "github.com/dexaflow/reaper/host/audit"
	"github.com/dexaflow/reaper/host/cycle"
	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/testkit/byhand"
)

// finder is an audit that also finds the writes a dead leader left on the
// board without their decision.
type finder struct {
	audit
	marks    []pgboard.UnauditedMark
	declared []string // the reasons the loop last searched for beside the built-in ones
}

func (f *finder) UnauditedMarks(_ context.Context, _ time.Time, declared ...string) ([]pgboard.UnauditedMark, error) {
	f.declared = declared
	return f.marks, nil
}

// A write the host audits from the board is filed under the reaper whose
// Info declares its failure reason, a reaper the host has never heard of
// included; a reason no configured reaper declares is filed under "host".
func TestRecoveredMarkIsFiledUnderTheReaperDeclaringItsReason(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		reason string
		want   string
	}{
		"NewReasonOfAThirdPartyReaper":     {reason: "parked_expired", want: "parked"},
		"ReasonOfABuiltInReaper":           {reason: sdk.LabelAgentLost, want: "agentlost"},
		"SecondReasonAReaperDeclares":      {reason: sdk.LabelCredentialCeiling, want: "agentlost"},
		"ReasonOfAReaperNotConfigured":     {reason: sdk.LabelPodLost, want: "host"},
		"ReasonNoReaperDeclares_FallsBack": {reason: "unheard_of", want: "host"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a := sdk.Attempt{RunID: "run", TaskID: "task", Try: 1}
			aud := &finder{marks: []pgboard.UnauditedMark{{Attempt: a, Reason: tc.reason,
				Message: tc.reason + ": left by a dead leader", At: t0.Add(-time.Minute)}}}
			reapers := []cycle.Reaper{
				{Name: "agentlost", Plugin: &byhand.Static[sdk.Reaper]{V: &reaper{name: "agentlost"}},
					MarkReasons: []string{sdk.LabelAgentLost, sdk.LabelCredentialCeiling}},
				{Name: "parked", Plugin: &byhand.Static[sdk.Reaper]{V: &reaper{name: "parked"}},
					MarkReasons: []string{"parked_expired"}},
			}
			twoSettledCycles(aud, reapers)
			var recovered []sdk.Decision
			for _, d := range aud.rows {
				if d.Evidence[hostaudit.EvRecovered] == "board" {
					recovered = append(recovered, d)
				}
			}
			// The board is searched for the third party's own word beside
			// the built-in ones; agentlost's credential_ceiling (a warm
			// worker's watchdog reports it too) is not.
			if !slices.Equal(aud.declared, []string{"parked_expired"}) {
				t.Errorf("the board was searched for %q beside the built-in reasons, want [parked_expired]", aud.declared)
			}
			if len(recovered) != 1 || recovered[0].Reaper != tc.want || recovered[0].Label != tc.reason ||
				recovered[0].Attempt != a || !recovered[0].Applied {
				t.Fatalf("recovered %+v, want one applied %s decision filed under %q", recovered, tc.reason, tc.want)
			}
		})
	}
}

// Only a plugin's own word is searched for on the board: a built-in mark
// reason is searched anyway, and a label or reason the host writes itself,
// or a word no failure reason can be, never (the host would audit as the
// plugin's marks rows it never wrote).
func TestDeclaredMarkReasonsSearchedOnTheBoard(t *testing.T) {
	t.Parallel()
	aud := &finder{}
	reapers := []cycle.Reaper{{Name: "hostile", Plugin: &byhand.Static[sdk.Reaper]{V: &reaper{name: "hostile"}},
		MarkReasons: []string{"its_own_word", sdk.LabelAgentLost, sdk.LabelReconcileSettled, sdk.ReasonPodDisrupted,
			sdk.LabelCredentialCeiling, "Not A Reason", "", "its_own_word"}}}
	twoSettledCycles(aud, reapers)
	if !slices.Equal(aud.declared, []string{"its_own_word"}) {
		t.Fatalf("searched for %q beside the built-in reasons, want only [its_own_word]", aud.declared)
	}
}

// twoSettledCycles runs two cycles of a settled leader's loop over the
// reapers, auditing through aud: the first gate's opening recovers marks.
func twoSettledCycles(aud *finder, reapers []cycle.Reaper) {
	clk := clock.NewFake(t0)
	settled := byhand.NewLead(leader.Status{Leading: true, Term: 1, Since: t0.Add(-ladder.Defaults().SettlingGrace)})
	loop := cycle.New(cycle.Config{Ladder: ladder.Defaults(), Edition: ladder.EditionLite, Clock: clk},
		settled, &board{}, aud, &byhand.Static[sdk.Substrate]{V: &substrate{synced: true}}, reapers)
	for range 2 {
		loop.RunOnce(context.Background())
		clk.Advance(ladder.Defaults().MaintenanceInterval)
	}
}

package audit_test

import (
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/host/audit"
	"github.com/dexaflow/reaper/sdk"
)

func TestJudge(t *testing.T) {
	t.Parallel()
	at := time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)
	horizon := audit.ShadowHorizonDefault
	running := board.AttemptTruth{Found: true, State: sdk.StateRunning, RunningAt: at.Add(-20 * time.Minute),
		LastHeartbeatAt: at.Add(-10 * time.Minute), RunState: sdk.RunRunning}
	with := func(f func(*board.AttemptTruth)) board.AttemptTruth {
		tr := running
		f(&tr)
		return tr
	}
	dry := func(tr board.AttemptTruth) board.ShadowDecision {
		return board.ShadowDecision{AuditRecord: board.AuditRecord{At: at,
			Decision: sdk.Decision{Reaper: "agentlost", Label: sdk.LabelAgentLost, DryRun: true}}, Truth: tr}
	}
	applied := func(policy string, tr board.AttemptTruth) board.ShadowDecision {
		d := dry(tr)
		d.DryRun, d.Applied, d.Evidence = false, true, map[string]string{"policy": policy, "edition": "kube"}
		return d
	}
	marked := func(tr *board.AttemptTruth) {
		tr.State, tr.LastFailureKind, tr.FailureReason = sdk.StateFailed, sdk.FailureInfra, sdk.LabelAgentLost
		tr.InfraMarkedAt, tr.EndedAt = at.Add(time.Minute), at.Add(time.Minute)
	}
	for name, tc := range map[string]struct {
		d    board.ShadowDecision
		now  time.Time
		want string // "" pending
		by   string
	}{
		"DryRun_HeartbeatAfter_WouldHaveKilledLiveWork": {d: dry(with(func(tr *board.AttemptTruth) {
			tr.LastHeartbeatAt = at.Add(time.Second)
		})), want: sdk.VerdictWouldHaveKilledLiveWork, by: "heartbeat"},
		"DryRun_RunningAfter_WouldHaveKilledLiveWork": {d: dry(with(func(tr *board.AttemptTruth) {
			tr.State, tr.RunningAt, tr.LastHeartbeatAt = sdk.StateRunning, at.Add(time.Minute), time.Time{}
		})), want: sdk.VerdictWouldHaveKilledLiveWork, by: "running"},
		"DryRun_SucceededWhenever_WouldHaveKilledLiveWork": {d: dry(with(func(tr *board.AttemptTruth) {
			tr.State, tr.EndedAt = sdk.StateSuccess, at.Add(-time.Minute)
		})), want: sdk.VerdictWouldHaveKilledLiveWork, by: "success"},
		"DryRun_TaskFailureReportedAfter_WouldHaveKilledLiveWork": {d: dry(with(func(tr *board.AttemptTruth) {
			tr.State, tr.LastFailureKind, tr.EndedAt = sdk.StateUpForRetry, sdk.FailureTask, at.Add(time.Minute)
		})), want: sdk.VerdictWouldHaveKilledLiveWork, by: "outcome"},
		"DryRun_MarkedByAnotherPath_Right": {d: dry(with(marked)), want: sdk.VerdictRight, by: "mark"},
		"DryRun_CredentialCeiling_Right": {d: dry(with(func(tr *board.AttemptTruth) {
			tr.State, tr.LastFailureKind, tr.FailureReason, tr.EndedAt = sdk.StateFailed, sdk.FailureTask,
				sdk.LabelCredentialCeiling, at.Add(time.Hour)
		})), want: sdk.VerdictRight, by: "ceiling"},
		"DryRun_RunFailed_Right": {d: dry(with(func(tr *board.AttemptTruth) {
			tr.RunState, tr.RunEndedAt = sdk.RunFailed, at.Add(time.Hour)
		})), want: sdk.VerdictRight, by: "run_failed"},
		"DryRun_NoTruthInsideTheHorizon_Pending": {d: dry(running), now: at.Add(horizon - time.Second)},
		"DryRun_NoTruthAtTheHorizon_Unresolved": {d: dry(running), now: at.Add(horizon),
			want: sdk.VerdictUnresolved, by: "horizon"},
		"DryRun_ReleasedWithoutTruth_UnresolvedAtOnce": {d: dry(with(func(tr *board.AttemptTruth) {
			tr.Released, tr.State, tr.ReleasedAt = true, sdk.StateQueued, at.Add(time.Minute)
		})), want: sdk.VerdictUnresolved, by: "released"},
		"AttemptGone_Unresolved": {d: dry(board.AttemptTruth{}), want: sdk.VerdictUnresolved, by: "gone"},
		"Provisional_OverriddenByDurableSuccess_WouldHaveKilledLiveWork": {d: applied("replace", with(func(tr *board.AttemptTruth) {
			tr.State, tr.EndedAt = sdk.StateSuccess, at.Add(-30*time.Second) // the container's own end
		})), want: sdk.VerdictWouldHaveKilledLiveWork, by: "override"},
		"Provisional_OwnMarkIsNoEvidence_Pending": {d: applied("replace", with(marked)), now: at.Add(time.Hour)},
		"Provisional_Confirmed_Right": {d: applied("replace", with(func(tr *board.AttemptTruth) {
			marked(tr)
			tr.InfraConfirmedAt = at.Add(time.Minute)
		})), want: sdk.VerdictRight, by: "confirmed"},
		"Held_ReleasedByOperatorUnconfirmed_Unresolved": {d: applied("hold", with(func(tr *board.AttemptTruth) {
			marked(tr)
			tr.Released, tr.ReleasedAt = true, at.Add(time.Hour)
		})), want: sdk.VerdictUnresolved, by: "released"},
	} {
		t.Run(name, func(t *testing.T) {
			now := tc.now
			if now.IsZero() {
				now = at.Add(time.Hour)
			}
			got, ev, ok := audit.Judge(tc.d, now, horizon)
			if tc.want == "" {
				if ok {
					t.Fatalf("scored %s (%v), want pending", got, ev)
				}
				return
			}
			if !ok || got != tc.want || ev[audit.VevBy] != tc.by {
				t.Fatalf("verdict %q by %q (ok=%v, %v), want %q by %q", got, ev[audit.VevBy], ok, ev, tc.want, tc.by)
			}
		})
	}
}

package agentlost

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/reap"
	"github.com/dexaflow/reaper/sdk/sdktest"
)

type bundle = sdktest.Rig[*Reaper]

func setup(t testing.TB, edition string, values sdk.Values) *bundle {
	return sdktest.NewRig(t, edition, New(nil), values)
}

const (
	failed  = sdk.StateFailed
	running = sdk.StateRunning
)

func wantNoStop(t *testing.T, b *bundle, _ sdk.Attempt, _ sdktest.Decisions) {
	t.Helper()
	if n := len(b.H.Exec.Stops()); n != 0 {
		t.Fatalf("%d stops, want none", n)
	}
}

func TestLiteSilence(t *testing.T) {
	t.Parallel()
	sdktest.RunRules(t, setup, []sdktest.Rule[*Reaper]{
		// The plugin's mark is provisional: a reaper does not confirm its
		// own marks (the host refuses it). On Lite the host confirms it as
		// made when the substrate reads the attempt dead.
		{Name: "SilentPastThresholdAndDead_AgentLostProvisional", Arrange: func(b *bundle) sdk.Attempt {
			return b.H.Running("r", "t", 10*time.Minute, 2*time.Minute)
		}, Want: sdk.LabelAgentLost, WantState: failed, Check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
			row := b.H.Board.Row(a)
			if row.LastFailureKind != sdk.FailureInfra || !row.InfraConfirmedAt.IsZero() || row.Held || row.MarkReason != sdk.LabelAgentLost {
				t.Fatalf("row %+v", row)
			}
			if !ds[0].Applied || len(b.H.Exec.Teardowns()) != 0 {
				t.Fatalf("applied=%v teardowns=%d", ds[0].Applied, len(b.H.Exec.Teardowns()))
			}
		}},
		{Name: "SilenceUnderThreshold_NotJudged", Arrange: func(b *bundle) sdk.Attempt {
			return b.H.Running("r", "t", 10*time.Minute, 89*time.Second)
		}, Want: "", WantState: running},
		{Name: "SilenceExactlyAtThreshold_NotJudged", Arrange: func(b *bundle) sdk.Attempt {
			return b.H.Running("r", "t", 10*time.Minute, 90*time.Second)
		}, Want: "", WantState: running},
		{Name: "SilentAndAgentAlive_Defers", Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.Running("r", "t", 10*time.Minute, 2*time.Minute)
			b.H.Exec.Alive(a)
			return a
		}, Want: sdk.LabelAgentLostProcessAlive, WantState: running},
		{Name: "SilentAndLivenessUnknown_Defers", Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.Running("r", "t", 10*time.Minute, 2*time.Minute)
			b.H.Exec.Unknown(a, "probe: EPERM")
			return a
		}, Want: sdk.LabelAgentLostProcessQueryErr, WantState: running},
		{Name: "LivenessCallFails_Defers", Arrange: func(b *bundle) sdk.Attempt {
			b.H.Exec.FailLiveness(errors.New("record dir unreadable"))
			return b.H.Running("r", "t", 10*time.Minute, 2*time.Minute)
		}, Want: sdk.LabelAgentLostProcessQueryErr, WantState: running},
		{Name: "AgentDeadGroupUnverified_DefersAsAlive", Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.Running("r", "t", 10*time.Minute, 2*time.Minute)
			b.H.Exec.Set(a, sdk.AttemptLiveness{State: sdk.Alive, Agent: sdk.Dead, Group: sdk.Alive, Detail: "leader start time unreadable"})
			return a
		}, Want: sdk.LabelAgentLostProcessAlive, WantState: running, Check: wantNoStop},
		{Name: "OrphanedGroup_StoppedThenMarked", Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.Running("r", "t", 10*time.Minute, 2*time.Minute)
			b.H.Exec.Orphaned(a)
			b.H.Board.OnMark(func(sdk.Mark) {
				if len(b.H.Exec.Stops()) != 1 {
					panic("marked before the orphaned group was stopped")
				}
			})
			return a
		}, Want: sdk.LabelAgentLostOrphanStopped, WantState: failed, Check: func(t *testing.T, b *bundle, a sdk.Attempt, _ sdktest.Decisions) {
			stops := b.H.Exec.Stops()
			if len(stops) != 1 || stops[0].Attempt != a || stops[0].Reason != sdk.StopOrphan {
				t.Fatalf("stops %+v", stops)
			}
			if row := b.H.Board.Row(a); row.MarkReason != sdk.LabelAgentLost || row.LastFailureKind != sdk.FailureInfra {
				t.Fatalf("row %+v", row)
			}
		}},
		{Name: "OrphanStopFails_Defers", Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.Running("r", "t", 10*time.Minute, 2*time.Minute)
			b.H.Exec.Orphaned(a)
			b.H.Exec.ScriptStop(a, sdk.StopResult{}, errors.New("kill: EPERM"))
			return a
		}, Want: sdk.LabelAgentLostOrphanStopErr, WantState: running},
		{Name: "OrphanStopNotConfirmedGone_Defers", Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.Running("r", "t", 10*time.Minute, 2*time.Minute)
			b.H.Exec.Orphaned(a)
			b.H.Exec.ScriptStop(a, sdk.StopResult{Stopped: false, Detail: "group survived SIGKILL"}, nil)
			return a
		}, Want: sdk.LabelAgentLostOrphanStopErr, WantState: running},
	})
}

func TestLiteNeverHeartbeated(t *testing.T) {
	t.Parallel()
	sdktest.RunRules(t, setup, []sdktest.Rule[*Reaper]{
		{Name: "NeverHeartbeatedAndDead_AgentLostNeverHeartbeated", Arrange: func(b *bundle) sdk.Attempt {
			return b.H.RunningNeverHeartbeated("r", "t", 2*time.Minute)
		}, Want: sdk.LabelAgentLostNeverHeartbeated, WantState: failed, Check: func(t *testing.T, b *bundle, a sdk.Attempt, _ sdktest.Decisions) {
			row := b.H.Board.Row(a)
			if row.MarkReason != sdk.LabelAgentLost || row.LastFailureKind != sdk.FailureInfra || !row.InfraConfirmedAt.IsZero() {
				t.Fatalf("row %+v", row)
			}
			if m := b.H.Board.Marks()[0]; !m.RequireNoHeartbeat {
				t.Fatalf("mark does not require the absence of a heartbeat: %+v", m)
			}
		}},
		{Name: "NeverHeartbeatedWithinThreshold_NotJudged", Arrange: func(b *bundle) sdk.Attempt {
			return b.H.RunningNeverHeartbeated("r", "t", 80*time.Second)
		}, Want: "", WantState: running},
		{Name: "NeverHeartbeatedAndAgentAlive_Defers", Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.RunningNeverHeartbeated("r", "t", 2*time.Minute)
			b.H.Exec.Alive(a)
			return a
		}, Want: sdk.LabelAgentLostNeverHeartbeatedProcessAlive, WantState: running},
		{Name: "NeverHeartbeatedAndGroupOrphaned_WaitedForNeverStopped", Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.RunningNeverHeartbeated("r", "t", 2*time.Minute)
			b.H.Exec.Orphaned(a)
			return a
		}, Want: sdk.LabelAgentLostNeverHeartbeatedProcessAlive, WantState: running, Check: wantNoStop},
		{Name: "NeverHeartbeatedAndLivenessUnknown_Defers", Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.RunningNeverHeartbeated("r", "t", 2*time.Minute)
			b.H.Exec.Unknown(a, "stat record: EIO")
			return a
		}, Want: sdk.LabelAgentLostNeverHeartbeatedProcessQueryErr, WantState: running},
		{Name: "FirstHeartbeatBetweenListAndMark_Noop", Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.RunningNeverHeartbeated("r", "t", 2*time.Minute)
			b.H.Board.OnMark(func(m sdk.Mark) { b.H.Board.Heartbeat(m.RunID, m.TaskID, b.H.Now()) })
			return a
		}, Want: sdk.LabelMarkNoop, WantState: running},
		{Name: "KubeNeverHeartbeated_LeftAlone", Edition: ladder.EditionKube, Arrange: func(b *bundle) sdk.Attempt {
			return b.H.RunningNeverHeartbeated("r", "t", 30*time.Minute)
		}, Want: "", WantState: running},
	})
}

func TestCredentialCeiling(t *testing.T) {
	t.Parallel()
	// The default ceiling is 1h and the heartbeat 15s: the bound is a last
	// heartbeat at least 59m30s into running.
	lastBeatAt := func(b *bundle, into, silentFor time.Duration) sdk.Attempt {
		now := b.H.Now()
		hb := now.Add(-silentFor)
		return b.H.Board.PutRunning("r", "t", hb.Add(-into), hb)
	}
	taskFailure := func(t *testing.T, b *bundle, a sdk.Attempt, _ sdktest.Decisions) {
		t.Helper()
		row := b.H.Board.Row(a)
		if row.LastFailureKind != sdk.FailureTask || !row.InfraMarkedAt.IsZero() || !row.InfraConfirmedAt.IsZero() || row.MarkReason != sdk.LabelCredentialCeiling {
			t.Fatalf("row %+v", row)
		}
		// Operators search for this sentence: it is the specification's, word for word.
		if row.ErrorMessage != "credential_ceiling: attempt outlived auth.max_attempt_credential_lifetime" {
			t.Fatalf("error_message %q", row.ErrorMessage)
		}
		if m := b.H.Board.Marks()[0]; m.Kind != sdk.MarkTask || m.Confirm || m.Hold {
			t.Fatalf("mark %+v", m)
		}
	}
	sdktest.RunRules(t, setup, []sdktest.Rule[*Reaper]{
		{Name: "CeilingSilenceAfterCeilingMinusTwoHeartbeats_TaskFailure", Arrange: func(b *bundle) sdk.Attempt {
			return lastBeatAt(b, 59*time.Minute+30*time.Second, 3*time.Minute)
		}, Want: sdk.LabelCredentialCeiling, WantState: failed, Check: taskFailure},
		{Name: "SilenceBeforeCeiling_IsAgentLost", Arrange: func(b *bundle) sdk.Attempt {
			// Went quiet one second before the bound; reaped long after the ceiling.
			return lastBeatAt(b, 59*time.Minute+29*time.Second, 20*time.Minute)
		}, Want: sdk.LabelAgentLost, WantState: failed},
		{Name: "KubeCeilingSilence_TaskFailureNeverProvisional", Edition: ladder.EditionKube, Arrange: func(b *bundle) sdk.Attempt {
			return lastBeatAt(b, 61*time.Minute, 2*time.Minute)
		}, Want: sdk.LabelCredentialCeiling, WantState: failed, Check: taskFailure},
		{Name: "HoldPolicyDoesNotHoldTaskFailure", Values: sdk.Values{"policy": "hold"}, Arrange: func(b *bundle) sdk.Attempt {
			return lastBeatAt(b, 60*time.Minute, 2*time.Minute)
		}, Want: sdk.LabelCredentialCeiling, WantState: failed, Check: taskFailure},
		{Name: "CeilingDisabledWhenNonPositive", Arrange: func(b *bundle) sdk.Attempt {
			b.H.Ladder.CredentialCeiling = 0
			return lastBeatAt(b, 2*time.Hour, 2*time.Minute)
		}, Want: sdk.LabelAgentLost, WantState: failed},
		{Name: "CeilingDisabledWhenNegative_AliveNeverEnded", Arrange: func(b *bundle) sdk.Attempt {
			b.H.Ladder.CredentialCeiling = -time.Second
			a := b.H.Running("r", "t", 5*time.Hour, 5*time.Second)
			b.H.Exec.Alive(a)
			return a
		}, Want: "", WantState: running, Check: wantNoStop},
		{Name: "LitePastCeilingAndAlive_MarkedThenStoppedThenLogged", Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.Running("r", "t", 61*time.Minute, 5*time.Second) // healthy, heartbeating
			b.H.Exec.Alive(a)
			b.H.Board.OnMark(func(sdk.Mark) {
				if len(b.H.Exec.Stops()) != 0 {
					panic("stopped before the guarded mark")
				}
			})
			return a
		}, Want: sdk.LabelCredentialCeiling, WantState: failed, Check: func(t *testing.T, b *bundle, a sdk.Attempt, _ sdktest.Decisions) {
			taskFailure(t, b, a, nil)
			m := b.H.Board.Marks()[0]
			if !m.HeartbeatBefore.IsZero() || m.RequireNoHeartbeat || len(m.FromStates) != 1 || m.FromStates[0] != running {
				t.Fatalf("mark guard %+v", m)
			}
			stops := b.H.Exec.Stops()
			if len(stops) != 1 || stops[0].Reason != sdk.StopCredentialCeiling {
				t.Fatalf("stops %+v", stops)
			}
			log := b.H.Board.Log(a)
			if len(log) == 0 || log[len(log)-1] != KilledLine {
				t.Fatalf("try log %q", log)
			}
		}},
		{Name: "LitePastCeilingOrphaned_MarkedThenStopped", Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.Running("r", "t", 61*time.Minute, 5*time.Second)
			b.H.Exec.Orphaned(a)
			return a
		}, Want: sdk.LabelCredentialCeiling, WantState: failed},
		{Name: "LitePastCeilingStopFails_MarkStaysNoKillLine", Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.Running("r", "t", 61*time.Minute, 5*time.Second)
			b.H.Exec.Alive(a)
			b.H.Exec.ScriptStop(a, sdk.StopResult{}, errors.New("group leader start time changed"))
			return a
		}, Want: sdk.LabelCredentialCeiling, WantState: failed, Check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
			if log := b.H.Board.Log(a); len(log) != 0 {
				t.Fatalf("try log %q", log)
			}
			if !strings.HasPrefix(ds[0].Evidence[reap.EvStop], "error") {
				t.Fatalf("evidence %v", ds[0].Evidence)
			}
		}},
		{Name: "LitePastCeilingAgentReportedFirst_NoopNoStop", Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.Running("r", "t", 61*time.Minute, 5*time.Second)
			b.H.Exec.Alive(a)
			b.H.Board.OnMark(func(m sdk.Mark) {
				b.H.Board.Update(m.RunID, m.TaskID, func(ti *sdktest.TaskInstance) { ti.State = sdk.StateSuccess })
			})
			return a
		}, Want: sdk.LabelMarkNoop, WantState: sdk.StateSuccess, Check: wantNoStop},
		{Name: "LitePastCeilingLivenessUnknown_Defers", Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.Running("r", "t", 61*time.Minute, 5*time.Second)
			b.H.Exec.Unknown(a, "probe error")
			return a
		}, Want: sdk.LabelAgentLostProcessQueryErr, WantState: running},
		{Name: "LitePastCeilingDeadRecentlyQuiet_WaitsForSilenceRule", Arrange: func(b *bundle) sdk.Attempt {
			return b.H.Running("r", "t", 61*time.Minute, 30*time.Second)
		}, Want: "", WantState: running},
		{Name: "LitePastCeilingSilentAndAlive_OneDecision", Arrange: func(b *bundle) sdk.Attempt {
			// Listed by the silence and the ceiling listings alike.
			a := b.H.Running("r", "t", 90*time.Minute, 10*time.Minute)
			b.H.Exec.Alive(a)
			return a
		}, Want: sdk.LabelCredentialCeiling, WantState: failed},
	})
}

func TestGuards(t *testing.T) {
	t.Parallel()
	noopReason := func(want string) func(*testing.T, *bundle, sdk.Attempt, sdktest.Decisions) {
		return func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
			t.Helper()
			d := ds.For(a)[0]
			if d.Applied || d.Evidence[reap.EvNoopReason] != want || d.Evidence[reap.EvMark] != sdk.LabelAgentLost {
				t.Fatalf("decision %+v", d)
			}
			if len(b.H.Exec.Teardowns()) != 0 {
				t.Fatal("a no-op mark was torn down")
			}
		}
	}
	silentDead := func(b *bundle) sdk.Attempt { return b.H.Running("r", "t", 10*time.Minute, 2*time.Minute) }
	sdktest.RunRules(t, setup, []sdktest.Rule[*Reaper]{
		{Name: "FreshHeartbeatBetweenListAndMark_Noop", Arrange: func(b *bundle) sdk.Attempt {
			a := silentDead(b)
			b.H.Board.OnMark(func(m sdk.Mark) { b.H.Board.Heartbeat(m.RunID, m.TaskID, b.H.Now()) })
			return a
		}, Want: sdk.LabelMarkNoop, WantState: running, Check: noopReason(sdk.NoopHeartbeated)},
		{Name: "KubeFreshHeartbeatBetweenListAndMark_NoopNoTeardown", Edition: ladder.EditionKube, Arrange: func(b *bundle) sdk.Attempt {
			a := silentDead(b)
			b.H.Board.OnMark(func(m sdk.Mark) { b.H.Board.Heartbeat(m.RunID, m.TaskID, b.H.Now()) })
			return a
		}, Want: sdk.LabelMarkNoop, WantState: running, Check: noopReason(sdk.NoopHeartbeated)},
		{Name: "ReplacedBetweenListAndMark_NewAttemptUntouched", Arrange: func(b *bundle) sdk.Attempt {
			a := silentDead(b)
			b.H.Board.OnMark(func(m sdk.Mark) { b.H.Board.Replace(m.RunID, m.TaskID, false, running, b.H.Now()) })
			return a
		}, Want: sdk.LabelMarkNoop, WantState: running, Check: noopReason(sdk.NoopMovedOn)},
		{Name: "DeposedTerm_Noop", Arrange: func(b *bundle) sdk.Attempt {
			b.H.Board.SetTerm(2)
			return silentDead(b)
		}, Want: sdk.LabelMarkNoop, WantState: running, Check: noopReason(sdk.NoopDeposed)},
		{Name: "HoldPolicySetsHold", Values: sdk.Values{"policy": "hold"}, Arrange: silentDead,
			Want: sdk.LabelAgentLost, WantState: failed, Check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
				if m := b.H.Board.Marks()[0]; !m.Hold || !b.H.Board.Row(a).Held || ds[0].Evidence[reap.EvPolicy] != "hold" {
					t.Fatalf("mark %+v", m)
				}
			}},
		{Name: "ReplacePolicyByDefault", Arrange: silentDead, Want: sdk.LabelAgentLost, WantState: failed,
			Check: func(t *testing.T, b *bundle, a sdk.Attempt, _ sdktest.Decisions) {
				if m := b.H.Board.Marks()[0]; m.Hold {
					t.Fatalf("mark %+v", m)
				}
			}},
		{Name: "EvidenceCarriesAgeLivenessTermThreshold", Arrange: silentDead, Want: sdk.LabelAgentLost, WantState: failed,
			Check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
				ev := ds[0].Evidence
				for k, want := range map[string]string{
					reap.EvHeartbeatAge: "2m0s", reap.EvLiveness: "dead", reap.EvTerm: "1",
					reap.EvThreshold: "1m30s", reap.EvSignal: reap.SignalPositive, reap.EvRunningAge: "10m0s",
				} {
					if ev[k] != want {
						t.Fatalf("evidence %s=%q, want %q (%v)", k, ev[k], want, ev)
					}
				}
				if ds[0].Reaper != Name {
					t.Fatalf("reaper %q", ds[0].Reaper)
				}
			}},
	})
}

func TestKube(t *testing.T) {
	t.Parallel()
	kube := ladder.EditionKube
	silent := func(b *bundle) sdk.Attempt { return b.H.Running("r", "t", 10*time.Minute, 2*time.Minute) }
	sdktest.RunRules(t, setup, []sdktest.Rule[*Reaper]{
		{Name: "KubeMarkIsProvisional_ThenPodTornDown", Edition: kube, Arrange: silent,
			Want: sdk.LabelAgentLost, WantState: failed, Check: func(t *testing.T, b *bundle, a sdk.Attempt, _ sdktest.Decisions) {
				if m := b.H.Board.Marks()[0]; m.Confirm {
					t.Fatalf("kube mark confirmed: %+v", m)
				}
				if row := b.H.Board.Row(a); !row.InfraConfirmedAt.IsZero() || !row.Live() {
					t.Fatalf("row %+v", row)
				}
				tds := b.H.Exec.Teardowns()
				if len(tds) != 1 || tds[0].Attempt == nil || *tds[0].Attempt != a || tds[0].Reason != sdk.LabelAgentLost || tds[0].Term != 1 {
					t.Fatalf("teardowns %+v", tds)
				}
			}},
		{Name: "KubeTeardownFails_PodDeleteErrorMarkStays", Edition: kube, Arrange: func(b *bundle) sdk.Attempt {
			a := silent(b)
			b.H.Exec.ScriptTeardown(a, nil, errors.New("apiserver unavailable"))
			return a
		}, Want: sdk.LabelAgentLost + "," + sdk.LabelAgentLostPodDeleteErr, WantState: failed},
		{Name: "KubeTeardownObjectError_PodDeleteError", Edition: kube, Arrange: func(b *bundle) sdk.Attempt {
			a := silent(b)
			b.H.Exec.ScriptTeardown(a, []sdk.TeardownOutcome{{Object: "pod/x", Action: sdk.TeardownNothing, Error: "forbidden"}}, nil)
			return a
		}, Want: sdk.LabelAgentLost + "," + sdk.LabelAgentLostPodDeleteErr, WantState: failed},
		{Name: "KubeDeleteFallback_Recorded", Edition: kube, Arrange: func(b *bundle) sdk.Attempt {
			a := silent(b)
			b.H.Exec.ScriptTeardown(a, []sdk.TeardownOutcome{{Object: "pod/x", Action: sdk.TeardownDeleteFallback}}, nil)
			return a
		}, Want: sdk.LabelAgentLost + "," + sdk.LabelTeardownDeleteFallback, WantState: failed},
		{Name: "KubeWarmAttempt_NeverTornDown", Edition: kube, Arrange: func(b *bundle) sdk.Attempt {
			now := b.H.Now()
			return b.H.Board.Put(sdktest.TaskInstance{RunID: "r", TaskID: "t", State: running, Executor: sdk.ExecutorWarm,
				RunningAt: now.Add(-10 * time.Minute), LastHeartbeatAt: now.Add(-2 * time.Minute), WarmWorker: "warm-0"})
		}, Want: sdk.LabelAgentLost, WantState: failed, Check: func(t *testing.T, b *bundle, _ sdk.Attempt, _ sdktest.Decisions) {
			if n := len(b.H.Exec.Teardowns()); n != 0 {
				t.Fatalf("%d teardowns of a warm attempt", n)
			}
		}},
		{Name: "KubeWarmAttemptEndedByWatchdog_CredentialCeilingNoTeardown", Edition: kube, Arrange: func(b *bundle) sdk.Attempt {
			// The warm worker's watchdog (the credential ceiling) ended the
			// attempt: its last heartbeat came past the ceiling less two
			// heartbeats, then silence.
			now := b.H.Now()
			since := now.Add(-75 * time.Minute)
			return b.H.Board.Put(sdktest.TaskInstance{RunID: "r", TaskID: "t", State: running, Executor: sdk.ExecutorWarm,
				RunningAt: since, LastHeartbeatAt: since.Add(b.H.Ladder.WarmAttemptWatchdog() - 20*time.Second), WarmWorker: "warm-0"})
		}, Want: sdk.LabelCredentialCeiling, WantState: failed, Check: func(t *testing.T, b *bundle, a sdk.Attempt, _ sdktest.Decisions) {
			if row := b.H.Board.Row(a); row.LastFailureKind != sdk.FailureTask {
				t.Fatalf("row %+v", row)
			}
			if n := len(b.H.Exec.Teardowns()); n != 0 {
				t.Fatalf("%d teardowns of a warm attempt", n)
			}
		}},
		{Name: "KubeLivenessError_StillMarkedOnSilence", Edition: kube, Arrange: func(b *bundle) sdk.Attempt {
			b.H.Exec.FailLiveness(errors.New("informer not synced"))
			return silent(b)
		}, Want: sdk.LabelAgentLost, WantState: failed, Check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
			if ds[0].Evidence[reap.EvSignal] != reap.SignalSilence {
				t.Fatalf("evidence %v", ds[0].Evidence)
			}
		}},
		{Name: "KubeLiteRowsNotListed", Edition: kube, Arrange: func(b *bundle) sdk.Attempt {
			now := b.H.Now()
			return b.H.Board.Put(sdktest.TaskInstance{RunID: "r", TaskID: "t", State: running, Executor: sdk.ExecutorLite,
				RunningAt: now.Add(-10 * time.Minute), LastHeartbeatAt: now.Add(-2 * time.Minute)})
		}, Want: "", WantState: running},
	})
}

func TestBrake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// put n silent attempts; the oldest silence has the lowest index.
	put := func(b *bundle, prefix string, n int, state sdk.Liveness) []sdk.Attempt {
		out := make([]sdk.Attempt, n)
		for i := range n {
			a := b.H.Running(fmt.Sprintf("%s-%03d", prefix, i), "t", time.Hour, 10*time.Minute-time.Duration(i)*time.Second)
			b.H.Exec.Set(a, sdk.AttemptLiveness{State: state, Agent: state})
			out[i] = a
		}
		return out
	}

	t.Run("BrakeEngagesOnSilenceOnly", func(t *testing.T) {
		t.Parallel()
		b := setup(t, ladder.EditionKube, nil)
		as := put(b, "alive", 30, sdk.Alive) // pods present, heartbeats missing
		ds := b.Reap(t)
		if ds.Count(sdk.LabelAgentLost) != 10 || ds.Count(sdk.LabelBrakeEngaged) != 20 || len(ds) != 30 {
			t.Fatalf("labels %v", ds.Labels())
		}
		for i, a := range as {
			want := sdk.LabelAgentLost
			if i >= 10 {
				want = sdk.LabelBrakeEngaged
			}
			if got := ds.Label(a); got != want {
				t.Fatalf("attempt %d: %q, want %q (oldest first)", i, got, want)
			}
		}
		d := ds.For(as[29])[0]
		if d.Applied || d.Evidence[reap.EvBrakeJudged] != "30" || d.Evidence[reap.EvBrakeAllowed] != "10" {
			t.Fatalf("braked decision %+v", d)
		}
		if n := len(b.H.Board.Marks()); n != 10 {
			t.Fatalf("%d marks sent", n)
		}
		// The next pass marks ten more.
		if ds := b.Reap(t); ds.Count(sdk.LabelAgentLost) != 10 {
			t.Fatalf("second pass %v", ds.Labels())
		}
	})
	t.Run("WarmAttemptsWithoutAPodOfTheirOwn_SilenceOnlyBraked", func(t *testing.T) {
		t.Parallel()
		// A warm attempt reads dead (it has no attempt pod), which says
		// nothing about its worker: its mark rests on silence alone.
		b := setup(t, ladder.EditionKube, nil)
		now := b.H.Now()
		for i := range 30 {
			b.H.Board.Put(sdktest.TaskInstance{RunID: fmt.Sprintf("warm-%03d", i), TaskID: "t", State: running,
				Executor: sdk.ExecutorWarm, RunningAt: now.Add(-time.Hour), LastHeartbeatAt: now.Add(-10 * time.Minute),
				WarmWorker: "warm-0"})
		}
		if ds := b.Reap(t); ds.Count(sdk.LabelAgentLost) != 10 || ds.Count(sdk.LabelBrakeEngaged) != 20 {
			t.Fatalf("labels %v", ds.Labels())
		}
		if n := len(b.H.Exec.LivenessCalls()); n != 0 {
			t.Fatalf("%d liveness reads of warm attempts", n)
		}
	})
	t.Run("BrakeShareCountsEveryAttemptJudged", func(t *testing.T) {
		t.Parallel()
		// 15 silence-only of 30 judged is not more than half.
		b := setup(t, ladder.EditionKube, nil)
		put(b, "alive", 15, sdk.Alive)
		put(b, "gone", 15, sdk.Dead)
		if ds := b.Reap(t); ds.Count(sdk.LabelAgentLost) != 30 {
			t.Fatalf("labels %v", ds.Labels())
		}
		// 16 of 30 is.
		b = setup(t, ladder.EditionKube, nil)
		put(b, "alive", 16, sdk.Alive)
		put(b, "gone", 14, sdk.Dead)
		if ds := b.Reap(t); ds.Count(sdk.LabelAgentLost) != 24 || ds.Count(sdk.LabelBrakeEngaged) != 6 {
			t.Fatalf("labels %v", ds.Labels())
		}
	})
	t.Run("BrakeConfigured", func(t *testing.T) {
		t.Parallel()
		b := setup(t, ladder.EditionKube, sdk.Values{"brake_share": 0.2, "brake_min": float64(5), "brake_max": float64(2)})
		put(b, "alive", 2, sdk.Alive)
		put(b, "gone", 4, sdk.Dead)
		ds, err := b.H.Reap(ctx, b.R)
		if err != nil || ds.Count(sdk.LabelAgentLost) != 6 { // 2 of 6 > 0.2, but within brake_max
			t.Fatalf("labels %v err %v", ds.Labels(), err)
		}
	})
	// Passes that mark every attempt they judge: no brake holds them.
	for _, tc := range []struct {
		name    string
		edition string
		values  sdk.Values
		prefix  string
		n       int
		state   sdk.Liveness
	}{
		{"PositiveSignalNeverBraked", ladder.EditionKube, nil, "gone", 30, sdk.Dead},
		{"LiteMarksNeverBraked", ladder.EditionLite, sdk.Values{"brake_min": float64(0), "brake_max": float64(0)}, "dead", 30, sdk.Dead},
		{"BrakeBelowMin_NotEngaged", ladder.EditionKube, nil, "alive", 19, sdk.Alive},
		{"BrakeDisabledAtShareOne", ladder.EditionKube, sdk.Values{"brake_share": float64(1)}, "alive", 40, sdk.Alive},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tc.edition, tc.values)
			put(b, tc.prefix, tc.n, tc.state)
			if ds := b.Reap(t); ds.Count(sdk.LabelAgentLost) != tc.n {
				t.Fatalf("labels %v", ds.Labels())
			}
		})
	}
}

func TestDryRunWritesNothing(t *testing.T) {
	t.Parallel()
	for _, edition := range []string{ladder.EditionLite, ladder.EditionKube} {
		t.Run(edition, func(t *testing.T) {
			t.Parallel()
			b := setup(t, edition, nil)
			b.H.DryRun = true
			b.H.Running("dead", "t", 10*time.Minute, 2*time.Minute)
			orphan := b.H.Running("orphan", "t", 10*time.Minute, 2*time.Minute)
			b.H.Exec.Orphaned(orphan)
			ceiling := b.H.Running("ceiling", "t", 2*time.Hour, 5*time.Second)
			b.H.Exec.Alive(ceiling)
			b.H.RunningNeverHeartbeated("never", "t", 5*time.Minute)
			ds := b.Reap(t)
			if len(ds) == 0 {
				t.Fatal("no decisions")
			}
			for _, d := range ds {
				if !d.DryRun || d.Applied {
					t.Fatalf("decision %+v", d)
				}
			}
			if b.H.Board.Writes() != 0 || b.H.Exec.Actions() != 0 {
				t.Fatalf("writes=%d actions=%d", b.H.Board.Writes(), b.H.Exec.Actions())
			}
			if edition == ladder.EditionLite && ds.Label(orphan) != sdk.LabelAgentLostOrphanStopped {
				t.Fatalf("orphan: %q", ds.Label(orphan))
			}
		})
	}
}

func TestPaging(t *testing.T) {
	t.Parallel()
	putAlive := func(b *bundle, n int) []sdk.Attempt {
		out := make([]sdk.Attempt, n)
		for i := range n {
			out[i] = b.H.Running(fmt.Sprintf("r%04d", i), "t", time.Hour, 30*time.Minute-time.Duration(i)*time.Second)
			b.H.Exec.Alive(out[i])
		}
		return out
	}

	t.Run("CursorCarriedBetweenPasses", func(t *testing.T) {
		t.Parallel()
		b := setup(t, ladder.EditionLite, sdk.Values{"drain_max_pages": float64(1)})
		as := putAlive(b, 250)
		b.ExpectPassesStartAt(t, as[0], as[100], as[200], as[0])
	})
	t.Run("ShortPageResetsCursor", func(t *testing.T) {
		t.Parallel()
		b := setup(t, ladder.EditionLite, sdk.Values{"drain_max_pages": float64(1)})
		putAlive(b, 150)
		b.Reap(t)
		if b.H.StateOf(Name) == nil {
			t.Fatal("no cursor after a full page")
		}
		if ds := b.Reap(t); len(ds) != 50 || b.H.StateOf(Name) != nil {
			t.Fatalf("second pass judged %d, state %s", len(ds), b.H.StateOf(Name))
		}
	})
	t.Run("DrainReachesAll2500InOnePass", func(t *testing.T) {
		t.Parallel()
		b := setup(t, ladder.EditionLite, nil)
		for i := range 2500 {
			b.H.Running(fmt.Sprintf("r%04d", i), "t", time.Hour, 10*time.Minute)
		}
		ds := b.Reap(t)
		if n := ds.Count(sdk.LabelAgentLost); n != 2500 {
			t.Fatalf("%d marked in one pass", n)
		}
		if b.H.StateOf(Name) != nil {
			t.Fatalf("state after a full drain: %s", b.H.StateOf(Name))
		}
	})
	t.Run("NoDeadline_OnePagePerListing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, ladder.EditionLite, nil)
		b.H.Budget = 0
		putAlive(b, 250)
		if ds := b.Reap(t); len(ds) != 100 {
			t.Fatalf("judged %d", len(ds))
		}
	})
	t.Run("ListingsDoNotStarveEachOther", func(t *testing.T) {
		t.Parallel()
		b := setup(t, ladder.EditionLite, sdk.Values{"drain_max_pages": float64(1)})
		putAlive(b, 300)
		never := b.H.RunningNeverHeartbeated("never", "t", 5*time.Minute)
		if ds := b.Reap(t); ds.Label(never) != sdk.LabelAgentLostNeverHeartbeated {
			t.Fatalf("never-heartbeated attempt: %q", ds.Label(never))
		}
	})
	t.Run("CorruptState_StartsOver", func(t *testing.T) {
		t.Parallel()
		b := setup(t, ladder.EditionLite, nil)
		a := b.H.Running("r", "t", time.Hour, 10*time.Minute)
		b.H.SetState(Name, []byte("{not json"))
		if ds := b.Reap(t); ds.Label(a) != sdk.LabelAgentLost {
			t.Fatalf("decisions %v", ds.Labels())
		}
	})
	t.Run("ListingError_FailsPassKeepsCursor", func(t *testing.T) {
		t.Parallel()
		b := setup(t, ladder.EditionLite, sdk.Values{"drain_max_pages": float64(1)})
		putAlive(b, 150)
		b.Reap(t)
		before := string(b.H.StateOf(Name))
		b.H.Board.Fail(sdktest.OpListCandidates, errors.New("connection reset"))
		_, err := b.H.Reap(context.Background(), b.R)
		if err == nil || !strings.Contains(err.Error(), "connection reset") {
			t.Fatalf("err %v", err)
		}
		if string(b.H.Last.State) != before {
			t.Fatalf("state moved on an error: %s -> %s", before, b.H.Last.State)
		}
	})
}

func TestConfigure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cases := []struct {
		name    string
		values  sdk.Values
		wantKey string // "" means valid
	}{
		{"Defaults", nil, ""},
		{"Hold", sdk.Values{"policy": "hold"}, ""},
		{"BadPolicy", sdk.Values{"policy": "reset"}, "policy"},
		{"PolicyNotString", sdk.Values{"policy": true}, "policy"},
		{"ShareZero", sdk.Values{"brake_share": float64(0)}, "brake_share"},
		{"ShareOverOne", sdk.Values{"brake_share": 1.5}, "brake_share"},
		{"ShareNotNumber", sdk.Values{"brake_share": "half"}, "brake_share"},
		{"MinNegative", sdk.Values{"brake_min": float64(-1)}, "brake_min"},
		{"MaxFractional", sdk.Values{"brake_max": 2.5}, "brake_max"},
		{"DrainPagesNegative", sdk.Values{"drain_max_pages": float64(-3)}, "drain_max_pages"},
		{"UnknownKey", sdk.Values{"brakes": float64(1)}, "brakes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := sdktest.New(ladder.EditionLite)
			err := h.Configure(ctx, New(nil), tc.values)
			if tc.wantKey == "" {
				if err != nil {
					t.Fatalf("err %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), `"`+tc.wantKey+`"`) {
				t.Fatalf("err %v, want one naming %q", err, tc.wantKey)
			}
		})
	}
	t.Run("SchemaDeclaresEveryKey", func(t *testing.T) {
		t.Parallel()
		s, _ := New(nil).ConfigSchema(ctx)
		var names []string
		for _, a := range s.Attributes {
			names = append(names, a.Name)
		}
		if got := strings.Join(names, ","); got != "policy,drain_max_pages,brake_share,brake_min,brake_max" {
			t.Fatalf("schema %s", got)
		}
		info, _ := New(nil).Info(ctx)
		if info.Name != Name || info.Kind != sdk.KindReaper || len(info.Editions) != 2 {
			t.Fatalf("info %+v", info)
		}
	})
}

// BenchmarkMassRecoveryLite is a mass failure on Lite: 10,000 running
// attempts whose agents and groups are dead, all settled by one pass.
func BenchmarkMassRecoveryLite(b *testing.B) {
	const n = 10_000
	ctx := context.Background()
	var marked int
	var elapsed time.Duration
	for range b.N {
		b.StopTimer()
		bu := setup(b, ladder.EditionLite, nil)
		for i := range n {
			bu.H.Running(fmt.Sprintf("r%05d", i), "t", time.Hour, 10*time.Minute-time.Duration(i)*time.Millisecond)
		}
		b.StartTimer()
		start := time.Now()
		ds, err := bu.H.Reap(ctx, bu.R)
		elapsed += time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		if c := ds.Count(sdk.LabelAgentLost); c != n || bu.H.StateOf(Name) != nil {
			b.Fatalf("one pass marked %d of %d", c, n)
		}
		marked += n
	}
	b.ReportMetric(float64(marked)/elapsed.Seconds(), "marks/s")
	b.ReportMetric(1, "passes")
}

// The kill line of an attempt ended at the credential ceiling is the last
// line of its try log: when its agent is slow to exit, the pass that marks
// it writes nothing more, and a later pass that finds the group and the
// agent gone writes the line. Lines the agent appends in between stay
// before it.
func TestCeilingKillLineWaitsForTheAgentAndIsLast(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, ladder.EditionLite, nil)
	a := b.H.Running("r", "t", 61*time.Minute, 5*time.Second)
	b.H.Exec.Alive(a)
	b.H.Exec.ScriptStop(a, sdk.StopResult{Detail: "group gone; agent still running"}, nil)

	if ds := b.Reap(t); ds.Label(a) != sdk.LabelCredentialCeiling {
		t.Fatalf("first pass: %+v", ds)
	}
	if log := b.H.Board.Log(a); len(log) != 0 {
		t.Fatalf("kill line written while the agent still runs: %q", log)
	}
	// The agent reports its task's end before it exits.
	if err := b.H.Board.AppendLog(ctx, 1, []sdk.LogLine{{Attempt: a, At: b.H.Now(), Line: "task exited: signal"}}); err != nil {
		t.Fatal(err)
	}
	b.H.Clock.Advance(30 * time.Second)
	b.Reap(t) // still running: still owed
	if log := b.H.Board.Log(a); len(log) != 1 {
		t.Fatalf("try log %q", log)
	}

	b.H.Exec.ScriptStop(a, sdk.StopResult{Stopped: true, Detail: "task group and agent gone"}, nil)
	b.H.Clock.Advance(30 * time.Second)
	b.Reap(t)
	log := b.H.Board.Log(a)
	if len(log) != 2 || log[len(log)-1] != KilledLine {
		t.Fatalf("try log %q; want the kill line last", log)
	}
	b.H.Clock.Advance(30 * time.Second)
	b.Reap(t)
	if log := b.H.Board.Log(a); len(log) != 2 {
		t.Fatalf("kill line written twice: %q", log)
	}
}

// A stop that outlives the pass that began it defers the attempt as alive;
// the pass that later finds the group gone marks it as stopped.
func TestOrphanStopInFlight_MarkLandsOnALaterPass(t *testing.T) {
	t.Parallel()
	b := setup(t, ladder.EditionLite, nil)
	a := b.H.Running("r", "t", 10*time.Minute, 5*time.Minute)
	b.H.Exec.Orphaned(a)
	b.H.Exec.ScriptStop(a, sdk.StopResult{InFlight: true, Detail: "stopping group 42: begun 9s ago, goes on"}, nil)

	ds := b.Reap(t)
	if ds.Label(a) != sdk.LabelAgentLostProcessAlive || b.H.Board.Row(a).State != sdk.StateRunning {
		t.Fatalf("first pass: %+v", ds)
	}
	// Still in flight on the next pass: it waits again, nothing marked.
	b.H.Clock.Advance(30 * time.Second)
	if ds := b.Reap(t); ds.Label(a) != sdk.LabelAgentLostProcessAlive {
		t.Fatalf("second pass: %+v", ds)
	}
	b.H.Exec.Dead(a)
	b.H.Clock.Advance(30 * time.Second)
	ds = b.Reap(t)
	if ds.Label(a) != sdk.LabelAgentLostOrphanStopped || b.H.Board.Row(a).State != sdk.StateFailed {
		t.Fatalf("later pass: %+v", ds)
	}
	if len(b.H.StateOf(Name)) != 0 {
		t.Fatalf("state still carries %s", b.H.StateOf(Name))
	}
}

// The pod UID the runner recorded on the attempt reaches the substrate with
// every liveness read and pins the teardown to that pod, so a pod someone
// else made with the attempt's labels neither keeps it alive nor is torn
// down.
func TestTheRecordedPodUIDPinsTheLivenessReadAndTheTeardown(t *testing.T) {
	t.Parallel()
	b := setup(t, ladder.EditionKube, nil)
	a := b.H.Running("r", "t", 5*time.Minute, 2*time.Minute)
	b.H.Board.Update(a.RunID, a.TaskID, func(ti *sdktest.TaskInstance) { ti.PodUID = "uid-own" })
	ds := b.Reap(t)
	if ds.Applied().Count(sdk.LabelAgentLost) != 1 {
		t.Fatalf("decisions %v", ds)
	}
	b.H.ExpectPinnedToPodUID(t, a, "uid-own")
}

package dispatchlost

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
	failed = sdk.StateFailed
	queued = sdk.StateQueued
	kube   = ladder.EditionKube
)

var noActions = sdktest.NoActions[*Reaper]

func TestLite(t *testing.T) {
	t.Parallel()
	lost := func(b *bundle) sdk.Attempt { return b.H.Queued("r", "t", 4*time.Minute) }
	sdktest.RunRules(t, setup, []sdktest.Rule[*Reaper]{
		// Provisional as the plugin asks it: on Lite the host confirms it
		// as made, on the substrate's word, never on the reaper's.
		{Name: "QueuedPastThresholdAndDead_DispatchLostProvisional", Arrange: lost, Want: sdk.LabelDispatchLost, WantState: failed,
			Check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
				row := b.H.Board.Row(a)
				if row.LastFailureKind != sdk.FailureInfra || !row.InfraConfirmedAt.IsZero() || row.MarkReason != sdk.LabelDispatchLost || row.Held {
					t.Fatalf("row %+v", row)
				}
				if m := b.H.Board.Marks()[0]; len(m.FromStates) != 1 || m.FromStates[0] != queued || m.Term != 1 {
					t.Fatalf("mark %+v", m)
				}
				noActions(t, b, a, ds)
			}},
		{Name: "RowWithoutQueuedAt_NeverReaped", Arrange: func(b *bundle) sdk.Attempt {
			return b.H.Board.PutQueued("r", "t", time.Time{})
		}, Want: "", WantState: queued, Check: func(t *testing.T, b *bundle, _ sdk.Attempt, _ sdktest.Decisions) {
			if n := len(b.H.Board.Marks()); n != 0 {
				t.Fatalf("%d marks", n)
			}
		}},
		{Name: "QueuedExactlyAtThreshold_NotJudged", Arrange: func(b *bundle) sdk.Attempt {
			return b.H.Queued("r", "t", 3*time.Minute)
		}, Want: "", WantState: queued},
		{Name: "AgentAlive_Defers", Arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.H.Exec.Alive(a)
			return a
		}, Want: sdk.LabelDispatchLostProcessAlive, WantState: queued},
		{Name: "LivenessUnknown_Defers", Arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.H.Exec.Unknown(a, "signal 0: EPERM")
			return a
		}, Want: sdk.LabelDispatchLostProcessQueryErr, WantState: queued},
		{Name: "LivenessCallFails_Defers", Arrange: func(b *bundle) sdk.Attempt {
			b.H.Exec.FailLiveness(errors.New("record dir is a symlink"))
			return lost(b)
		}, Want: sdk.LabelDispatchLostProcessQueryErr, WantState: queued},
		{Name: "OrphanedGroup_StoppedThenMarked", Arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.H.Exec.Orphaned(a)
			b.H.Board.OnMark(func(sdk.Mark) {
				if len(b.H.Exec.Stops()) != 1 {
					panic("marked before the group was stopped")
				}
			})
			return a
		}, Want: sdk.LabelDispatchLostOrphanStopped, WantState: failed, Check: func(t *testing.T, b *bundle, a sdk.Attempt, _ sdktest.Decisions) {
			if s := b.H.Exec.Stops(); len(s) != 1 || s[0].Attempt != a || s[0].Reason != sdk.StopOrphan {
				t.Fatalf("stops %+v", s)
			}
		}},
		{Name: "OrphanStopFails_Defers", Arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.H.Exec.Orphaned(a)
			b.H.Exec.ScriptStop(a, sdk.StopResult{Detail: "leader exited, members remain"}, nil)
			return a
		}, Want: sdk.LabelDispatchLostOrphanStopErr, WantState: queued},
		{Name: "StartedBetweenListAndMark_Noop", Arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.H.Board.OnMark(func(m sdk.Mark) {
				b.H.Board.Update(m.RunID, m.TaskID, func(ti *sdktest.TaskInstance) { ti.State = sdk.StateRunning })
			})
			return a
		}, Want: sdk.LabelMarkNoop, WantState: sdk.StateRunning, Check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
			if d := ds.For(a)[0]; d.Evidence[reap.EvNoopReason] != sdk.NoopMovedOn || d.Applied {
				t.Fatalf("decision %+v", d)
			}
		}},
		{Name: "HoldPolicySetsHold", Values: sdk.Values{"policy": "hold"}, Arrange: lost, Want: sdk.LabelDispatchLost, WantState: failed,
			Check: func(t *testing.T, b *bundle, a sdk.Attempt, _ sdktest.Decisions) {
				if !b.H.Board.Row(a).Held || !b.H.Board.Marks()[0].Hold {
					t.Fatal("not held")
				}
			}},
		{Name: "LiteHasNoStartExpired", Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.Queued("r", "t", 9*time.Minute)
			b.H.Exec.Pending(a)
			return a
		}, Want: sdk.LabelDispatchLostProcessAlive, WantState: queued},
	})
}

func TestKube(t *testing.T) {
	t.Parallel()
	lost := func(b *bundle) sdk.Attempt { return b.H.Queued("r", "t", 4*time.Minute) }
	liveCalls := func(b *bundle) (cached, live int) {
		for _, c := range b.H.Exec.LivenessCalls() {
			if c.Live {
				live++
			} else {
				cached++
			}
		}
		return cached, live
	}
	sdktest.RunRules(t, setup, []sdktest.Rule[*Reaper]{
		{Name: "NoPod_DispatchLostProvisionalThenTornDown", Edition: kube, Arrange: lost, Want: sdk.LabelDispatchLost, WantState: failed,
			Check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
				if row := b.H.Board.Row(a); !row.InfraConfirmedAt.IsZero() || !row.Live() {
					t.Fatalf("row %+v", row)
				}
				if td := b.H.Exec.Teardowns(); len(td) != 1 || *td[0].Attempt != a || td[0].Reason != sdk.LabelDispatchLost {
					t.Fatalf("teardowns %+v", td)
				}
				if _, live := liveCalls(b); live != 1 || ds[0].Evidence[reap.EvLivenessLive] != "true" {
					t.Fatalf("mark not backed by a live read: %d live reads, evidence %v", live, ds[0].Evidence)
				}
			}},
		{Name: "PodPendingOrRunning_DefersWithoutLiveRead", Edition: kube, Arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.H.Exec.Alive(a)
			return a
		}, Want: sdk.LabelDispatchLostPodAlive, WantState: queued, Check: func(t *testing.T, b *bundle, _ sdk.Attempt, _ sdktest.Decisions) {
			if _, live := liveCalls(b); live != 0 {
				t.Fatalf("%d live reads", live)
			}
		}},
		{Name: "PodQueryError_Defers", Edition: kube, Arrange: func(b *bundle) sdk.Attempt {
			b.H.Exec.FailLiveness(errors.New("apiserver: connection refused"))
			return lost(b)
		}, Want: sdk.LabelDispatchLostPodQueryErr, WantState: queued, Check: noActions},
		{Name: "CacheSaysGoneLiveReadFindsPod_Defers", Edition: kube, Arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.H.Exec.Dead(a)
			b.H.Exec.SetLiveRead(a, sdk.AttemptLiveness{State: sdk.Alive, Agent: sdk.Alive, Detail: "pod Running"})
			return a
		}, Want: sdk.LabelDispatchLostPodAlive, WantState: queued, Check: noActions},
		{Name: "CacheSaysGoneLiveReadFails_Defers", Edition: kube, Arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.H.Exec.Dead(a)
			b.H.Exec.SetLiveRead(a, sdk.AttemptLiveness{State: sdk.Unknown, Detail: "list pods: 429"})
			return a
		}, Want: sdk.LabelDispatchLostPodQueryErr, WantState: queued, Check: noActions},
		{Name: "PendingPodNearCredentialLapse_StartExpired", Edition: kube, Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.Queued("r", "t", 8*time.Minute) // lapses in exactly 2 minutes
			b.H.Exec.Pending(a)
			return a
		}, Want: sdk.LabelStartExpired, WantState: failed, Check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
			row := b.H.Board.Row(a)
			if row.MarkReason != sdk.LabelStartExpired || row.LastFailureKind != sdk.FailureInfra || !row.InfraConfirmedAt.IsZero() {
				t.Fatalf("row %+v", row)
			}
			if td := b.H.Exec.Teardowns(); len(td) != 1 || td[0].Reason != sdk.LabelStartExpired {
				t.Fatalf("teardowns %+v", td)
			}
			if _, live := liveCalls(b); live != 1 {
				t.Fatalf("%d live reads", live)
			}
			if ds[0].Evidence[EvCredentialLapse] == "" {
				t.Fatalf("evidence %v", ds[0].Evidence)
			}
		}},
		{Name: "PendingPodBeforeMargin_Defers", Edition: kube, Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.Queued("r", "t", 8*time.Minute-time.Second)
			b.H.Exec.Pending(a)
			return a
		}, Want: sdk.LabelDispatchLostPodAlive, WantState: queued},
		{Name: "RunningPodNearCredentialLapse_Defers", Edition: kube, Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.Queued("r", "t", 9*time.Minute)
			b.H.Exec.Alive(a)
			return a
		}, Want: sdk.LabelDispatchLostPodAlive, WantState: queued, Check: noActions},
		{Name: "PendingInCacheRunningLive_Defers", Edition: kube, Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.Queued("r", "t", 9*time.Minute)
			b.H.Exec.Pending(a)
			b.H.Exec.SetLiveRead(a, sdk.AttemptLiveness{State: sdk.Alive, Agent: sdk.Alive, Detail: "pod Running"})
			return a
		}, Want: sdk.LabelDispatchLostPodAlive, WantState: queued, Check: noActions},
		{Name: "NearLapseReadError_Defers", Edition: kube, Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.Queued("r", "t", 9*time.Minute)
			b.H.Exec.Pending(a)
			b.H.Exec.SetLiveRead(a, sdk.AttemptLiveness{State: sdk.Unknown, Detail: "get pods: timeout"})
			return a
		}, Want: sdk.LabelDispatchLostPodQueryErr, WantState: queued, Check: noActions},
		{Name: "StartExpiryDisabled_Defers", Edition: kube, Values: sdk.Values{AttrStartExpiry: false}, Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.Queued("r", "t", 9*time.Minute)
			b.H.Exec.Pending(a)
			return a
		}, Want: sdk.LabelDispatchLostPodAlive, WantState: queued},
		{Name: "TeardownFails_PodDeleteErrorMarkStays", Edition: kube, Arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.H.Exec.ScriptTeardown(a, nil, errors.New("forbidden"))
			return a
		}, Want: sdk.LabelDispatchLost + "," + sdk.LabelDispatchLostPodDeleteErr, WantState: failed},
		{Name: "DeleteFallback_Recorded", Edition: kube, Arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.H.Exec.ScriptTeardown(a, []sdk.TeardownOutcome{{Object: "pod/p", Action: sdk.TeardownDeleteFallback}}, nil)
			return a
		}, Want: sdk.LabelDispatchLost + "," + sdk.LabelTeardownDeleteFallback, WantState: failed},
		{Name: "ReQueuedBetweenListAndMark_NewAttemptUntouched", Edition: kube, Arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.H.Board.OnMark(func(m sdk.Mark) {
				b.H.Board.Replace(m.RunID, m.TaskID, false, queued, b.H.Now())
				b.H.Board.Update(m.RunID, m.TaskID, func(ti *sdktest.TaskInstance) { ti.QueuedAt = b.H.Now() })
			})
			return a
		}, Want: sdk.LabelMarkNoop, WantState: queued, Check: noActions},
	})
}

func TestDryRunWritesNothing(t *testing.T) {
	t.Parallel()
	for _, edition := range []string{ladder.EditionLite, kube} {
		t.Run(edition, func(t *testing.T) {
			t.Parallel()
			b := setup(t, edition, nil)
			b.H.DryRun = true
			b.H.Queued("dead", "t", 4*time.Minute)
			orphan := b.H.Queued("orphan", "t", 4*time.Minute)
			b.H.Exec.Orphaned(orphan)
			pending := b.H.Queued("pending", "t", 9*time.Minute)
			b.H.Exec.Pending(pending)
			ds := b.Reap(t)
			if len(ds) != 3 {
				t.Fatalf("decisions %v", ds.Labels())
			}
			for _, d := range ds {
				if !d.DryRun || d.Applied {
					t.Fatalf("decision %+v", d)
				}
			}
			if b.H.Board.Writes() != 0 || b.H.Exec.Actions() != 0 {
				t.Fatalf("writes=%d actions=%d", b.H.Board.Writes(), b.H.Exec.Actions())
			}
			if edition == kube && ds.Label(pending) != sdk.LabelStartExpired {
				t.Fatalf("pending: %q", ds.Label(pending))
			}
		})
	}
}

func TestPaging(t *testing.T) {
	t.Parallel()
	// n queued attempts whose dispatch landed, oldest first.
	putAlive := func(b *bundle, n int) []sdk.Attempt {
		out := make([]sdk.Attempt, n)
		for i := range n {
			out[i] = b.H.Queued(fmt.Sprintf("r%04d", i), "t", 7*time.Minute-time.Duration(i)*time.Second)
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
		putAlive(b, 130)
		b.Reap(t)
		if ds := b.Reap(t); len(ds) != 30 || b.H.StateOf(Name) != nil {
			t.Fatalf("second pass judged %d, state %s", len(ds), b.H.StateOf(Name))
		}
	})
	t.Run("LostDispatchBehind150LivePods_ReachedOnSecondPage", func(t *testing.T) {
		t.Parallel()
		b := setup(t, kube, sdk.Values{"drain_max_pages": float64(1)})
		putAlive(b, 150)
		newer := b.H.Queued("newer", "t", 4*time.Minute)
		if ds := b.Reap(t); ds.Label(newer) != "" {
			t.Fatalf("first pass: %q", ds.Label(newer))
		}
		if ds := b.Reap(t); ds.Label(newer) != sdk.LabelDispatchLost {
			t.Fatalf("second pass: %q", ds.Label(newer))
		}
	})
	t.Run("DrainReachesAll2500InOnePass", func(t *testing.T) {
		t.Parallel()
		b := setup(t, ladder.EditionLite, nil)
		for i := range 2500 {
			b.H.Queued(fmt.Sprintf("r%04d", i), "t", 10*time.Minute)
		}
		if ds := b.Reap(t); ds.Count(sdk.LabelDispatchLost) != 2500 || b.H.StateOf(Name) != nil {
			t.Fatalf("marked %d, state %s", ds.Count(sdk.LabelDispatchLost), b.H.StateOf(Name))
		}
	})
}

func TestConfigure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		values  sdk.Values
		wantKey string
	}{
		{"Defaults", nil, ""},
		{"BadPolicy", sdk.Values{"policy": "retry"}, "policy"},
		{"StartExpiryNotBool", sdk.Values{AttrStartExpiry: "yes"}, AttrStartExpiry},
		{"BrakeIsNotASetting", sdk.Values{"brake_share": 0.5}, "brake_share"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := sdktest.New(kube).Configure(ctx, New(nil), tc.values)
			if tc.wantKey == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), `"`+tc.wantKey+`"`) {
				t.Fatalf("err %v, want one naming %q", err, tc.wantKey)
			}
		})
	}
}

// A stop that outlives the pass that began it (a group given its whole
// SIGTERM grace) defers the attempt as alive; the pass that later finds the
// group gone marks it as stopped, under the orphan-stopped label.
func TestOrphanStopInFlight_MarkLandsOnALaterPass(t *testing.T) {
	t.Parallel()
	b := setup(t, ladder.EditionLite, nil)
	a := b.H.Queued("r", "t", 5*time.Minute)
	b.H.Exec.Orphaned(a)
	b.H.Exec.ScriptStop(a, sdk.StopResult{InFlight: true, Detail: "stopping group 42: begun 9s ago, goes on"}, nil)

	ds := b.Reap(t)
	if ds.Label(a) != sdk.LabelDispatchLostProcessAlive || b.H.Board.Row(a).State != sdk.StateQueued {
		t.Fatalf("first pass: %+v, row %s", ds, b.H.Board.Row(a).State)
	}
	if ev := ds.For(a)[0].Evidence[reap.EvStop]; !strings.HasPrefix(ev, "in flight") {
		t.Fatalf("stop evidence %q", ev)
	}
	b.H.Exec.Dead(a) // the stop went on in the substrate and is over
	b.H.Clock.Advance(30 * time.Second)
	ds = b.Reap(t)
	if ds.Label(a) != sdk.LabelDispatchLostOrphanStopped || b.H.Board.Row(a).State != sdk.StateFailed {
		t.Fatalf("later pass: %+v, row %s", ds, b.H.Board.Row(a).State)
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
	a := b.H.Queued("r", "t", 4*time.Minute)
	b.H.Board.Update(a.RunID, a.TaskID, func(ti *sdktest.TaskInstance) { ti.PodUID = "uid-own" })
	ds := b.Reap(t)
	if ds.Applied().Count(sdk.LabelDispatchLost) != 1 {
		t.Fatalf("decisions %v", ds)
	}
	b.H.ExpectPinnedToPodUID(t, a, "uid-own")
}

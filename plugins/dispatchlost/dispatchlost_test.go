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

type bundle struct {
	h *sdktest.Harness
	r *Reaper
}

func setup(t testing.TB, edition string, values sdk.Values) *bundle {
	t.Helper()
	h := sdktest.New(edition)
	r := New(nil)
	if err := h.Configure(context.Background(), r, values); err != nil {
		t.Fatalf("configure: %v", err)
	}
	return &bundle{h: h, r: r}
}

func (b *bundle) reap(t testing.TB) sdktest.Decisions {
	t.Helper()
	ds, err := b.h.Reap(context.Background(), b.r)
	if err != nil {
		t.Fatalf("reap: %v", err)
	}
	return ds
}

type ruleCase struct {
	name      string
	edition   string
	values    sdk.Values
	arrange   func(b *bundle) sdk.Attempt
	want      string
	wantState string
	check     func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions)
}

func runRules(t *testing.T, cases []ruleCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			edition := tc.edition
			if edition == "" {
				edition = ladder.EditionLite
			}
			b := setup(t, edition, tc.values)
			a := tc.arrange(b)
			ds := b.reap(t)
			if got := ds.Label(a); got != tc.want {
				t.Fatalf("decisions %q, want %q (all: %+v)", got, tc.want, ds)
			}
			if got := b.h.Board.Row(a).State; got != tc.wantState {
				t.Fatalf("row state %q, want %q", got, tc.wantState)
			}
			if tc.check != nil {
				tc.check(t, b, a, ds)
			}
		})
	}
}

const (
	failed = sdk.StateFailed
	queued = sdk.StateQueued
	kube   = ladder.EditionKube
)

func noActions(t *testing.T, b *bundle, _ sdk.Attempt, _ sdktest.Decisions) {
	t.Helper()
	if n := b.h.Exec.Actions(); n != 0 {
		t.Fatalf("%d stops or teardowns", n)
	}
}

func TestLite(t *testing.T) {
	t.Parallel()
	lost := func(b *bundle) sdk.Attempt { return b.h.Queued("r", "t", 4*time.Minute) }
	runRules(t, []ruleCase{
		// Provisional as the plugin asks it: on Lite the host confirms it
		// as made, on the substrate's word, never on the reaper's.
		{name: "QueuedPastThresholdAndDead_DispatchLostProvisional", arrange: lost, want: sdk.LabelDispatchLost, wantState: failed,
			check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
				row := b.h.Board.Row(a)
				if row.LastFailureKind != sdk.FailureInfra || !row.InfraConfirmedAt.IsZero() || row.MarkReason != sdk.LabelDispatchLost || row.Held {
					t.Fatalf("row %+v", row)
				}
				if m := b.h.Board.Marks()[0]; len(m.FromStates) != 1 || m.FromStates[0] != queued || m.Term != 1 {
					t.Fatalf("mark %+v", m)
				}
				noActions(t, b, a, ds)
			}},
		{name: "RowWithoutQueuedAt_NeverReaped", arrange: func(b *bundle) sdk.Attempt {
			return b.h.Board.PutQueued("r", "t", time.Time{})
		}, want: "", wantState: queued, check: func(t *testing.T, b *bundle, _ sdk.Attempt, _ sdktest.Decisions) {
			if n := len(b.h.Board.Marks()); n != 0 {
				t.Fatalf("%d marks", n)
			}
		}},
		{name: "QueuedExactlyAtThreshold_NotJudged", arrange: func(b *bundle) sdk.Attempt {
			return b.h.Queued("r", "t", 3*time.Minute)
		}, want: "", wantState: queued},
		{name: "AgentAlive_Defers", arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.h.Exec.Alive(a)
			return a
		}, want: sdk.LabelDispatchLostProcessAlive, wantState: queued},
		{name: "LivenessUnknown_Defers", arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.h.Exec.Unknown(a, "signal 0: EPERM")
			return a
		}, want: sdk.LabelDispatchLostProcessQueryErr, wantState: queued},
		{name: "LivenessCallFails_Defers", arrange: func(b *bundle) sdk.Attempt {
			b.h.Exec.FailLiveness(errors.New("record dir is a symlink"))
			return lost(b)
		}, want: sdk.LabelDispatchLostProcessQueryErr, wantState: queued},
		{name: "OrphanedGroup_StoppedThenMarked", arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.h.Exec.Orphaned(a)
			b.h.Board.OnMark(func(sdk.Mark) {
				if len(b.h.Exec.Stops()) != 1 {
					panic("marked before the group was stopped")
				}
			})
			return a
		}, want: sdk.LabelDispatchLostOrphanStopped, wantState: failed, check: func(t *testing.T, b *bundle, a sdk.Attempt, _ sdktest.Decisions) {
			if s := b.h.Exec.Stops(); len(s) != 1 || s[0].Attempt != a || s[0].Reason != sdk.StopOrphan {
				t.Fatalf("stops %+v", s)
			}
		}},
		{name: "OrphanStopFails_Defers", arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.h.Exec.Orphaned(a)
			b.h.Exec.ScriptStop(a, sdk.StopResult{Detail: "leader exited, members remain"}, nil)
			return a
		}, want: sdk.LabelDispatchLostOrphanStopErr, wantState: queued},
		{name: "StartedBetweenListAndMark_Noop", arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.h.Board.OnMark(func(m sdk.Mark) {
				b.h.Board.Update(m.RunID, m.TaskID, func(ti *sdktest.TaskInstance) { ti.State = sdk.StateRunning })
			})
			return a
		}, want: sdk.LabelMarkNoop, wantState: sdk.StateRunning, check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
			if d := ds.For(a)[0]; d.Evidence[reap.EvNoopReason] != sdk.NoopMovedOn || d.Applied {
				t.Fatalf("decision %+v", d)
			}
		}},
		{name: "HoldPolicySetsHold", values: sdk.Values{"policy": "hold"}, arrange: lost, want: sdk.LabelDispatchLost, wantState: failed,
			check: func(t *testing.T, b *bundle, a sdk.Attempt, _ sdktest.Decisions) {
				if !b.h.Board.Row(a).Held || !b.h.Board.Marks()[0].Hold {
					t.Fatal("not held")
				}
			}},
		{name: "LiteHasNoStartExpired", arrange: func(b *bundle) sdk.Attempt {
			a := b.h.Queued("r", "t", 9*time.Minute)
			b.h.Exec.Pending(a)
			return a
		}, want: sdk.LabelDispatchLostProcessAlive, wantState: queued},
	})
}

func TestKube(t *testing.T) {
	t.Parallel()
	lost := func(b *bundle) sdk.Attempt { return b.h.Queued("r", "t", 4*time.Minute) }
	liveCalls := func(b *bundle) (cached, live int) {
		for _, c := range b.h.Exec.LivenessCalls() {
			if c.Live {
				live++
			} else {
				cached++
			}
		}
		return cached, live
	}
	runRules(t, []ruleCase{
		{name: "NoPod_DispatchLostProvisionalThenTornDown", edition: kube, arrange: lost, want: sdk.LabelDispatchLost, wantState: failed,
			check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
				if row := b.h.Board.Row(a); !row.InfraConfirmedAt.IsZero() || !row.Live() {
					t.Fatalf("row %+v", row)
				}
				if td := b.h.Exec.Teardowns(); len(td) != 1 || *td[0].Attempt != a || td[0].Reason != sdk.LabelDispatchLost {
					t.Fatalf("teardowns %+v", td)
				}
				if _, live := liveCalls(b); live != 1 || ds[0].Evidence[reap.EvLivenessLive] != "true" {
					t.Fatalf("mark not backed by a live read: %d live reads, evidence %v", live, ds[0].Evidence)
				}
			}},
		{name: "PodPendingOrRunning_DefersWithoutLiveRead", edition: kube, arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.h.Exec.Alive(a)
			return a
		}, want: sdk.LabelDispatchLostPodAlive, wantState: queued, check: func(t *testing.T, b *bundle, _ sdk.Attempt, _ sdktest.Decisions) {
			if _, live := liveCalls(b); live != 0 {
				t.Fatalf("%d live reads", live)
			}
		}},
		{name: "PodQueryError_Defers", edition: kube, arrange: func(b *bundle) sdk.Attempt {
			b.h.Exec.FailLiveness(errors.New("apiserver: connection refused"))
			return lost(b)
		}, want: sdk.LabelDispatchLostPodQueryErr, wantState: queued, check: noActions},
		{name: "CacheSaysGoneLiveReadFindsPod_Defers", edition: kube, arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.h.Exec.Dead(a)
			b.h.Exec.SetLiveRead(a, sdk.AttemptLiveness{State: sdk.Alive, Agent: sdk.Alive, Detail: "pod Running"})
			return a
		}, want: sdk.LabelDispatchLostPodAlive, wantState: queued, check: noActions},
		{name: "CacheSaysGoneLiveReadFails_Defers", edition: kube, arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.h.Exec.Dead(a)
			b.h.Exec.SetLiveRead(a, sdk.AttemptLiveness{State: sdk.Unknown, Detail: "list pods: 429"})
			return a
		}, want: sdk.LabelDispatchLostPodQueryErr, wantState: queued, check: noActions},
		{name: "PendingPodNearCredentialLapse_StartExpired", edition: kube, arrange: func(b *bundle) sdk.Attempt {
			a := b.h.Queued("r", "t", 8*time.Minute) // lapses in exactly 2 minutes
			b.h.Exec.Pending(a)
			return a
		}, want: sdk.LabelStartExpired, wantState: failed, check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
			row := b.h.Board.Row(a)
			if row.MarkReason != sdk.LabelStartExpired || row.LastFailureKind != sdk.FailureInfra || !row.InfraConfirmedAt.IsZero() {
				t.Fatalf("row %+v", row)
			}
			if td := b.h.Exec.Teardowns(); len(td) != 1 || td[0].Reason != sdk.LabelStartExpired {
				t.Fatalf("teardowns %+v", td)
			}
			if _, live := liveCalls(b); live != 1 {
				t.Fatalf("%d live reads", live)
			}
			if ds[0].Evidence[EvCredentialLapse] == "" {
				t.Fatalf("evidence %v", ds[0].Evidence)
			}
		}},
		{name: "PendingPodBeforeMargin_Defers", edition: kube, arrange: func(b *bundle) sdk.Attempt {
			a := b.h.Queued("r", "t", 8*time.Minute-time.Second)
			b.h.Exec.Pending(a)
			return a
		}, want: sdk.LabelDispatchLostPodAlive, wantState: queued},
		{name: "RunningPodNearCredentialLapse_Defers", edition: kube, arrange: func(b *bundle) sdk.Attempt {
			a := b.h.Queued("r", "t", 9*time.Minute)
			b.h.Exec.Alive(a)
			return a
		}, want: sdk.LabelDispatchLostPodAlive, wantState: queued, check: noActions},
		{name: "PendingInCacheRunningLive_Defers", edition: kube, arrange: func(b *bundle) sdk.Attempt {
			a := b.h.Queued("r", "t", 9*time.Minute)
			b.h.Exec.Pending(a)
			b.h.Exec.SetLiveRead(a, sdk.AttemptLiveness{State: sdk.Alive, Agent: sdk.Alive, Detail: "pod Running"})
			return a
		}, want: sdk.LabelDispatchLostPodAlive, wantState: queued, check: noActions},
		{name: "NearLapseReadError_Defers", edition: kube, arrange: func(b *bundle) sdk.Attempt {
			a := b.h.Queued("r", "t", 9*time.Minute)
			b.h.Exec.Pending(a)
			b.h.Exec.SetLiveRead(a, sdk.AttemptLiveness{State: sdk.Unknown, Detail: "get pods: timeout"})
			return a
		}, want: sdk.LabelDispatchLostPodQueryErr, wantState: queued, check: noActions},
		{name: "StartExpiryDisabled_Defers", edition: kube, values: sdk.Values{AttrStartExpiry: false}, arrange: func(b *bundle) sdk.Attempt {
			a := b.h.Queued("r", "t", 9*time.Minute)
			b.h.Exec.Pending(a)
			return a
		}, want: sdk.LabelDispatchLostPodAlive, wantState: queued},
		{name: "TeardownFails_PodDeleteErrorMarkStays", edition: kube, arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.h.Exec.ScriptTeardown(a, nil, errors.New("forbidden"))
			return a
		}, want: sdk.LabelDispatchLost + "," + sdk.LabelDispatchLostPodDeleteErr, wantState: failed},
		{name: "DeleteFallback_Recorded", edition: kube, arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.h.Exec.ScriptTeardown(a, []sdk.TeardownOutcome{{Object: "pod/p", Action: sdk.TeardownDeleteFallback}}, nil)
			return a
		}, want: sdk.LabelDispatchLost + "," + sdk.LabelTeardownDeleteFallback, wantState: failed},
		{name: "ReQueuedBetweenListAndMark_NewAttemptUntouched", edition: kube, arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.h.Board.OnMark(func(m sdk.Mark) {
				b.h.Board.Replace(m.RunID, m.TaskID, false, queued, b.h.Now())
				b.h.Board.Update(m.RunID, m.TaskID, func(ti *sdktest.TaskInstance) { ti.QueuedAt = b.h.Now() })
			})
			return a
		}, want: sdk.LabelMarkNoop, wantState: queued, check: noActions},
	})
}

func TestDryRunWritesNothing(t *testing.T) {
	t.Parallel()
	for _, edition := range []string{ladder.EditionLite, kube} {
		t.Run(edition, func(t *testing.T) {
			t.Parallel()
			b := setup(t, edition, nil)
			b.h.DryRun = true
			b.h.Queued("dead", "t", 4*time.Minute)
			orphan := b.h.Queued("orphan", "t", 4*time.Minute)
			b.h.Exec.Orphaned(orphan)
			pending := b.h.Queued("pending", "t", 9*time.Minute)
			b.h.Exec.Pending(pending)
			ds := b.reap(t)
			if len(ds) != 3 {
				t.Fatalf("decisions %v", ds.Labels())
			}
			for _, d := range ds {
				if !d.DryRun || d.Applied {
					t.Fatalf("decision %+v", d)
				}
			}
			if b.h.Board.Writes() != 0 || b.h.Exec.Actions() != 0 {
				t.Fatalf("writes=%d actions=%d", b.h.Board.Writes(), b.h.Exec.Actions())
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
			out[i] = b.h.Queued(fmt.Sprintf("r%04d", i), "t", 7*time.Minute-time.Duration(i)*time.Second)
			b.h.Exec.Alive(out[i])
		}
		return out
	}

	t.Run("CursorCarriedBetweenPasses", func(t *testing.T) {
		t.Parallel()
		b := setup(t, ladder.EditionLite, sdk.Values{"drain_max_pages": float64(1)})
		as := putAlive(b, 250)
		for pass, first := range []int{0, 100, 200, 0} {
			if ds := b.reap(t); ds[0].Attempt != as[first] {
				t.Fatalf("pass %d starts at %v, want %v", pass, ds[0].Attempt, as[first])
			}
		}
	})
	t.Run("ShortPageResetsCursor", func(t *testing.T) {
		t.Parallel()
		b := setup(t, ladder.EditionLite, sdk.Values{"drain_max_pages": float64(1)})
		putAlive(b, 130)
		b.reap(t)
		if ds := b.reap(t); len(ds) != 30 || b.h.StateOf(Name) != nil {
			t.Fatalf("second pass judged %d, state %s", len(ds), b.h.StateOf(Name))
		}
	})
	t.Run("LostDispatchBehind150LivePods_ReachedOnSecondPage", func(t *testing.T) {
		t.Parallel()
		b := setup(t, kube, sdk.Values{"drain_max_pages": float64(1)})
		putAlive(b, 150)
		newer := b.h.Queued("newer", "t", 4*time.Minute)
		if ds := b.reap(t); ds.Label(newer) != "" {
			t.Fatalf("first pass: %q", ds.Label(newer))
		}
		if ds := b.reap(t); ds.Label(newer) != sdk.LabelDispatchLost {
			t.Fatalf("second pass: %q", ds.Label(newer))
		}
	})
	t.Run("DrainReachesAll2500InOnePass", func(t *testing.T) {
		t.Parallel()
		b := setup(t, ladder.EditionLite, nil)
		for i := range 2500 {
			b.h.Queued(fmt.Sprintf("r%04d", i), "t", 10*time.Minute)
		}
		if ds := b.reap(t); ds.Count(sdk.LabelDispatchLost) != 2500 || b.h.StateOf(Name) != nil {
			t.Fatalf("marked %d, state %s", ds.Count(sdk.LabelDispatchLost), b.h.StateOf(Name))
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
	a := b.h.Queued("r", "t", 5*time.Minute)
	b.h.Exec.Orphaned(a)
	b.h.Exec.ScriptStop(a, sdk.StopResult{InFlight: true, Detail: "stopping group 42: begun 9s ago, goes on"}, nil)

	ds := b.reap(t)
	if ds.Label(a) != sdk.LabelDispatchLostProcessAlive || b.h.Board.Row(a).State != sdk.StateQueued {
		t.Fatalf("first pass: %+v, row %s", ds, b.h.Board.Row(a).State)
	}
	if ev := ds.For(a)[0].Evidence[reap.EvStop]; !strings.HasPrefix(ev, "in flight") {
		t.Fatalf("stop evidence %q", ev)
	}
	b.h.Exec.Dead(a) // the stop went on in the substrate and is over
	b.h.Clock.Advance(30 * time.Second)
	ds = b.reap(t)
	if ds.Label(a) != sdk.LabelDispatchLostOrphanStopped || b.h.Board.Row(a).State != sdk.StateFailed {
		t.Fatalf("later pass: %+v, row %s", ds, b.h.Board.Row(a).State)
	}
	if len(b.h.StateOf(Name)) != 0 {
		t.Fatalf("state still carries %s", b.h.StateOf(Name))
	}
}

// The pod UID the runner recorded on the attempt reaches the substrate with
// every liveness read and pins the teardown to that pod, so a pod someone
// else made with the attempt's labels neither keeps it alive nor is torn
// down.
func TestTheRecordedPodUIDPinsTheLivenessReadAndTheTeardown(t *testing.T) {
	t.Parallel()
	b := setup(t, ladder.EditionKube, nil)
	a := b.h.Queued("r", "t", 4*time.Minute)
	b.h.Board.Update(a.RunID, a.TaskID, func(ti *sdktest.TaskInstance) { ti.PodUID = "uid-own" })
	ds := b.reap(t)
	if ds.Applied().Count(sdk.LabelDispatchLost) != 1 {
		t.Fatalf("decisions %v", ds)
	}
	calls := b.h.Exec.LivenessCalls()
	if len(calls) == 0 {
		t.Fatal("no liveness read")
	}
	for _, c := range calls {
		if c.PodUIDs[a] != "uid-own" {
			t.Fatalf("liveness request %+v, want the recorded pod UID", c)
		}
	}
	tds := b.h.Exec.Teardowns()
	if len(tds) != 1 || tds[0].PodUID != "uid-own" {
		t.Fatalf("teardowns %+v, want one pinned to the recorded pod UID", tds)
	}
}

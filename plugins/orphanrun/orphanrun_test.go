package orphanrun

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/plugins/dispatchlost"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/reap"
	"github.com/dexaflow/reaper/sdk/sdktest"
)

type bundle = sdktest.Rig[*Reaper]

func setup(t testing.TB, edition string, values sdk.Values) *bundle {
	return sdktest.NewRig(t, edition, New(nil), values)
}

// quietRun puts run id, started an hour ago, with the given rows; a row's
// zero times stay NULL, and every set time is the caller's.
func quietRun(b *bundle, id string, rows ...sdktest.TaskInstance) sdk.Attempt {
	b.H.Board.PutRun(sdktest.Run{RunID: id, DagID: "dag", StartedAt: b.H.Now().Add(-time.Hour)})
	for i, row := range rows {
		row.RunID = id
		if row.TaskID == "" {
			row.TaskID = fmt.Sprintf("t%d", i)
		}
		b.H.Board.Put(row)
	}
	return sdk.Attempt{RunID: id}
}

func TestRules(t *testing.T) {
	t.Parallel()
	ago := func(b *bundle, d time.Duration) time.Time { return b.H.Now().Add(-d) }
	settled := func(b *bundle) sdktest.TaskInstance {
		return sdktest.TaskInstance{State: sdk.StateSuccess, RunningAt: ago(b, 40*time.Minute), EndedAt: ago(b, 30*time.Minute)}
	}
	cases := []sdktest.Rule[*Reaper]{
		{Name: "AllSettledAndQuiet_RunFailed", Arrange: func(b *bundle) sdk.Attempt {
			return quietRun(b, "r", settled(b), sdktest.TaskInstance{State: sdk.StateSkipped})
		}, Want: sdk.LabelOrphanRun, WantRun: sdk.RunFailed, Check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
			d := ds.For(a)[0]
			if !d.Applied || d.Evidence[reap.EvActivityAge] != "30m0s" || d.Evidence[reap.EvThreshold] != "5m0s" || d.Evidence[reap.EvTerm] != "1" {
				t.Fatalf("decision %+v", d)
			}
			if r, _ := b.H.Board.Run("r"); !strings.HasPrefix(r.FailedBy, sdk.LabelOrphanRun+":") || !r.EndedAt.Equal(b.H.Now()) {
				t.Fatalf("run %+v", r)
			}
			if n := len(b.H.Exec.Teardowns()); n != 0 {
				t.Fatalf("lite tore down %d", n)
			}
		}},
		{Name: "NeverStartedNoneDoesNotKeepRunAlive", Arrange: func(b *bundle) sdk.Attempt {
			return quietRun(b, "r", settled(b), sdktest.TaskInstance{State: sdk.StateNone})
		}, Want: sdk.LabelOrphanRun, WantRun: sdk.RunFailed},
		{Name: "QuietWithinThreshold_NotJudged", Arrange: func(b *bundle) sdk.Attempt {
			return quietRun(b, "r", sdktest.TaskInstance{State: sdk.StateSuccess, EndedAt: ago(b, 5*time.Minute)})
		}, Want: "", WantRun: sdk.RunRunning},
		{Name: "ScheduledKeepsRunAlive", Arrange: func(b *bundle) sdk.Attempt {
			return quietRun(b, "r", settled(b), sdktest.TaskInstance{State: sdk.StateScheduled})
		}, Want: "", WantRun: sdk.RunRunning},
		{Name: "StaleQueuedKeepsRunAlive", Arrange: func(b *bundle) sdk.Attempt {
			return quietRun(b, "r", sdktest.TaskInstance{State: sdk.StateQueued, QueuedAt: ago(b, time.Hour)})
		}, Want: "", WantRun: sdk.RunRunning},
		{Name: "SilentRunningKeepsRunAlive", Arrange: func(b *bundle) sdk.Attempt {
			return quietRun(b, "r", sdktest.TaskInstance{State: sdk.StateRunning, RunningAt: ago(b, time.Hour), LastHeartbeatAt: ago(b, time.Hour)})
		}, Want: "", WantRun: sdk.RunRunning},
		{Name: "ParkedUpForRetry_KeepsRunAlive", Arrange: func(b *bundle) sdk.Attempt {
			return quietRun(b, "r", sdktest.TaskInstance{State: sdk.StateUpForRetry, EndedAt: ago(b, 20*time.Minute)})
		}, Want: "", WantRun: sdk.RunRunning},
		{Name: "ParkedUpForReschedule_KeepsRunAlive", Arrange: func(b *bundle) sdk.Attempt {
			return quietRun(b, "r", sdktest.TaskInstance{State: sdk.StateUpForReschedule, EndedAt: ago(b, 20*time.Minute)})
		}, Want: "", WantRun: sdk.RunRunning},
		{Name: "ParkedDeferred_KeepsRunAlive", Arrange: func(b *bundle) sdk.Attempt {
			return quietRun(b, "r", sdktest.TaskInstance{State: sdk.StateDeferred})
		}, Want: "", WantRun: sdk.RunRunning},
		{Name: "ProvisionalInfraMarkInsideTheValve_KeepsRunAlive", Arrange: func(b *bundle) sdk.Attempt {
			return quietRun(b, "r", sdktest.TaskInstance{State: sdk.StateFailed, LastFailureKind: sdk.FailureInfra,
				QueuedAt: ago(b, 20*time.Minute), InfraMarkedAt: ago(b, time.Minute), EndedAt: ago(b, time.Minute)})
		}, Want: "", WantRun: sdk.RunRunning},
		{Name: "ProvisionalInfraMarkPastTheValve_RunFailed", Arrange: func(b *bundle) sdk.Attempt {
			return quietRun(b, "r", sdktest.TaskInstance{State: sdk.StateFailed, LastFailureKind: sdk.FailureInfra,
				InfraMarkedAt: ago(b, 20*time.Minute), EndedAt: ago(b, 20*time.Minute)})
		}, Want: sdk.LabelOrphanRun, WantRun: sdk.RunFailed},
		{Name: "ReplaceableInfraMark_KeepsRunAlive", Arrange: func(b *bundle) sdk.Attempt {
			return quietRun(b, "r", sdktest.TaskInstance{State: sdk.StateFailed, LastFailureKind: sdk.FailureInfra,
				InfraMarkedAt: ago(b, 20*time.Minute), InfraConfirmedAt: ago(b, 20*time.Minute),
				EndedAt: ago(b, 20*time.Minute), InfraBudget: 3, InfraUsed: 2})
		}, Want: "", WantRun: sdk.RunRunning},
		{Name: "HeldForReview_KeepsRunAlive", Arrange: func(b *bundle) sdk.Attempt {
			return quietRun(b, "r", sdktest.TaskInstance{State: sdk.StateFailed, LastFailureKind: sdk.FailureInfra,
				InfraMarkedAt: ago(b, 20*time.Minute), InfraConfirmedAt: ago(b, 20*time.Minute),
				EndedAt: ago(b, 20*time.Minute), Held: true})
		}, Want: "", WantRun: sdk.RunRunning},
		{Name: "ConfirmedInfraMark_RunFailed", Arrange: func(b *bundle) sdk.Attempt {
			return quietRun(b, "r", sdktest.TaskInstance{State: sdk.StateFailed, LastFailureKind: sdk.FailureInfra,
				InfraMarkedAt: ago(b, 20*time.Minute), InfraConfirmedAt: ago(b, 20*time.Minute), EndedAt: ago(b, 20*time.Minute)})
		}, Want: sdk.LabelOrphanRun, WantRun: sdk.RunFailed},
		{Name: "ReleasedAtCountsAsActivity", Arrange: func(b *bundle) sdk.Attempt {
			// Released back to none for another attempt a moment ago: its
			// per-attempt times are cleared, but the release is activity.
			return quietRun(b, "r", sdktest.TaskInstance{State: sdk.StateNone, Try: 2, ReleasedAt: ago(b, 10*time.Second)})
		}, Want: "", WantRun: sdk.RunRunning},
		{Name: "ParkedBetweenListAndReap_OrphanReapNoop", Arrange: func(b *bundle) sdk.Attempt {
			a := quietRun(b, "r", sdktest.TaskInstance{TaskID: "t", State: sdk.StateFailed, LastFailureKind: sdk.FailureTask,
				RunningAt: ago(b, 40*time.Minute), EndedAt: ago(b, 30*time.Minute)})
			b.H.Board.OnReapRun(func(sdk.RunReap) {
				b.H.Board.Update("r", "t", func(ti *sdktest.TaskInstance) { ti.State = sdk.StateUpForRetry })
			})
			return a
		}, Want: sdk.LabelOrphanReapNoop, WantRun: sdk.RunRunning, Check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
			if d := ds.For(a)[0]; d.Applied || d.Evidence[reap.EvNoopReason] != sdk.NoopActive {
				t.Fatalf("decision %+v", d)
			}
		}},
		{Name: "FreshActivityBetweenListAndReap_OrphanReapNoop", Arrange: func(b *bundle) sdk.Attempt {
			a := quietRun(b, "r", settled(b))
			b.H.Board.OnReapRun(func(sdk.RunReap) {
				b.H.Board.Put(sdktest.TaskInstance{RunID: "r", TaskID: "late", State: sdk.StateNone, ReleasedAt: b.H.Now()})
			})
			return a
		}, Want: sdk.LabelOrphanReapNoop, WantRun: sdk.RunRunning},
		{Name: "RowsLockedByAnotherWriter_OrphanReapNoop", Arrange: func(b *bundle) sdk.Attempt {
			a := quietRun(b, "r", settled(b))
			b.H.Board.LockRun("r", true)
			return a
		}, Want: sdk.LabelOrphanReapNoop, WantRun: sdk.RunRunning, Check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
			if d := ds.For(a)[0]; d.Evidence[reap.EvNoopReason] != sdk.NoopLocked {
				t.Fatalf("decision %+v", d)
			}
		}},
		{Name: "FinalizedBetweenListAndReap_OrphanReapNoop", Arrange: func(b *bundle) sdk.Attempt {
			a := quietRun(b, "r", settled(b))
			b.H.Board.OnReapRun(func(sdk.RunReap) {
				b.H.Board.UpdateRun("r", func(r *sdktest.Run) { r.State = sdk.RunSuccess })
			})
			return a
		}, Want: sdk.LabelOrphanReapNoop, WantRun: sdk.RunSuccess},
		{Name: "DeposedTerm_OrphanReapNoop", Arrange: func(b *bundle) sdk.Attempt {
			b.H.Board.SetTerm(9)
			return quietRun(b, "r", settled(b))
		}, Want: sdk.LabelOrphanReapNoop, WantRun: sdk.RunRunning},
		{Name: "AttachedAttemptsInEvidence", Arrange: func(b *bundle) sdk.Attempt {
			return quietRun(b, "r", sdktest.TaskInstance{State: sdk.StateFailed, LastFailureKind: sdk.FailureTask,
				RunningAt: ago(b, 40*time.Minute), EndedAt: ago(b, 30*time.Minute)})
		}, Want: sdk.LabelOrphanRun, WantRun: sdk.RunFailed, Check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
			if d := ds.For(a)[0]; d.Evidence[reap.EvAttached] != "1" {
				t.Fatalf("decision %+v", d)
			}
		}},
		{Name: "KubeTearsDownEveryExecutionOfTheRun", Edition: ladder.EditionKube, Arrange: func(b *bundle) sdk.Attempt {
			return quietRun(b, "r", settled(b))
		}, Want: sdk.LabelOrphanRun, WantRun: sdk.RunFailed, Check: func(t *testing.T, b *bundle, _ sdk.Attempt, _ sdktest.Decisions) {
			if td := b.H.Exec.Teardowns(); len(td) != 1 || td[0].RunID != "r" || td[0].Attempt != nil || td[0].Reason != sdk.LabelOrphanRun {
				t.Fatalf("teardowns %+v", td)
			}
		}},
		{Name: "KubeNoopNeverTearsDown", Edition: ladder.EditionKube, Arrange: func(b *bundle) sdk.Attempt {
			a := quietRun(b, "r", settled(b))
			b.H.Board.LockRun("r", true)
			return a
		}, Want: sdk.LabelOrphanReapNoop, WantRun: sdk.RunRunning, Check: func(t *testing.T, b *bundle, _ sdk.Attempt, _ sdktest.Decisions) {
			if n := b.H.Exec.Actions(); n != 0 {
				t.Fatalf("%d teardowns", n)
			}
		}},
		{Name: "KubeTeardownFails_ReapStands_DeleteErrorRecorded", Edition: ladder.EditionKube, Arrange: func(b *bundle) sdk.Attempt {
			b.H.Exec.ScriptRunTeardown("r", nil, errors.New("apiserver unavailable"))
			return quietRun(b, "r", settled(b))
		}, Want: sdk.LabelOrphanRun + "," + sdk.LabelOrphanRunPodDeleteErr, WantRun: sdk.RunFailed, Check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
			if d := ds.For(a)[0]; !strings.Contains(d.Evidence[reap.EvTeardown], "apiserver unavailable") {
				t.Fatalf("decision %+v", d)
			}
			if d := ds.For(a)[1]; d.Applied || !strings.Contains(d.Detail, "apiserver unavailable") {
				t.Fatalf("delete error decision %+v", d)
			}
		}},
		{Name: "KubeDeleteFallback_Recorded", Edition: ladder.EditionKube, Arrange: func(b *bundle) sdk.Attempt {
			b.H.Exec.ScriptRunTeardown("r", []sdk.TeardownOutcome{{Object: "pod/a", Action: sdk.TeardownDeleteFallback},
				{Object: "pod/b", Action: sdk.TeardownSkipTerminal}}, nil)
			return quietRun(b, "r", settled(b))
		}, Want: sdk.LabelOrphanRun + "," + sdk.LabelTeardownDeleteFallback, WantRun: sdk.RunFailed},
	}
	sdktest.RunRules(t, setup, cases)
}

// A scheduler crash mid-tick leaves a run's task queued: dispatch-lost
// fails it first (on Lite the host confirms the mark as made, on the
// substrate's word that nothing of the attempt runs), and orphan-run fails
// the run once the mark itself is older than the orphan threshold.
// A dispatch-lost mark is the reaper's, not the run's activity: once the
// mark leaves the run nothing live (its infra budget spent), the next
// orphan-run pass fails the run, measured from the queueing, not from the
// mark. With budget left the planner will re-place the attempt, and the run
// lives on.
func TestLostDispatchThenOrphanRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		budget  int32
		wantRun string
	}{
		{name: "BudgetSpent_RunFailedOnTheNextPass", budget: 0, wantRun: sdk.RunFailed},
		{name: "BudgetLeft_RunLivesUntilTheReplace", budget: 1, wantRun: sdk.RunRunning},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, ladder.EditionLite, nil)
			dl := dispatchlost.New(nil)
			b.H.Board.PutRun(sdktest.Run{RunID: "r", StartedAt: b.H.Now().Add(-10 * time.Minute)})
			stuck := b.H.Queued("r", "t", 10*time.Minute)
			row, _ := b.H.Board.Task("r", "t")
			row.InfraBudget = tc.budget
			b.H.Board.Put(row)

			if ds := b.Reap(t); len(ds) != 0 {
				t.Fatalf("a queued task keeps the run alive: %v", ds.Labels())
			}
			if ds, err := b.H.Reap(ctx, dl); err != nil || ds.Label(stuck) != sdk.LabelDispatchLost {
				t.Fatalf("dispatch-lost: %v %v", ds.Labels(), err)
			}
			// The host confirms the mark as made (Lite: the substrate reads
			// its agent dead); this harness has no host, so it does so here.
			if res, err := b.H.Board.ConfirmInfra(ctx, []sdk.Confirm{{Attempt: stuck, Term: b.H.Term, At: b.H.Now()}}); err != nil ||
				len(res) != 1 || !res[0].Applied {
				t.Fatalf("the sweep's confirmation: %+v %v", res, err)
			}
			b.Reap(t)
			if r, _ := b.H.Board.Run("r"); r.State != tc.wantRun {
				t.Fatalf("run %s after the mark's pass, want %s", r.State, tc.wantRun)
			}
			if tc.wantRun == sdk.RunRunning {
				b.H.Clock.Advance(time.Hour)
				b.Reap(t)
				if r, _ := b.H.Board.Run("r"); r.State != sdk.RunRunning {
					t.Fatalf("a re-placeable mark let the run fail: %s", r.State)
				}
			}
		})
	}
}

func TestDryRunWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, ladder.EditionKube, nil)
	b.H.DryRun = true
	a := quietRun(b, "r", sdktest.TaskInstance{State: sdk.StateSuccess, EndedAt: b.H.Now().Add(-time.Hour)})
	ds := b.Reap(t)
	if d := ds.For(a); len(d) != 1 || d[0].Label != sdk.LabelOrphanRun || d[0].Applied || !d[0].DryRun {
		t.Fatalf("decisions %+v", ds)
	}
	if b.H.Board.Writes() != 0 || b.H.Exec.Actions() != 0 {
		t.Fatalf("writes=%d actions=%d", b.H.Board.Writes(), b.H.Exec.Actions())
	}
}

func TestPaging(t *testing.T) {
	t.Parallel()
	quiet := func(b *bundle, n int) []sdk.Attempt {
		out := make([]sdk.Attempt, n)
		for i := range n {
			id := fmt.Sprintf("r%04d", i)
			b.H.Board.PutRun(sdktest.Run{RunID: id, StartedAt: b.H.Now().Add(-time.Hour + time.Duration(i)*time.Second)})
			out[i] = sdk.Attempt{RunID: id}
		}
		return out
	}
	t.Run("CursorCarriedBetweenPasses", func(t *testing.T) {
		t.Parallel()
		b := setup(t, ladder.EditionLite, sdk.Values{"drain_max_pages": float64(1)})
		runs := quiet(b, 250)
		for _, r := range runs {
			b.H.Board.LockRun(r.RunID, true) // every reap a no-op, so the runs stay listed
		}
		b.ExpectPassesStartAt(t, runs[0], runs[100], runs[200], runs[0])
	})
	t.Run("DrainReachesAll2500InOnePass", func(t *testing.T) {
		t.Parallel()
		b := setup(t, ladder.EditionLite, nil)
		quiet(b, 2500)
		if ds := b.Reap(t); ds.Count(sdk.LabelOrphanRun) != 2500 || b.H.StateOf(Name) != nil {
			t.Fatalf("failed %d runs, state %s", ds.Count(sdk.LabelOrphanRun), b.H.StateOf(Name))
		}
	})
	t.Run("BoardErrorFailsPass", func(t *testing.T) {
		t.Parallel()
		b := setup(t, ladder.EditionLite, nil)
		quiet(b, 3)
		b.H.Board.Fail(sdktest.OpReapRun, errors.New("serialization failure"))
		if _, err := b.H.Reap(context.Background(), b.R); err == nil || !strings.Contains(err.Error(), "serialization failure") {
			t.Fatalf("err %v", err)
		}
	})
}

func TestConfigure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := sdktest.New(ladder.EditionLite)
	if err := h.Configure(ctx, New(nil), sdk.Values{"drain_max_pages": float64(5)}); err != nil {
		t.Fatal(err)
	}
	for key, v := range map[string]any{"drain_max_pages": "many", "policy": "hold"} {
		if err := h.Configure(ctx, New(nil), sdk.Values{key: v}); err == nil || !strings.Contains(err.Error(), `"`+key+`"`) {
			t.Fatalf("%s: err %v", key, err)
		}
	}
}

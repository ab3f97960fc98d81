package podlost

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

func setup(t testing.TB, values sdk.Values) *bundle {
	return sdktest.NewRig(t, ladder.EditionKube, New(nil), values)
}

// kubeSetup is setup for sdktest.RunRules: the plugin serves kube only,
// so every rule runs on kube.
func kubeSetup(t testing.TB, _ string, values sdk.Values) *bundle { return setup(t, values) }

const (
	failed  = sdk.StateFailed
	running = sdk.StateRunning
)

// lost is a running kube attempt past the floor that heartbeats; the
// scripted substrate reads it dead unless told otherwise.
func lost(b *bundle) sdk.Attempt { return b.H.Running("r", "t", 2*time.Minute, 10*time.Second) }

func TestRules(t *testing.T) {
	t.Parallel()
	sdktest.RunRules(t, kubeSetup, []sdktest.Rule[*Reaper]{
		{Name: "NoPodObjectPastFloor_PodLostProvisionalThenTornDown", Arrange: lost, Want: sdk.LabelPodLost, WantState: failed,
			Check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
				row := b.H.Board.Row(a)
				if row.LastFailureKind != sdk.FailureInfra || row.MarkReason != sdk.LabelPodLost || !row.InfraConfirmedAt.IsZero() || row.Held {
					t.Fatalf("row %+v", row)
				}
				m := b.H.Board.Marks()[0]
				if m.Confirm || m.Kind != sdk.MarkInfra || len(m.FromStates) != 1 || m.FromStates[0] != running || m.Term != 1 ||
					!strings.HasPrefix(m.Message, sdk.LabelPodLost+": ") {
					t.Fatalf("mark %+v", m)
				}
				tds := b.H.Exec.Teardowns()
				if len(tds) != 1 || tds[0].Attempt == nil || *tds[0].Attempt != a || tds[0].Reason != sdk.LabelPodLost {
					t.Fatalf("teardowns %+v", tds)
				}
				if ev := ds[0].Evidence; ev[reap.EvSignal] != reap.SignalPositive || ev[reap.EvLiveness] != string(sdk.Dead) {
					t.Fatalf("evidence %v", ev)
				}
			}},
		{Name: "InsideFloor_NotListed", Arrange: func(b *bundle) sdk.Attempt {
			return b.H.Running("r", "t", time.Minute, 5*time.Second)
		}, Want: "", WantState: running, Check: func(t *testing.T, b *bundle, _ sdk.Attempt, _ sdktest.Decisions) {
			if n := len(b.H.Exec.LivenessCalls()); n != 0 {
				t.Fatalf("%d liveness reads for an attempt inside the floor", n)
			}
		}},
		{Name: "PodPresent_NoDecisionNoMark", Arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.H.Exec.Alive(a)
			return a
		}, Want: "", WantState: running, Check: noTeardown},
		{Name: "FinishedPodPresent_NoMark", Arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.H.Exec.Set(a, sdk.AttemptLiveness{State: sdk.Alive, Agent: sdk.Alive,
				Detail: "pod p Succeeded present: a finished or unreachable pod is the reconciler's"})
			return a
		}, Want: "", WantState: running, Check: noTeardown},
		{Name: "NeverHeartbeatedPodPresent_PodPresentDeferred", Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.RunningNeverHeartbeated("r", "t", 2*time.Minute)
			b.H.Exec.Pending(a)
			return a
		}, Want: sdk.LabelPodLostPodPresent, WantState: running, Check: noTeardown},
		{Name: "NeverHeartbeatedNodeUnreachableUnderThreshold_PodPresentDeferred", Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.RunningNeverHeartbeated("r", "t", 10*time.Minute)
			b.H.Exec.Set(a, onLostNode(b.H.Now().Add(-NodeUnreachableAfterDefault)))
			return a
		}, Want: sdk.LabelPodLostPodPresent, WantState: running, Check: noTeardown},
		{Name: "NeverHeartbeatedNodeUnreachablePastThreshold_NodeUnreachableDeferredNeverFailed", Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.RunningNeverHeartbeated("r", "t", 10*time.Minute)
			b.H.Exec.Set(a, onLostNode(b.H.Now().Add(-NodeUnreachableAfterDefault-time.Second)))
			return a
		}, Want: sdk.LabelPodLostNodeUnreachable, WantState: running,
			Check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
				noTeardown(t, b, a, ds)
				if n := b.H.Board.Writes(); n != 0 {
					t.Fatalf("%d board writes for a deferral", n)
				}
				d := ds.For(a)[0]
				since := b.H.Now().Add(-NodeUnreachableAfterDefault - time.Second).UTC().Format(time.RFC3339)
				if d.Applied || d.Evidence[reap.EvNode] != "node-7" || d.Evidence[reap.EvNodeUnreachableSince] != since ||
					d.Evidence[evNodeUnreachableFor] != "5m1s" || d.Evidence[evNodeUnreachableAfter] != "5m0s" ||
					!strings.Contains(d.Detail, "node-7") || !strings.Contains(d.Detail, since) {
					t.Fatalf("decision %+v", d)
				}
			}},
		{Name: "NeverHeartbeatedNodeUnreachableShorterThreshold_NodeUnreachableDeferred", Values: sdk.Values{"node_unreachable_after": "1m"},
			Arrange: func(b *bundle) sdk.Attempt {
				a := b.H.RunningNeverHeartbeated("r", "t", 10*time.Minute)
				b.H.Exec.Set(a, onLostNode(b.H.Now().Add(-2*time.Minute)))
				return a
			}, Want: sdk.LabelPodLostNodeUnreachable, WantState: running, Check: noTeardown},
		{Name: "HeartbeatedNodeUnreachable_NoDecision_AgentLostJudgesIt", Arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.H.Exec.Set(a, onLostNode(b.H.Now().Add(-time.Hour)))
			return a
		}, Want: "", WantState: running, Check: noTeardown},
		{Name: "NeverHeartbeatedNodeReadError_PodQueryErrorDeferred", Arrange: func(b *bundle) sdk.Attempt {
			a := b.H.RunningNeverHeartbeated("r", "t", 10*time.Minute)
			b.H.Exec.Set(a, sdk.AttemptLiveness{State: sdk.Alive, Agent: sdk.Alive, Detail: "pod p Running",
				NodeError: "reading node node-7: nodes \"node-7\" is forbidden"})
			return a
		}, Want: sdk.LabelPodLostPodQueryErr, WantState: running,
			Check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
				noTeardown(t, b, a, ds)
				if d := ds.For(a)[0]; !strings.Contains(d.Evidence[reap.EvNodeError], "forbidden") || !strings.Contains(d.Detail, "forbidden") {
					t.Fatalf("decision %+v", d)
				}
			}},
		{Name: "NodeUnreachablePodGone_PodLost", Arrange: func(b *bundle) sdk.Attempt {
			// The out-of-service taint let the cluster delete the pod: the
			// substrate reads no pod, and says nothing of a node.
			return b.H.RunningNeverHeartbeated("r", "t", 10*time.Minute)
		}, Want: sdk.LabelPodLost, WantState: failed},
		{Name: "NeverHeartbeatedNoPod_PodLost", Arrange: func(b *bundle) sdk.Attempt {
			return b.H.RunningNeverHeartbeated("r", "t", 2*time.Minute)
		}, Want: sdk.LabelPodLost, WantState: failed},
		{Name: "PodQueryError_Defers", Arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.H.Exec.Unknown(a, "reading the attempt's pods failed: forbidden")
			return a
		}, Want: sdk.LabelPodLostPodQueryErr, WantState: running, Check: noTeardown},
		{Name: "LivenessCallFails_Defers", Arrange: func(b *bundle) sdk.Attempt {
			b.H.Exec.FailLiveness(errors.New("connection refused"))
			return lost(b)
		}, Want: sdk.LabelPodLostPodQueryErr, WantState: running, Check: noTeardown},
		{Name: "TeardownFails_PodDeleteErrorMarkStays", Arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.H.Exec.ScriptTeardown(a, nil, errors.New("apiserver unavailable"))
			return a
		}, Want: sdk.LabelPodLost + "," + sdk.LabelPodLostPodDeleteErr, WantState: failed},
		{Name: "DeleteFallback_Recorded", Arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.H.Exec.ScriptTeardown(a, []sdk.TeardownOutcome{{Object: "pod/p", Action: sdk.TeardownDeleteFallback}}, nil)
			return a
		}, Want: sdk.LabelPodLost + "," + sdk.LabelTeardownDeleteFallback, WantState: failed},
		{Name: "PolicyHold_MarkHeld", Values: sdk.Values{"policy": "hold"}, Arrange: lost, Want: sdk.LabelPodLost, WantState: failed,
			Check: func(t *testing.T, b *bundle, a sdk.Attempt, _ sdktest.Decisions) {
				if !b.H.Board.Row(a).Held || !b.H.Board.Marks()[0].Hold {
					t.Fatalf("not held: %+v", b.H.Board.Row(a))
				}
			}},
		{Name: "ReplacedBetweenReadAndMark_NewAttemptUntouched", Arrange: func(b *bundle) sdk.Attempt {
			a := lost(b)
			b.H.Board.OnMark(func(m sdk.Mark) { b.H.Board.Replace(m.RunID, m.TaskID, false, running, b.H.Now()) })
			return a
		}, Want: sdk.LabelMarkNoop, WantState: running, Check: noTeardown},
		{Name: "WarmAttempt_NotListed", Arrange: func(b *bundle) sdk.Attempt {
			now := b.H.Now()
			return b.H.Board.Put(sdktest.TaskInstance{RunID: "r", TaskID: "t", State: running, Executor: sdk.ExecutorWarm,
				RunningAt: now.Add(-10 * time.Minute), LastHeartbeatAt: now, WarmWorker: "warm-0"})
		}, Want: "", WantState: running, Check: noTeardown},
		{Name: "QueuedAttempt_NotListed", Arrange: func(b *bundle) sdk.Attempt {
			return b.H.Queued("r", "t", 10*time.Minute)
		}, Want: "", WantState: sdk.StateQueued, Check: noTeardown},
	})
}

// onLostNode is the kube substrate's answer for a pod present on node-7,
// not Ready since since.
func onLostNode(since time.Time) sdk.AttemptLiveness {
	return sdk.AttemptLiveness{State: sdk.Alive, Agent: sdk.Alive, Node: "node-7", NodeUnreachableSince: since,
		Detail: "cached: pod p Running; node not Ready: pod p on node node-7, Ready Unknown since ..."}
}

var noTeardown = sdktest.NoActions[*Reaper]

// The floor is applied in the query: 150 attempts inside it never take a
// page slot from an older one past it.
func TestFloorAppliedBeforeThePageLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var qs []sdk.CandidateQuery
	b.H.Board.OnList(func(q sdk.CandidateQuery) { qs = append(qs, q) })
	for i := range 150 {
		a := b.H.Running("r", fmt.Sprintf("young-%03d", i), 30*time.Second, time.Second)
		b.H.Exec.Alive(a)
	}
	old := lost(b)
	ds := b.Reap(t)
	if ds.Label(old) != sdk.LabelPodLost {
		t.Fatalf("decisions %+v", ds)
	}
	if len(qs) != 1 || !qs[0].OlderThan.Equal(b.H.Now().Add(-ladder.Defaults().PodLostFloor)) ||
		qs[0].OrderBy != sdk.FieldRunningAt || len(qs[0].Executors) != 1 || qs[0].Executors[0] != sdk.ExecutorKube {
		t.Fatalf("queries %+v", qs)
	}
}

// A mass pod loss is drained within the budget: 1,000 lost attempts are
// all marked in one pass, and no brake holds back a mark backed by a live
// read that found no pod.
func TestMassPodLoss_DrainedAndNeverBraked(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for i := range 1000 {
		b.H.Running("r", fmt.Sprintf("t-%04d", i), 5*time.Minute, 10*time.Second)
	}
	ds := b.Reap(t)
	if n := ds.Applied().Count(sdk.LabelPodLost); n != 1000 {
		t.Fatalf("%d marked, want 1000 (brake: %d)", n, ds.Count(sdk.LabelBrakeEngaged))
	}
	if n := len(b.H.Exec.LivenessCalls()); n != 10 {
		t.Fatalf("%d liveness calls for 10 pages", n)
	}
}

// Paging: with drain_max_pages 1, each pass reads the page after the last
// one and a short page sends the next pass back to the start.
func TestPaging_KeysetCursorKeptBetweenPasses(t *testing.T) {
	t.Parallel()
	b := setup(t, sdk.Values{"drain_max_pages": float64(1)})
	for i := range 250 {
		a := b.H.Running("r", fmt.Sprintf("t-%03d", i), 5*time.Minute+time.Duration(250-i)*time.Second, time.Second)
		b.H.Exec.Alive(a)
	}
	var afters []*sdk.Cursor
	b.H.Board.OnList(func(q sdk.CandidateQuery) { afters = append(afters, q.After) })
	for range 4 {
		b.Reap(t)
	}
	if len(afters) != 4 || afters[0] != nil || afters[1] == nil || afters[2] == nil || afters[3] != nil {
		t.Fatalf("cursors %+v", afters)
	}
	if afters[1].TaskID != "t-099" || afters[2].TaskID != "t-199" {
		t.Fatalf("cursors %+v %+v", afters[1], afters[2])
	}
}

// Teardowns follow the pass's marks while the budget lasts; those left over
// are carried in the pass state and done first by the next pass, and a dry
// run never does them.
func TestTeardownsAfterTheMarks_LeftoversCarriedToTheNextPass(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	as := make([]sdk.Attempt, 5)
	for i := range as {
		as[i] = b.H.Running("r", fmt.Sprintf("t-%d", i), 5*time.Minute, 10*time.Second)
	}
	b.H.Budget = 0 // spent before the first teardown
	ds := b.Reap(t)
	if n := ds.Applied().Count(sdk.LabelPodLost); n != 5 || len(b.H.Exec.Teardowns()) != 0 {
		t.Fatalf("marked %d, tore down %d", n, len(b.H.Exec.Teardowns()))
	}
	b.H.DryRun, b.H.Budget = true, 30*time.Second
	b.Reap(t)
	if n := len(b.H.Exec.Teardowns()); n != 0 {
		t.Fatalf("a dry run tore down %d", n)
	}
	b.H.DryRun = false
	b.H.Exec.ScriptTeardown(as[2], nil, errors.New("forbidden"))
	ds = b.Reap(t)
	tds := b.H.Exec.Teardowns()
	if len(tds) != 5 || *tds[0].Attempt != as[0] || *tds[4].Attempt != as[4] {
		t.Fatalf("teardowns %+v", tds)
	}
	if got := strings.Join(ds.For(as[2]).Labels(), ","); got != sdk.LabelPodLostPodDeleteErr || b.H.Board.Row(as[2]).State != failed {
		t.Fatalf("decisions %q, row %+v", got, b.H.Board.Row(as[2]))
	}
	if b.H.StateOf(Name) != nil {
		t.Fatalf("state left: %s", b.H.StateOf(Name))
	}
}

func TestDryRunWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.H.DryRun = true
	a := lost(b)
	ds := b.Reap(t)
	if ds.Label(a) != sdk.LabelPodLost || ds[0].Applied || !ds[0].DryRun {
		t.Fatalf("decisions %+v", ds)
	}
	if b.H.Board.Writes() != 0 || b.H.Exec.Actions() != 0 {
		t.Fatalf("dry run wrote %d, acted %d", b.H.Board.Writes(), b.H.Exec.Actions())
	}
}

func TestConfigure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, tc := range map[string]struct {
		values sdk.Values
		bad    string
	}{
		"Defaults":                      {},
		"Hold":                          {values: sdk.Values{"policy": "hold"}},
		"UnknownPolicy":                 {values: sdk.Values{"policy": "reset"}, bad: "policy"},
		"NegativePages":                 {values: sdk.Values{"drain_max_pages": float64(-1)}, bad: "drain_max_pages"},
		"NodeUnreachableAfter":          {values: sdk.Values{"node_unreachable_after": "90s"}},
		"NodeUnreachableAfterZero":      {values: sdk.Values{"node_unreachable_after": "0s"}, bad: "node_unreachable_after"},
		"NodeUnreachableAfterNegative":  {values: sdk.Values{"node_unreachable_after": "-1m"}, bad: "node_unreachable_after"},
		"NodeUnreachableAfterMalformed": {values: sdk.Values{"node_unreachable_after": "soon"}, bad: "node_unreachable_after"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err := sdktest.New(ladder.EditionKube).Configure(ctx, New(nil), tc.values)
			if tc.bad == "" && err != nil || tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)) {
				t.Fatalf("err %v, want one naming %q", err, tc.bad)
			}
		})
	}
}

// The pod UID the runner recorded on the attempt reaches the substrate with
// the liveness read and pins the teardown to that pod, so a pod someone else
// made with the attempt's labels neither keeps it alive nor is torn down.
func TestTheRecordedPodUIDPinsTheLivenessReadAndTheTeardown(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	a := lost(b)
	b.H.Board.Update(a.RunID, a.TaskID, func(ti *sdktest.TaskInstance) { ti.PodUID = "uid-own" })
	ds := b.Reap(t)
	if ds.Applied().Count(sdk.LabelPodLost) != 1 {
		t.Fatalf("decisions %v", ds)
	}
	calls := b.H.Exec.LivenessCalls()
	if len(calls) == 0 || calls[0].PodUIDs[a] != "uid-own" {
		t.Fatalf("liveness requests %+v, want the recorded pod UID", calls)
	}
	tds := b.H.Exec.Teardowns()
	if len(tds) != 1 || tds[0].PodUID != "uid-own" {
		t.Fatalf("teardowns %+v, want one pinned to the recorded pod UID", tds)
	}
}

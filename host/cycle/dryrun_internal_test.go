package cycle

import (
	"context"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/sdktest"
)

func TestDryRunBoardRefusesTheReconcilersWrites(t *testing.T) {
	ctx := context.Background()
	now := sdktest.T0()
	real := sdktest.NewBoard()
	a := real.Put(sdktest.TaskInstance{RunID: "r", TaskID: "t", State: sdk.StateFailed, Executor: sdk.ExecutorKube,
		LastFailureKind: sdk.FailureInfra, InfraMarkedAt: now.Add(-time.Minute), MarkReason: sdk.LabelPodLost})
	before := real.Row(a)
	dry := dryRunBoard{real}

	page, err := dry.ListProvisional(ctx, sdk.ProvisionalQuery{})
	if err != nil || len(page.Candidates) != 1 {
		t.Fatalf("a dry run still lists: %+v %v", page, err)
	}
	results := map[string]func() ([]sdk.MarkResult, error){
		"Confirm": func() ([]sdk.MarkResult, error) {
			return dry.ConfirmInfra(ctx, []sdk.Confirm{{Attempt: a, Term: 1, At: now}})
		},
		"Override": func() ([]sdk.MarkResult, error) {
			return dry.OverrideInfra(ctx, []sdk.Override{{Attempt: a, MarkedAfter: now.Add(-time.Hour), Term: 1, At: now}})
		},
		"Settle": func() ([]sdk.MarkResult, error) {
			return dry.Settle(ctx, []sdk.Settlement{{Attempt: a, Outcome: sdk.OutcomeSuccess,
				FromStates: []string{sdk.StateFailed}, Term: 1, At: now}})
		},
	}
	for name, write := range results {
		res, err := write()
		if err != nil || len(res) != 1 || res[0].Applied || res[0].NoopReason != noopDryRun || res[0].Attempt != a {
			t.Fatalf("%s in a dry run: %+v %v", name, res, err)
		}
	}
	if real.Row(a) != before || real.Writes() != 0 || len(real.Log(a)) != 0 {
		t.Fatalf("a dry run wrote: %+v (writes %d)", real.Row(a), real.Writes())
	}

	// The pod cache's history is the calibration a dry run is for: it goes
	// through, and changes no state.
	r := real.Put(sdktest.TaskInstance{RunID: "r", TaskID: "running", State: sdk.StateRunning, Executor: sdk.ExecutorKube,
		RunningAt: now.Add(-time.Hour), PodUID: "uid"})
	res, err := dry.RecordPodSightings(ctx, []sdk.PodSighting{{Attempt: r, PodUID: "uid", SeenAt: now.Add(-59 * time.Minute),
		Term: 1, At: now}})
	if err != nil || len(res) != 1 || !res[0].Applied {
		t.Fatalf("pod sightings in a dry run: %+v %v", res, err)
	}
	if got := real.Row(r); got.PodMissingMax != time.Minute || got.State != sdk.StateRunning {
		t.Fatalf("after the sightings: %+v", got)
	}
}

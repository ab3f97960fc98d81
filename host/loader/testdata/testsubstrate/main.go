// Command testsubstrate is a substrate plugin used by the host's tests. It
// takes its name from its file name (reaper-substrate-<name>). It reports
// every attempt dead unless its run id starts with "alive", is always
// synced, stops every orphan, and its sweep lists candidates through the
// host's board (proving the broker callback for substrates).
package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"

	"github.com/dexaflow/reaper/sdk/plugin"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk"
)

type substrate struct{ name string }

func newSubstrate(hclog.Logger) *substrate {
	return &substrate{name: strings.TrimPrefix(filepath.Base(os.Args[0]), "reaper-substrate-")}
}

func (s *substrate) Info(context.Context) (sdk.Info, error) {
	return sdk.Info{Name: s.name, Kind: sdk.KindSubstrate, Version: "test", Editions: []string{"lite", "kube"}}, nil
}

func (s *substrate) ConfigSchema(context.Context) (sdk.Schema, error) {
	return sdk.Schema{Attributes: []sdk.Attribute{{Name: "record_dir", Type: sdk.TypeString, Default: ""}}}, nil
}

func (s *substrate) Configure(context.Context, sdk.ConfigureRequest) error { return nil }

func (s *substrate) Sweep(ctx context.Context, req sdk.SweepRequest, board sdk.Board) (sdk.SweepResult, error) {
	if _, err := board.ListCandidates(ctx, sdk.CandidateQuery{
		States: []string{sdk.StateRunning}, OrderBy: sdk.FieldRunningAt, OlderThan: req.Now,
	}); err != nil {
		return sdk.SweepResult{}, err
	}
	return sdk.SweepResult{}, nil
}

func (s *substrate) Synced(context.Context) (bool, error) { return true, nil }

func (s *substrate) Liveness(_ context.Context, req sdk.LivenessRequest) ([]sdk.AttemptLiveness, error) {
	out := make([]sdk.AttemptLiveness, len(req.Attempts))
	for i, a := range req.Attempts {
		st := sdk.Dead
		if strings.HasPrefix(a.RunID, "alive") {
			st = sdk.Alive
		}
		out[i] = sdk.AttemptLiveness{Attempt: a, State: st, Agent: st, Group: st}
	}
	return out, nil
}

func (s *substrate) Teardown(context.Context, sdk.TeardownRequest) ([]sdk.TeardownOutcome, error) {
	return []sdk.TeardownOutcome{{Action: sdk.TeardownNothing}}, nil
}

func (s *substrate) StopOrphan(context.Context, sdk.StopRequest) (sdk.StopResult, error) {
	return sdk.StopResult{Stopped: true}, nil
}

func (s *substrate) WarmWorkers(context.Context) ([]sdk.WarmWorker, error) { return nil, nil }

func main() { plugin.Serve(newSubstrate) }

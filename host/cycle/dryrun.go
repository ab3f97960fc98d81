package cycle

import (
	"context"

	"github.com/dexaflow/reaper/sdk"
)

// Dry-run is enforced twice: the pass says DryRun so the plugin decides
// without writing, and the board and executions a dry-run plugin is given
// refuse to write or stop anything whatever the plugin does.

const noopDryRun = "dry_run"

type dryRunBoard struct{ sdk.Board }

func (b dryRunBoard) Mark(_ context.Context, marks []sdk.Mark) ([]sdk.MarkResult, error) {
	out := make([]sdk.MarkResult, len(marks))
	for i, m := range marks {
		out[i] = sdk.MarkResult{Attempt: m.Attempt, NoopReason: noopDryRun}
	}
	return out, nil
}

func (b dryRunBoard) ReapRun(context.Context, sdk.RunReap) (sdk.RunReapResult, error) {
	return sdk.RunReapResult{NoopReason: noopDryRun}, nil
}

func (b dryRunBoard) AppendLog(context.Context, int64, []sdk.LogLine) error { return nil }

type dryRunExecutions struct{ sdk.Executions }

func (e dryRunExecutions) Teardown(context.Context, sdk.TeardownRequest) ([]sdk.TeardownOutcome, error) {
	return []sdk.TeardownOutcome{{Action: sdk.TeardownNothing, Error: noopDryRun}}, nil
}

func (e dryRunExecutions) StopOrphan(context.Context, sdk.StopRequest) (sdk.StopResult, error) {
	return sdk.StopResult{Detail: noopDryRun}, nil
}

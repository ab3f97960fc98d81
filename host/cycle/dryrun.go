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
	return dryRunResults(marks, func(m sdk.Mark) sdk.Attempt { return m.Attempt }), nil
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

// The reconciler's writes are refused like marks; listing still reads.

func (b dryRunBoard) ConfirmInfra(_ context.Context, cs []sdk.Confirm) ([]sdk.MarkResult, error) {
	return dryRunResults(cs, func(c sdk.Confirm) sdk.Attempt { return c.Attempt }), nil
}

func (b dryRunBoard) OverrideInfra(_ context.Context, os []sdk.Override) ([]sdk.MarkResult, error) {
	return dryRunResults(os, func(o sdk.Override) sdk.Attempt { return o.Attempt }), nil
}

func (b dryRunBoard) Settle(_ context.Context, ss []sdk.Settlement) ([]sdk.MarkResult, error) {
	return dryRunResults(ss, func(s sdk.Settlement) sdk.Attempt { return s.Attempt }), nil
}

// RecordPodSightings goes through: it is the history reaperctl replay
// calibrates pod_lost_floor by, and a dry run is that calibration. It
// changes no state and decides nothing, as the attempt API keeps recording
// heartbeat silences in a dry run.
func (b dryRunBoard) RecordPodSightings(ctx context.Context, ss []sdk.PodSighting) ([]sdk.MarkResult, error) {
	return b.Board.RecordPodSightings(ctx, ss)
}

// dryRunResults answers every request of a batch as a dry-run no-op.
func dryRunResults[T any](reqs []T, attempt func(T) sdk.Attempt) []sdk.MarkResult {
	out := make([]sdk.MarkResult, len(reqs))
	for i, r := range reqs {
		out[i] = sdk.MarkResult{Attempt: attempt(r), NoopReason: noopDryRun}
	}
	return out
}

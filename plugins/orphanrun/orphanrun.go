// Package orphanrun is the orphan-run reaper: a running run with no live
// task instance and no activity for the orphan_run threshold is failed.
//
// Live means scheduled, queued or running, parked for the scheduler to
// bring back (up_for_retry, up_for_reschedule, deferred), held for review,
// an infra failure the planner will re-place (infra budget left), or a
// provisional infra mark still inside the infra confirmation valve (the
// pass sends the valve's cutoff, now - infra_confirm_valve, with its
// listing and its reaps). Activity is the run's start and every task
// instance's queued, running, heartbeat and release times, and its end
// unless an infra mark ended it: the reapers' own marks are not run
// activity, so a scheduler crash that leaves attempts queued is reaped
// within max(dispatch_lost, orphan_run) + one interval. The board lists runs that looked
// orphaned and re-checks the whole predicate atomically when failing one;
// if anything moved in between, the reap is a no-op (orphan_reap_noop). On
// kube every execution of a failed run is then torn down; attempts still
// attached to it are told to terminate by the control plane.
package orphanrun

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/reap"
)

// Name is the label the reaper is configured under.
const Name = "orphanrun"

// EvRunAge is the evidence key of the time since the run started.
const EvRunAge = "run_age"

const listRuns = "runs"

// Config is the reaper's configuration block.
type Config struct {
	reap.DrainSetting
}

// Reaper is the orphan-run reaper. Its zero value is not usable; call New.
type Reaper struct{ *reap.Base[Config] }

// New returns the reaper with its default configuration. A nil logger
// discards.
func New(logger hclog.Logger) *Reaper {
	return &Reaper{reap.NewBase[Config](logger, nil, sdk.Info{Name: Name, Editions: []string{ladder.EditionLite, ladder.EditionKube}, MarkReasons: []string{sdk.LabelOrphanRun},
		DecisionLabels: []string{sdk.LabelOrphanReapNoop, sdk.LabelOrphanRunPodDeleteErr},
		Description:    "fails running runs with nothing live and no recent activity (orphan_run)"})}
}

// Reap runs one pass: one decision per run judged (its Attempt carries only
// the RunID), plus one per teardown that fell back to a delete.
func (r *Reaper) Reap(ctx context.Context, pass sdk.Pass, board sdk.Board, exec sdk.Executions, sink sdk.Sink) (sdk.PassResult, error) {
	p := &passRun{log: r.Logger(), pass: pass, board: board, exec: exec, rec: reap.NewRecorder(Name, pass, sink),
		olderThan:        pass.Now.Add(-pass.Ladder.OrphanRun),
		provisionalAfter: pass.Now.Add(-pass.Ladder.InfraConfirmValve)}
	q := sdk.RunQuery{OlderThan: p.olderThan, ProvisionalAfter: p.provisionalAfter}
	return reap.Run(ctx, pass, p.rec, reap.Spec{
		Name: Name, Logger: r.Logger(), Stopwatch: r.Stopwatch(), MaxPages: r.Config().MaxPages,
		Listings: []reap.Listing{reap.Runs(listRuns, board, q, p.judgePage)},
	})
}

var _ sdk.Reaper = (*Reaper)(nil)

type passRun struct {
	log       hclog.Logger
	pass      sdk.Pass
	board     sdk.Board
	exec      sdk.Executions
	rec       *reap.Recorder
	olderThan time.Time
	// provisionalAfter is the infra confirmation valve's cutoff: a
	// provisional infra mark made at or before it no longer keeps its run
	// alive, since the planner acts on it unconfirmed.
	provisionalAfter time.Time
}

// judgePage reaps each listed run through the board's atomic re-check.
func (p *passRun) judgePage(ctx context.Context, runs []sdk.RunCandidate) error {
	l := p.pass.Ladder
	for _, run := range runs {
		a := sdk.Attempt{RunID: run.RunID}
		ev := reap.Evidence{
			reap.EvTerm:        strconv.FormatInt(p.pass.Term, 10),
			reap.EvEdition:     p.pass.Edition,
			reap.EvThreshold:   l.OrphanRun.String(),
			reap.EvActivityAge: reap.Age(p.pass.Now, run.LastActivity),
			EvRunAge:           reap.Age(p.pass.Now, run.StartedAt),
		}
		detail := fmt.Sprintf("no live task instance and no activity for %s (threshold %s)",
			reap.Age(p.pass.Now, run.LastActivity), l.OrphanRun)
		if p.pass.DryRun {
			p.rec.Add(sdk.LabelOrphanRun, a, false, detail+" (dry run: not failed)", ev)
			continue
		}
		res, err := p.board.ReapRun(ctx, sdk.RunReap{RunID: run.RunID, OlderThan: p.olderThan,
			ProvisionalAfter: p.provisionalAfter, Term: p.pass.Term,
			At: p.pass.Now, Message: sdk.LabelOrphanRun + ": " + detail})
		if err != nil {
			return fmt.Errorf("reap run %s: %w", run.RunID, err)
		}
		if !res.Applied {
			ev[reap.EvNoopReason] = res.NoopReason
			p.rec.Add(sdk.LabelOrphanReapNoop, a, false, "the run changed since it was listed ("+res.NoopReason+"); nothing written", ev)
			continue
		}
		ev[reap.EvAttached] = strconv.Itoa(len(res.Attached))
		var more []reap.FollowUp
		if p.pass.Edition == ladder.EditionKube {
			more = p.teardown(ctx, run.RunID, ev)
		}
		p.rec.Add(sdk.LabelOrphanRun, a, true, detail, ev)
		for _, f := range more {
			p.rec.Add(f.Label, a, f.Applied, f.Detail, f.Evidence)
		}
	}
	return nil
}

// teardown tears down every execution of a failed run (kube) and returns
// the follow-up decisions: orphan_run_pod_delete_error when it failed (the
// run stays failed: the pods' own deadlines and the reconciler remain the
// backstops), reap_teardown_delete_fallback when a stop in place was
// refused and a pod deleted instead.
func (p *passRun) teardown(ctx context.Context, runID string, ev reap.Evidence) []reap.FollowUp {
	out, err := p.exec.Teardown(ctx, sdk.TeardownRequest{RunID: runID, Reason: sdk.LabelOrphanRun, Term: p.pass.Term})
	more := reap.TeardownFollowUps(out, err, sdk.LabelOrphanRunPodDeleteErr, ev)
	if len(more) > 0 && more[0].Label == sdk.LabelOrphanRunPodDeleteErr {
		p.log.Warn("run failed as orphaned, but tearing down its executions failed", "run", runID, "teardown", ev[reap.EvTeardown])
	}
	return more
}

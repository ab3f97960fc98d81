// Package orphanrun is the orphan-run reaper: a running run with no live
// task instance and no activity for the orphan_run threshold is failed.
//
// Live means scheduled, queued or running, parked for the scheduler to
// bring back (up_for_retry, up_for_reschedule, deferred), or failed with a
// provisional infra mark the reconciler has not confirmed yet. Activity is
// the run's start and every task instance's queued, running, heartbeat,
// end, release and infra-mark times. The board lists runs that looked
// orphaned and re-checks the whole predicate atomically when failing one;
// if anything moved in between, the reap is a no-op (orphan_reap_noop). On
// kube every execution of a failed run is then torn down; attempts still
// attached to it are told to terminate by the control plane.
package orphanrun

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/plugins/internal/reapkit"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// Name is the label the reaper is configured under.
const Name = "orphanrun"

// EvRunAge is the evidence key of the time since the run started.
const EvRunAge = "run_age"

const listRuns = "runs"

type settings struct {
	maxPages int
}

// Reaper is the orphan-run reaper. Its zero value is not usable; call New.
type Reaper struct {
	logger    hclog.Logger
	stopwatch clock.Clock

	cfg atomic.Pointer[settings] // set by Configure, read once a pass
}

var _ sdk.Reaper = (*Reaper)(nil)

// New returns the reaper with its default configuration. A nil logger
// discards.
func New(logger hclog.Logger) *Reaper {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	r := &Reaper{logger: logger, stopwatch: clock.Real{}}
	r.cfg.Store(&settings{})
	return r
}

// Info describes the plugin.
func (r *Reaper) Info(context.Context) (sdk.Info, error) {
	return sdk.Info{Name: Name, Kind: sdk.KindReaper, Version: sdk.BuildVersion,
		Editions:    []string{ladder.EditionLite, ladder.EditionKube},
		Description: "fails running runs with nothing live and no recent activity (orphan_run)"}, nil
}

func schema() sdk.Schema {
	return sdk.Schema{Attributes: []sdk.Attribute{reapkit.DrainAttribute()}}
}

// ConfigSchema declares drain_max_pages.
func (r *Reaper) ConfigSchema(context.Context) (sdk.Schema, error) { return schema(), nil }

// Configure validates and applies the decoded block; an error names the
// offending attribute.
func (r *Reaper) Configure(_ context.Context, req sdk.ConfigureRequest) error {
	if err := reapkit.CheckKnown(schema(), req.Values); err != nil {
		return fmt.Errorf("configure %s: %w", Name, err)
	}
	maxPages, err := reapkit.ParseDrainMaxPages(req.Values)
	if err != nil {
		return fmt.Errorf("configure %s: %w", Name, err)
	}
	r.cfg.Store(&settings{maxPages: maxPages})
	return nil
}

func (r *Reaper) settings() settings { return *r.cfg.Load() }

// Reap runs one pass: one decision per run judged (its Attempt carries only
// the RunID), plus one per teardown that fell back to a delete. On an error
// of the board the decisions made so far are returned with it, and the
// state keeps the cursor of the page that failed.
func (r *Reaper) Reap(ctx context.Context, pass sdk.Pass, board sdk.Board, exec sdk.Executions) (sdk.PassResult, error) {
	p := &passRun{log: r.logger, pass: pass, board: board, exec: exec, rec: reapkit.NewRecorder(Name, pass),
		olderThan: pass.Now.Add(-pass.Ladder.OrphanRun)}
	st, err := reapkit.DecodeState(pass.State)
	if err != nil {
		r.logger.Warn("starting the listing over", "error", err)
	}
	budget := reapkit.NewBudget(r.stopwatch, pass, r.settings().maxPages)
	stats, err := reapkit.Drain(ctx, budget, st, reapkit.Runs(listRuns, board, p.olderThan, p.judgePage))
	state, encErr := st.Encode()
	res := sdk.PassResult{Decisions: p.rec.Decisions(), State: state}
	if err != nil {
		return res, fmt.Errorf("%s pass: %w", Name, err)
	}
	if encErr != nil {
		return res, fmt.Errorf("%s pass: %w", Name, encErr)
	}
	if n := len(res.Decisions); n > 0 {
		r.logger.Debug("pass done", "decisions", n, "pages", stats.Pages, "exhausted", stats.Exhausted, "elapsed", budget.Elapsed())
	}
	return res, nil
}

type passRun struct {
	log       hclog.Logger
	pass      sdk.Pass
	board     sdk.Board
	exec      sdk.Executions
	rec       *reapkit.Recorder
	olderThan time.Time
}

// judgePage reaps each listed run through the board's atomic re-check.
func (p *passRun) judgePage(ctx context.Context, runs []sdk.RunCandidate) error {
	l := p.pass.Ladder
	for _, run := range runs {
		a := sdk.Attempt{RunID: run.RunID}
		ev := reapkit.Evidence{
			reapkit.EvTerm:        strconv.FormatInt(p.pass.Term, 10),
			reapkit.EvEdition:     p.pass.Edition,
			reapkit.EvThreshold:   l.OrphanRun.String(),
			reapkit.EvActivityAge: reapkit.Age(p.pass.Now, run.LastActivity),
			EvRunAge:              reapkit.Age(p.pass.Now, run.StartedAt),
		}
		detail := fmt.Sprintf("no live task instance and no activity for %s (threshold %s)",
			reapkit.Age(p.pass.Now, run.LastActivity), l.OrphanRun)
		if p.pass.DryRun {
			p.rec.Add(sdk.LabelOrphanRun, a, false, detail+" (dry run: not failed)", ev)
			continue
		}
		res, err := p.board.ReapRun(ctx, sdk.RunReap{RunID: run.RunID, OlderThan: p.olderThan, Term: p.pass.Term,
			At: p.pass.Now, Message: sdk.LabelOrphanRun + ": " + detail})
		if err != nil {
			return fmt.Errorf("reap run %s: %w", run.RunID, err)
		}
		if !res.Applied {
			ev[reapkit.EvNoopReason] = res.NoopReason
			p.rec.Add(sdk.LabelOrphanReapNoop, a, false, "the run changed since it was listed ("+res.NoopReason+"); nothing written", ev)
			continue
		}
		ev[reapkit.EvAttached] = strconv.Itoa(len(res.Attached))
		fallback := false
		if p.pass.Edition == ladder.EditionKube {
			fallback = p.teardown(ctx, run.RunID, ev)
		}
		p.rec.Add(sdk.LabelOrphanRun, a, true, detail, ev)
		if fallback {
			p.rec.Add(sdk.LabelTeardownDeleteFallback, a, true, "stopping in place was refused; deleted instead: "+ev[reapkit.EvTeardown], ev.Clone())
		}
	}
	return nil
}

// teardown tears down every execution of a failed run (kube). A failure is
// logged and kept in the evidence; it never undoes the reap (the pods' own
// deadlines and the reconciler remain the backstops). It reports whether a
// stop in place fell back to a delete.
func (p *passRun) teardown(ctx context.Context, runID string, ev reapkit.Evidence) bool {
	out, err := p.exec.Teardown(ctx, sdk.TeardownRequest{RunID: runID, Reason: sdk.LabelOrphanRun, Term: p.pass.Term})
	failed, fallback, summary := reapkit.TeardownTrouble(out, err)
	ev[reapkit.EvTeardown] = summary
	if failed {
		p.log.Warn("run failed as orphaned, but tearing down its executions failed", "run", runID, "teardown", summary)
	}
	return fallback
}

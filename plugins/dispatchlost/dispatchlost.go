// Package dispatchlost is the dispatch-lost reaper: a queued attempt whose
// queued_at is older than the dispatch_lost threshold, and of which nothing
// is running, is failed on the infra rail as dispatch_lost.
//
// A row without queued_at is never judged. On kube a Pending or Running pod
// of the attempt defers (the dispatch landed), an unreadable one defers, and
// a mark rests on a live read; the one exception is a pod still only Pending
// when the credential minted at dispatch is within two minutes of lapsing,
// which is failed as start_expired and deleted. Kube marks are provisional
// and followed by the attempt's teardown. On Lite an alive or unreadable
// agent defers, an orphaned task group is stopped first, and marks are
// confirmed as they are made.
package dispatchlost

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/plugins/internal/reapkit"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// Name is the label the reaper is configured under.
const Name = "dispatchlost"

// AttrStartExpiry is the attribute that turns the start_expired rule off,
// for deployments whose attempt credential is not minted at dispatch.
const AttrStartExpiry = "start_expiry"

// EvCredentialLapse is the evidence key of the attempt credential's lapse.
const EvCredentialLapse = "credential_lapse"

// listQueued names the listing (the key of its cursor in the pass state).
const listQueued = "queued"

type settings struct {
	policy      string
	maxPages    int
	startExpiry bool
}

// Reaper is the dispatch-lost reaper. Its zero value is not usable; call New.
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
	r.cfg.Store(&settings{policy: reapkit.PolicyReplace, startExpiry: true})
	return r
}

// Info describes the plugin.
func (r *Reaper) Info(context.Context) (sdk.Info, error) {
	return sdk.Info{Name: Name, Kind: sdk.KindReaper, Version: sdk.BuildVersion,
		Editions:    []string{ladder.EditionLite, ladder.EditionKube},
		Description: "fails queued attempts whose dispatch never landed (dispatch_lost) or whose pod cannot start in time (start_expired)"}, nil
}

func schema() sdk.Schema {
	return sdk.Schema{Attributes: []sdk.Attribute{
		reapkit.PolicyAttribute(),
		reapkit.DrainAttribute(),
		{Name: AttrStartExpiry, Type: sdk.TypeBool, Default: true,
			Description: "kube: fail as start_expired a pod still Pending when the attempt credential minted at dispatch is within 2 minutes of lapsing; set false when the credential is not minted at dispatch"},
	}}
}

// ConfigSchema declares policy, drain_max_pages and start_expiry.
func (r *Reaper) ConfigSchema(context.Context) (sdk.Schema, error) { return schema(), nil }

// Configure validates and applies the decoded block; an error names the
// offending attribute.
func (r *Reaper) Configure(_ context.Context, req sdk.ConfigureRequest) error {
	if err := reapkit.CheckKnown(schema(), req.Values); err != nil {
		return fmt.Errorf("configure %s: %w", Name, err)
	}
	cfg := settings{startExpiry: true}
	var err error
	if cfg.policy, err = reapkit.ParsePolicy(req.Values); err != nil {
		return fmt.Errorf("configure %s: %w", Name, err)
	}
	if cfg.maxPages, err = reapkit.ParseDrainMaxPages(req.Values); err != nil {
		return fmt.Errorf("configure %s: %w", Name, err)
	}
	if raw, ok := req.Values[AttrStartExpiry]; ok && raw != nil {
		b, isBool := raw.(bool)
		if !isBool {
			return fmt.Errorf("configure %s: attribute %q: must be a bool, got %T", Name, AttrStartExpiry, raw)
		}
		cfg.startExpiry = b
	}
	r.cfg.Store(&cfg)
	return nil
}

func (r *Reaper) settings() settings { return *r.cfg.Load() }

// Reap runs one pass: one decision per attempt judged, plus one per
// teardown that failed or fell back. On an error of the board the decisions
// made so far are returned with it, and the state keeps the cursor of the
// page that failed.
func (r *Reaper) Reap(ctx context.Context, pass sdk.Pass, board sdk.Board, exec sdk.Executions) (sdk.PassResult, error) {
	p := &passRun{cfg: r.settings(), pass: pass, board: board, exec: exec,
		rec: reapkit.NewRecorder(Name, pass), lite: pass.Edition == ladder.EditionLite}
	st, err := reapkit.DecodeState(pass.State)
	if err != nil {
		r.logger.Warn("starting the listing over", "error", err)
	}
	executors := []string{sdk.ExecutorKube}
	if p.lite {
		executors = []string{sdk.ExecutorLite}
	}
	budget := reapkit.NewBudget(r.stopwatch, pass, p.cfg.maxPages)
	stats, err := reapkit.Drain(ctx, budget, st, reapkit.Candidates(listQueued, board, sdk.CandidateQuery{
		States: []string{sdk.StateQueued}, Executors: executors, OrderBy: sdk.FieldQueuedAt,
		OlderThan: pass.Now.Add(-pass.Ladder.DispatchLost),
	}, p.judgePage))
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
	cfg   settings
	pass  sdk.Pass
	board sdk.Board
	exec  sdk.Executions
	rec   *reapkit.Recorder
	lite  bool
}

// judgePage judges one page. On kube it reads the page from the
// substrate's cache first, then reads live only the attempts a mark could
// follow from.
func (p *passRun) judgePage(ctx context.Context, page []sdk.Candidate) error {
	now, l := p.pass.Now, p.pass.Ladder
	attempts := make([]sdk.Attempt, len(page))
	for i, c := range page {
		attempts[i] = c.Attempt
	}
	answers := reapkit.ReadLiveness(ctx, p.exec, now, attempts, false)
	if !p.lite {
		var again []sdk.Attempt
		for _, c := range page {
			if needsLiveRead(c, now, l, answers[c.Attempt], p.cfg.startExpiry) {
				again = append(again, c.Attempt)
			}
		}
		for a, ans := range reapkit.ReadLiveness(ctx, p.exec, now, again, true) {
			answers[a] = ans
		}
	}

	var planned []reapkit.Planned
	for _, c := range page {
		live := answers[c.Attempt]
		var j judgment
		if p.lite {
			j = judgeLite(c, now, l, live)
		} else {
			j = judgeKube(c, now, l, live, p.cfg.startExpiry)
		}
		if j.act == actNone {
			continue
		}
		ev := reapkit.CandidateEvidence(p.pass, c, l.DispatchLost).Liveness(live)
		if !p.lite {
			ev[EvCredentialLapse] = credentialLapse(c, l).UTC().Format(time.RFC3339)
		}
		switch j.act {
		case actDefer:
			p.rec.Add(j.label, c.Attempt, false, j.detail, ev)
		case actMark:
			planned = append(planned, p.plan(c, j, ev))
		case actStopThenMark:
			if pl, ok := p.stopOrphan(ctx, c, j, ev); ok {
				planned = append(planned, pl)
			}
		}
	}
	return reapkit.Settle(ctx, p.board, p.rec, planned, p.afterMark)
}

// plan builds the guarded mark: still queued, and still this attempt.
func (p *passRun) plan(c sdk.Candidate, j judgment, ev reapkit.Evidence) reapkit.Planned {
	ev[reapkit.EvMark] = j.reason
	ev[reapkit.EvSignal] = reapkit.SignalPositive
	ev[reapkit.EvPolicy] = p.cfg.policy
	return reapkit.Planned{
		Mark: sdk.Mark{
			Attempt:    c.Attempt,
			FromStates: []string{sdk.StateQueued},
			Kind:       sdk.MarkInfra,
			Reason:     j.reason,
			Message:    j.reason + ": " + j.detail,
			Confirm:    p.lite,
			Hold:       p.cfg.policy == reapkit.PolicyHold,
			Term:       p.pass.Term,
			At:         p.pass.Now,
		},
		Label: j.label, Detail: j.detail, Evidence: ev,
	}
}

// stopOrphan stops an orphaned task group before its attempt is marked; a
// stop that fails or cannot confirm the group gone defers.
func (p *passRun) stopOrphan(ctx context.Context, c sdk.Candidate, j judgment, ev reapkit.Evidence) (reapkit.Planned, bool) {
	if p.pass.DryRun {
		return p.plan(c, j, ev), true
	}
	if !reapkit.StopOrphanGroup(ctx, p.exec, p.rec, c.Attempt, sdk.LabelDispatchLostOrphanStopErr, ev) {
		return reapkit.Planned{}, false
	}
	return p.plan(c, j, ev), true
}

// afterMark tears down a marked kube attempt (for start_expired: deletes
// its Pending pod). Lite has nothing to tear down.
func (p *passRun) afterMark(ctx context.Context, pl *reapkit.Planned) []reapkit.FollowUp {
	if p.lite {
		return nil
	}
	return reapkit.TeardownAttempt(ctx, p.exec, p.pass, pl.Mark.Attempt, pl.Mark.Reason, sdk.LabelDispatchLostPodDeleteErr, pl.Evidence)
}

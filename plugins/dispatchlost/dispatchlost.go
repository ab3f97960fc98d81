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
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/reap"
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

// Config is the reaper's configuration block.
type Config struct {
	reap.PolicySetting
	reap.DrainSetting
	// StartExpiry turns the start_expired rule on (the default) or off.
	StartExpiry bool `reaper:"start_expiry" help:"kube: fail as start_expired a pod still Pending when the attempt credential minted at dispatch is within 2 minutes of lapsing; set false when the credential is not minted at dispatch"`
}

// DefaultConfig is the configuration of a block that sets nothing.
func DefaultConfig() Config {
	return Config{PolicySetting: reap.DefaultPolicy(), StartExpiry: true}
}

// Reaper is the dispatch-lost reaper. Its zero value is not usable; call New.
type Reaper struct{ *reap.Base[Config] }

// New returns the reaper with its default configuration. A nil logger
// discards.
func New(logger hclog.Logger) *Reaper {
	return &Reaper{reap.NewBase(logger, DefaultConfig, sdk.Info{Name: Name, Editions: []string{ladder.EditionLite, ladder.EditionKube}, MarkReasons: []string{sdk.LabelDispatchLost, sdk.LabelStartExpired},
		DecisionLabels: []string{sdk.LabelDispatchLostProcessAlive, sdk.LabelDispatchLostProcessQueryErr,
			sdk.LabelDispatchLostPodQueryErr, sdk.LabelDispatchLostPodAlive, sdk.LabelDispatchLostOrphanStopped,
			sdk.LabelDispatchLostOrphanStopErr, sdk.LabelDispatchLostPodDeleteErr},
		KillLabels:        []string{sdk.LabelDispatchLost, sdk.LabelDispatchLostOrphanStopped, sdk.LabelStartExpired},
		ProvisionalLabels: []string{sdk.LabelDispatchLost, sdk.LabelDispatchLostOrphanStopped, sdk.LabelStartExpired},
		Description:       "fails queued attempts whose dispatch never landed (dispatch_lost) or whose pod cannot start in time (start_expired)"})}
}

// Reap runs one pass: one decision per attempt judged, plus one per
// teardown that failed or fell back.
func (r *Reaper) Reap(ctx context.Context, pass sdk.Pass, board sdk.Board, exec sdk.Executions, sink sdk.Sink) (sdk.PassResult, error) {
	p := &passRun{cfg: r.Config(), pass: pass, board: board, exec: exec,
		rec: reap.NewRecorder(Name, pass, sink), lite: pass.Edition == ladder.EditionLite}
	st := reap.LoadState(pass, r.Logger())
	p.stopping = reap.TakeStopping(st)
	executors := []string{sdk.ExecutorKube}
	if p.lite {
		executors = []string{sdk.ExecutorLite}
	}
	return reap.Run(ctx, pass, p.rec, reap.Spec{
		Name: Name, Logger: r.Logger(), Stopwatch: r.Stopwatch(), MaxPages: p.cfg.MaxPages,
		Listings: []reap.Listing{reap.Candidates(listQueued, board, sdk.CandidateQuery{
			States: []string{sdk.StateQueued}, Executors: executors, OrderBy: sdk.FieldQueuedAt,
			OlderThan: pass.Now.Add(-pass.Ladder.DispatchLost),
		}, p.judgePage)},
		State: st, Save: p.stopping.Keep,
	})
}

var _ sdk.Reaper = (*Reaper)(nil)

type passRun struct {
	cfg   Config
	pass  sdk.Pass
	board sdk.Board
	exec  sdk.Executions
	rec   *reap.Recorder
	lite  bool
	// stopping: attempts whose orphan stop is in flight (carried in the
	// pass state)
	stopping reap.Stopping
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
	recorded := reap.RecordedPodUIDs(page)
	answers := reap.ReadLivenessRecorded(ctx, p.exec, now, attempts, recorded, false)
	if !p.lite {
		var again []sdk.Attempt
		for _, c := range page {
			if needsLiveRead(c, now, l, answers[c.Attempt], p.cfg.StartExpiry) {
				again = append(again, c.Attempt)
			}
		}
		for a, ans := range reap.ReadLivenessRecorded(ctx, p.exec, now, again, recorded, true) {
			answers[a] = ans
		}
	}

	var planned []reap.Planned
	for _, c := range page {
		live := answers[c.Attempt]
		var j judgment
		if p.lite {
			j = judgeLite(c, now, l, live)
		} else {
			j = judgeKube(c, now, l, live, p.cfg.StartExpiry)
		}
		if j.act == actNone {
			continue
		}
		if j.act == actMark && p.stopping.Settled(c.Attempt) {
			// An earlier pass began stopping its orphaned group; this one
			// finds everything gone.
			j.label = sdk.LabelDispatchLostOrphanStopped
			j.detail += "; its orphaned task group was stopped"
		}
		ev := reap.CandidateEvidence(p.pass, c, l.DispatchLost).Liveness(live)
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
	return reap.Settle(ctx, p.board, p.rec, planned, p.afterMark)
}

// plan builds the guarded mark: still queued, and still this attempt.
func (p *passRun) plan(c sdk.Candidate, j judgment, ev reap.Evidence) reap.Planned {
	ev[reap.EvMark] = j.reason
	ev[reap.EvSignal] = reap.SignalPositive
	ev[reap.EvPolicy] = string(p.cfg.Policy)
	return reap.Planned{
		Mark: sdk.Mark{
			Attempt:    c.Attempt,
			FromStates: []string{sdk.StateQueued},
			Kind:       sdk.MarkInfra,
			Reason:     j.reason,
			Message:    j.reason + ": " + j.detail,
			Hold:       p.cfg.Hold(),
			Term:       p.pass.Term,
			At:         p.pass.Now,
		},
		Label: j.label, Detail: j.detail, Evidence: ev,
	}
}

// stopOrphan stops an orphaned task group before its attempt is marked; a
// stop that fails or cannot confirm the group gone defers.
func (p *passRun) stopOrphan(ctx context.Context, c sdk.Candidate, j judgment, ev reap.Evidence) (reap.Planned, bool) {
	if p.pass.DryRun {
		return p.plan(c, j, ev), true
	}
	if !reap.StopOrphanGroup(ctx, p.exec, p.rec, p.stopping, c.Attempt, reap.OrphanStopLabels{
		InFlight: sdk.LabelDispatchLostProcessAlive, Failed: sdk.LabelDispatchLostOrphanStopErr,
	}, ev) {
		return reap.Planned{}, false
	}
	p.stopping.Settled(c.Attempt)
	return p.plan(c, j, ev), true
}

// afterMark tears down a marked kube attempt (for start_expired: deletes
// its Pending pod). Lite has nothing to tear down.
func (p *passRun) afterMark(ctx context.Context, pl *reap.Planned) []reap.FollowUp {
	if p.lite {
		return nil
	}
	return reap.TeardownAttempt(ctx, p.exec, p.pass, pl.Mark.Attempt, pl.Mark.Reason, sdk.LabelDispatchLostPodDeleteErr, pl.Evidence)
}

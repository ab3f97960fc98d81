package audit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
)

// Shadow decisions, scored.
//
// A dry-run reaper records what it would have failed; a reaper under
// policy = "hold" fails and holds; on kube every infra mark stays
// provisional until the reconciler confirms it, and a durable SUCCESS
// still overrides it. Each of those decisions is a guess whose truth
// arrives later on the board, and the Scorer writes it beside the decision
// once it has: Judge compares the decision with what the board shows of
// its exact attempt (run, task, try and epoch: the task's row while the
// attempt is current, attempt_history once a rail released it).

// Defaults of ScorerConfig.
const (
	// ShadowHorizonDefault is how long a decision waits for its truth
	// before it is scored unresolved: a day. An attempt the decision
	// thought lost can prove alive for as long as its agent can still
	// reach the attempt API, which the credential ceiling bounds
	// (auth.max_attempt_credential_lifetime, 1h by default, plus the last
	// token's TTL); a day is well past that, and past a weekend night's
	// wait for an operator to look at a held attempt, while keeping the
	// index of pending decisions a day's worth.
	ShadowHorizonDefault = 24 * time.Hour
	// ShadowPageDefault is how many decisions one read of the pending
	// decisions returns.
	ShadowPageDefault = 500
)

// VerdictBoard is what the Scorer reads and writes (board.Store).
type VerdictBoard interface {
	UnscoredDecisions(ctx context.Context, afterID int64, limit int) ([]board.ShadowDecision, error)
	WriteVerdicts(ctx context.Context, term int64, now time.Time, vs []board.ScoredVerdict) ([]int64, error)
}

// ScorerConfig configures a Scorer.
type ScorerConfig struct {
	// Horizon is how long a decision without a truth waits before it is
	// scored unresolved. Default ShadowHorizonDefault.
	Horizon time.Duration
	// Page is how many pending decisions one read returns. Default
	// ShadowPageDefault.
	Page int
}

func (c ScorerConfig) withDefaults() ScorerConfig {
	if c.Horizon <= 0 {
		c.Horizon = ShadowHorizonDefault
	}
	if c.Page <= 0 {
		c.Page = ShadowPageDefault
	}
	return c
}

// Scorer scores the pending decisions a page at a time, resuming after the
// last decision it read (decisions still waiting for their truth are read
// again once it has gone through them all). It is not safe for concurrent
// use: the leader's cycle owns it.
type Scorer struct {
	board  VerdictBoard
	cfg    ScorerConfig
	cursor int64 // the last decision id read; 0: from the start
}

// NewScorer returns a scorer over b.
func NewScorer(b VerdictBoard, cfg ScorerConfig) *Scorer {
	return &Scorer{board: b, cfg: cfg.withDefaults()}
}

// Horizon is the scorer's horizon.
func (s *Scorer) Horizon() time.Duration { return s.cfg.Horizon }

// Scored is one verdict written.
type Scored struct {
	ID            int64
	Reaper, Label string
	Attempt       sdk.Attempt
	DryRun        bool
	Verdict       string
	Evidence      map[string]string
}

// ScoreResult is what one page of scoring did.
type ScoreResult struct {
	Read    int      // pending decisions read
	Written []Scored // verdicts written, in id order
	Pending int      // read, still without a truth
	// Wrapped is true when the page was the last one: the next page starts
	// over from the oldest pending decision.
	Wrapped bool
}

// ScorePage reads one page of pending decisions after the cursor, judges
// each at now, and writes the verdicts found, fenced by term. It returns
// board.ErrDeposed (the cursor unmoved, nothing written) when term no
// longer leads.
func (s *Scorer) ScorePage(ctx context.Context, term int64, now time.Time) (ScoreResult, error) {
	var res ScoreResult
	ds, err := s.board.UnscoredDecisions(ctx, s.cursor, s.cfg.Page)
	if err != nil {
		return res, fmt.Errorf("score shadow decisions: %w", err)
	}
	res.Read = len(ds)
	var (
		vs   []board.ScoredVerdict
		byID = make(map[int64]Scored, len(ds))
	)
	for _, d := range ds {
		word, ev, ok := Judge(d, now, s.cfg.Horizon)
		if !ok {
			res.Pending++
			continue
		}
		vs = append(vs, board.ScoredVerdict{ID: d.ID, Word: word, Evidence: ev})
		byID[d.ID] = Scored{ID: d.ID, Reaper: d.Reaper, Label: d.Label, Attempt: d.Attempt, DryRun: d.DryRun,
			Verdict: word, Evidence: ev}
	}
	written, err := s.board.WriteVerdicts(ctx, term, now, vs)
	if err != nil {
		if errors.Is(err, board.ErrDeposed) {
			return ScoreResult{}, err
		}
		return res, fmt.Errorf("score shadow decisions: %w", err)
	}
	for _, id := range written {
		res.Written = append(res.Written, byID[id])
	}
	if len(ds) < s.cfg.Page {
		s.cursor, res.Wrapped = 0, true
	} else {
		s.cursor = ds[len(ds)-1].ID
	}
	return res, nil
}

// Evidence keys of a verdict.
const (
	VevBy        = "by"         // what settled it: heartbeat, running, success, outcome, override, mark, ceiling, confirmed, run_failed, horizon, released, gone
	VevState     = "state"      // the attempt's state when scored
	VevAt        = "at"         // when the truth was stamped (RFC 3339), when it has a time
	VevAfter     = "after"      // how long after the decision the truth came
	VevReason    = "reason"     // the failure reason the attempt ended with
	VevRunState  = "run_state"  // the run's state
	VevReleased  = "released"   // "true" when the attempt was history (a rail released it)
	VevWaited    = "waited"     // how long the decision waited for a truth (unresolved)
	VevDecidedAs = "decided_as" // dry_run, hold or provisional: what kind of decision was scored
)

// Judge scores one decision at now: the verdict, what it saw, and ok false
// while the truth has not arrived and the horizon has not passed (the
// decision stays pending).
//
// A dry-run decision wrote nothing, so everything the board shows after it
// came from elsewhere:
//   - would_have_killed_live_work: the attempt heartbeated, reported
//     running, or reported an outcome (success, a task failure of its own,
//     up_for_retry, up_for_reschedule, skipped) after the decision;
//   - right: it did not, and it ended failed on the infra rail (an applied
//     mark of another reaper or pass, the reconciler's infra settlement),
//     at the credential ceiling, or its run failed;
//
// An applied decision (a hold, a provisional kube mark) failed the
// attempt itself, so its own mark is no evidence:
//   - would_have_killed_live_work: the attempt succeeded after all (a
//     durable SUCCESS over the provisional mark, or an operator's success);
//   - right: the mark was confirmed (no pod of the attempt left, or its
//     containers ended without a SUCCESS record; on Lite, as it was made),
//     or the run failed;
//
// Otherwise, unresolved once the horizon has passed since the decision,
// or at once when no truth can arrive any more (a rail released the
// attempt, or it is no longer on the board).
func Judge(d board.ShadowDecision, now time.Time, horizon time.Duration) (string, map[string]string, bool) {
	t := d.Truth
	ev := map[string]string{VevDecidedAs: decidedAs(d)}
	if t.Found {
		ev[VevState] = t.State
		if t.Released {
			ev[VevReleased] = "true"
		}
		if t.FailureReason != "" {
			ev[VevReason] = t.FailureReason
		}
	}
	if t.RunState != "" {
		ev[VevRunState] = t.RunState
	}
	at := d.At
	stamp := func(by string, when time.Time) {
		ev[VevBy] = by
		if !when.IsZero() {
			ev[VevAt] = when.UTC().Format(time.RFC3339Nano)
			ev[VevAfter] = when.Sub(at).Round(time.Millisecond).String()
		}
	}
	if !t.Found {
		stamp("gone", time.Time{})
		return sdk.VerdictUnresolved, ev, true
	}
	if d.DryRun {
		switch {
		case t.LastHeartbeatAt.After(at):
			stamp("heartbeat", t.LastHeartbeatAt)
			return sdk.VerdictWouldHaveKilledLiveWork, ev, true
		case t.RunningAt.After(at):
			stamp("running", t.RunningAt)
			return sdk.VerdictWouldHaveKilledLiveWork, ev, true
		case t.State == sdk.StateSuccess:
			// Whenever it ended: a success the reaper would have failed
			// (a durable record's ended_at is the container's own time,
			// which may precede the decision).
			stamp("success", t.EndedAt)
			return sdk.VerdictWouldHaveKilledLiveWork, ev, true
		case reportedOutcome(t) && t.EndedAt.After(at):
			stamp("outcome", t.EndedAt)
			return sdk.VerdictWouldHaveKilledLiveWork, ev, true
		case t.State == sdk.StateFailed && t.LastFailureKind == sdk.FailureInfra:
			stamp("mark", firstOf(t.InfraMarkedAt, t.EndedAt))
			return sdk.VerdictRight, ev, true
		case t.State == sdk.StateFailed && t.FailureReason == sdk.LabelCredentialCeiling:
			stamp("ceiling", t.EndedAt)
			return sdk.VerdictRight, ev, true
		}
	} else {
		switch {
		case t.State == sdk.StateSuccess:
			// Only an override (or an operator's success) takes a marked
			// attempt to success; its ended_at is the container's time.
			stamp("override", t.EndedAt)
			return sdk.VerdictWouldHaveKilledLiveWork, ev, true
		case !t.InfraConfirmedAt.IsZero():
			stamp("confirmed", t.InfraConfirmedAt)
			return sdk.VerdictRight, ev, true
		}
	}
	if t.RunState == sdk.RunFailed {
		stamp("run_failed", t.RunEndedAt)
		return sdk.VerdictRight, ev, true
	}
	if t.Released {
		stamp("released", t.ReleasedAt)
		return sdk.VerdictUnresolved, ev, true
	}
	if waited := now.Sub(at); waited >= horizon {
		ev[VevBy], ev[VevWaited] = "horizon", waited.Round(time.Second).String()
		return sdk.VerdictUnresolved, ev, true
	}
	return "", nil, false
}

// reportedOutcome is an outcome other than success that only the attempt
// itself (its agent, its record, its pod) reports: a skip, a park, or a failure of the
// task's own (not the ceiling, which a reaper or a watchdog writes).
func reportedOutcome(t board.AttemptTruth) bool {
	switch t.State {
	case sdk.StateSkipped, sdk.StateUpForRetry, sdk.StateUpForReschedule:
		return true
	case sdk.StateFailed:
		return t.LastFailureKind == sdk.FailureTask && t.FailureReason != sdk.LabelCredentialCeiling
	}
	return false
}

func decidedAs(d board.ShadowDecision) string {
	switch {
	case d.DryRun:
		return "dry_run"
	case d.Evidence["policy"] == "hold":
		return "hold"
	}
	return "provisional"
}

func firstOf(ts ...time.Time) time.Time {
	for _, t := range ts {
		if !t.IsZero() {
			return t
		}
	}
	return time.Time{}
}

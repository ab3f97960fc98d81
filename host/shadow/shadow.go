// Package shadow scores the shadow decisions on the leader: a leader
// component of its own, beside the maintenance loop (host/cycle).
//
// The audit's Scorer (host/audit) judges the decisions that said an attempt
// was lost but did not settle it for good (a dry run, a hold, a
// provisional kube mark) against what the board shows of that attempt
// since, and writes each verdict beside its decision, fenced by the term.
// Every interval the service scores pages of them under a budget of its
// own (Budget), and meters every verdict written
// (reaper_shadow_verdicts_total). It runs whether the settling gate opened
// or not and under the global dry run too: it judges what is already
// written and changes nothing but the audit.
package shadow

import (
	"context"
	"errors"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/host/audit"
	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/host/metrics"
	"github.com/dexaflow/reaper/internal/testsignal"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// Leadership tells whether this replica leads at a moment.
type Leadership interface {
	Status(now time.Time) leader.Status
}

// Budget is the time a run gives the scoring: a quarter of the interval,
// like the owed teardowns, so that the two together leave the next cycle
// half its interval even when both run out.
func Budget(interval time.Duration) time.Duration { return interval / 4 }

// pagesMax bounds the pages one run scores, budget or not: a backlog (a
// first run over an old audit) is worked through over runs.
const pagesMax = 20

// Config configures the scorer service.
type Config struct {
	// Interval is the time between two runs. Default the ladder's
	// maintenance interval (ladder.Defaults).
	Interval time.Duration
	// Horizon is how long a shadow decision waits for its truth before it
	// is scored unresolved. Default audit.ShadowHorizonDefault.
	Horizon time.Duration
	// Reapers are the configured reapers' names: their
	// would_have_killed_live_work series are created at zero.
	Reapers []string
	Clock   clock.Clock
	Logger  hclog.Logger
	Metrics *metrics.Metrics
}

// withDefaults fills in every default: the one place the service's
// defaults are decided.
func (c Config) withDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = ladder.Defaults().MaintenanceInterval
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.Metrics == nil {
		c.Metrics = metrics.New()
	}
	return c
}

// TestSignals are the points a test can wait for (internal/testsignal).
type TestSignals struct {
	// Scored carries what every run of a leader wrote.
	Scored testsignal.TestSignal[Result]
}

// Init makes every signal record (tests only).
func (s *TestSignals) Init(tb testsignal.TB) { s.Scored.Init(tb) }

// Result reports one run, for tests and logs.
type Result struct {
	// Verdicts are the shadow verdicts the run wrote.
	Verdicts []audit.Scored
	// Overran says the run outlived its budget.
	Overran bool
}

// Service scores the shadow decisions every interval on the leader.
type Service struct {
	cfg    Config
	lead   Leadership
	scorer *audit.Scorer

	// TestSignals are for tests; production leaves them alone.
	TestSignals TestSignals
}

// New returns the scorer service over the audit's shadow decisions
// (board.Store).
func New(cfg Config, lead Leadership, verdicts audit.VerdictBoard) *Service {
	cfg = cfg.withDefaults()
	cfg.Metrics.ShadowReapers(cfg.Reapers)
	return &Service{cfg: cfg, lead: lead,
		scorer: audit.NewScorer(verdicts, audit.ScorerConfig{Horizon: cfg.Horizon})}
}

// NeedsLeadership is true: its verdicts are written under the elector's
// term.
func (s *Service) NeedsLeadership() bool { return true }

// Run scores every interval until ctx is done, then returns nil. Ticks
// that fall due while a run is still under way are coalesced into one.
func (s *Service) Run(ctx context.Context) error {
	tk := s.cfg.Clock.NewTicker(s.cfg.Interval)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tk.C():
			s.RunOnce(ctx)
		}
	}
}

// RunOnce scores pages of pending decisions now, when this replica leads,
// until a page wraps around, the budget runs out or leadership is lost.
func (s *Service) RunOnce(ctx context.Context) (res Result) {
	if ctx.Err() != nil {
		return res
	}
	st := s.lead.Status(s.cfg.Clock.Now())
	if !st.Leading {
		return res
	}
	term := st.Term
	defer func() { s.TestSignals.Scored.Signal(res) }()
	budget := Budget(s.cfg.Interval)
	start := s.cfg.Clock.Now()
	sctx, cancel := clock.WithTimeout(ctx, s.cfg.Clock, budget)
	defer cancel()
	for range pagesMax {
		now := s.cfg.Clock.Now()
		if st := s.lead.Status(now); !st.Leading || st.Term != term {
			s.cfg.Logger.Warn("leadership lost: the shadow decisions wait", "term", term)
			break
		}
		page, err := s.scorer.ScorePage(sctx, term, now)
		for _, v := range page.Written {
			s.cfg.Metrics.ShadowVerdict(v.Reaper, v.Label, v.Verdict)
			res.Verdicts = append(res.Verdicts, v)
			s.logVerdict(v)
		}
		switch {
		case errors.Is(err, board.ErrDeposed):
			s.cfg.Logger.Warn("shadow verdicts not written: this term no longer leads", "term", term)
			return res
		case err != nil:
			s.cfg.Logger.Warn("could not score the shadow decisions: next cycle", "error", err)
			return res
		}
		if page.Wrapped || sctx.Err() != nil {
			break
		}
	}
	elapsed := s.cfg.Clock.Now().Sub(start)
	res.Overran = (sctx.Err() != nil && ctx.Err() == nil) || elapsed > budget
	s.cfg.Metrics.Phase("shadow", elapsed, res.Overran)
	if res.Overran {
		s.cfg.Logger.Warn("scoring the shadow decisions overran its budget: the rest wait for the next cycle",
			"budget", budget, "elapsed", elapsed)
	}
	return res
}

// logVerdict logs a verdict; one that says a decision would have killed
// live work is a WARN: a policy that would have done so must not be
// enabled unseen.
func (s *Service) logVerdict(v audit.Scored) {
	args := []any{"reaper", v.Reaper, "label", v.Label, "attempt", v.Attempt.String(), "decision", v.ID,
		"verdict", v.Verdict, "by", v.Evidence[audit.VevBy]}
	if v.Verdict == sdk.VerdictWouldHaveKilledLiveWork {
		s.cfg.Logger.Warn("a shadow decision would have killed live work", args...)
		return
	}
	s.cfg.Logger.Debug("shadow decision scored", args...)
}

package cycle

import (
	"context"
	"errors"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/host/audit"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
)

// Shadow decisions, scored after every cycle on the leader.
//
// The audit's Scorer (host/audit) judges the decisions that said an attempt
// was lost but did not settle it for good (a dry run, a hold, a
// provisional kube mark) against what the board shows of that attempt
// since, and writes each verdict beside its decision, fenced by the term.
// The loop runs it last, after the owed teardowns, under a budget of its
// own (ShadowBudget), and meters every verdict written
// (reaper_shadow_verdicts_total). It runs whether the gate opened or not
// and under the global dry run too: it judges what is already written and
// changes nothing but the audit.

// ShadowBudget is the time a cycle gives the scoring: a quarter of the
// interval, like the owed teardowns, so that the two together leave the
// next cycle half its interval even when both run out.
func ShadowBudget(interval time.Duration) time.Duration { return interval / 4 }

// shadowPagesMax bounds the pages one cycle scores, budget or not: a
// backlog (a first run over an old audit) is worked through over cycles.
const shadowPagesMax = 20

// scoreShadows scores pages of pending decisions until a page wraps
// around, the budget runs out or leadership is lost.
func (l *Loop) scoreShadows(ctx context.Context, term int64, res *Result) {
	if l.scorer == nil || ctx.Err() != nil {
		return
	}
	budget := ShadowBudget(l.cfg.Ladder.MaintenanceInterval)
	start := l.cfg.Clock.Now()
	sctx, cancel := clock.WithTimeout(ctx, l.cfg.Clock, budget)
	defer cancel()
	for range shadowPagesMax {
		now := l.cfg.Clock.Now()
		if st := l.lead.Status(now); !st.Leading || st.Term != term {
			l.cfg.Logger.Warn("leadership lost: the shadow decisions wait", "term", term)
			break
		}
		page, err := l.scorer.ScorePage(sctx, term, now)
		for _, v := range page.Written {
			l.cfg.Metrics.ShadowVerdict(v.Reaper, v.Label, v.Verdict)
			res.Verdicts = append(res.Verdicts, v)
			l.logVerdict(v)
		}
		switch {
		case errors.Is(err, board.ErrDeposed):
			l.cfg.Logger.Warn("shadow verdicts not written: this term no longer leads", "term", term)
			return
		case err != nil:
			l.cfg.Logger.Warn("could not score the shadow decisions: next cycle", "error", err)
			return
		}
		if page.Wrapped || sctx.Err() != nil {
			break
		}
	}
	l.afterPhase(ctx, sctx, "shadow", start, budget, res,
		"scoring the shadow decisions overran its budget: the rest wait for the next cycle")
}

// logVerdict logs a verdict; one that says a decision would have killed
// live work is a WARN: a policy that would have done so must not be
// enabled unseen.
func (l *Loop) logVerdict(v audit.Scored) {
	args := []any{"reaper", v.Reaper, "label", v.Label, "attempt", v.Attempt.String(), "decision", v.ID,
		"verdict", v.Verdict, "by", v.Evidence[audit.VevBy]}
	if v.Verdict == sdk.VerdictWouldHaveKilledLiveWork {
		l.cfg.Logger.Warn("a shadow decision would have killed live work", args...)
		return
	}
	l.cfg.Logger.Debug("shadow decision scored", args...)
}

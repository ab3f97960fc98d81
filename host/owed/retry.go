package owed

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/reap"
)

// RunOnce runs the retries now: on the leader, it writes what the board
// could not record before, then tries again the owed teardowns that are
// due, under Budget, fenced by term, and sets the gauge. Nothing is tried
// under the global dry run or without the substrate; a replica that does
// not lead sets the gauge to 0 (the leader's to count).
func (s *Service) RunOnce(ctx context.Context) (res Result) {
	if ctx.Err() != nil {
		return res
	}
	now := s.cfg.Clock.Now()
	s.decisions.Retry(ctx)
	st := s.lead.Status(now)
	if !st.Leading {
		s.cfg.Metrics.OwedTeardowns(0)
		return res
	}
	if s.cfg.DryRun {
		return res
	}
	defer func() { s.TestSignals.Paid.Signal(res) }()
	s.pay(ctx, st.Term, &res)
	return res
}

// pay is RunOnce's work under term.
func (s *Service) pay(ctx context.Context, term int64, res *Result) {
	sub, subErr := s.substrate.Get(ctx, s.cfg.Clock.Now())
	budget := Budget(s.cfg.Interval)
	start := s.cfg.Clock.Now()
	pctx, cancel := clock.WithTimeout(ctx, s.cfg.Clock, budget)
	defer cancel()
	defer s.count(ctx)

	kept := s.owing.take()
	for i, f := range kept {
		if _, err := s.board.OweTeardown(pctx, f, s.cfg.Backoff); err != nil {
			s.cfg.Logger.Warn("could not record owed teardowns kept from before: next cycle", "count", len(kept)-i, "error", err)
			for _, g := range kept[i:] {
				s.owing.keep(g)
			}
			return
		}
	}
	if subErr != nil {
		return // the loop's sweep says the substrate is unavailable
	}
	due, err := s.board.DueTeardowns(pctx, term, start, Page)
	switch {
	case errors.Is(err, board.ErrDeposed):
		s.cfg.Logger.Warn("owed teardowns not tried: this term no longer leads", "term", term)
		return
	case err != nil:
		s.cfg.Logger.Warn("could not read the owed teardowns: next cycle", "error", err)
		return
	}
	for _, o := range due {
		now := s.cfg.Clock.Now()
		if pctx.Err() != nil {
			break
		}
		if st := s.lead.Status(now); !st.Leading || st.Term != term {
			s.cfg.Logger.Warn("leadership lost: the owed teardowns wait", "term", term)
			break
		}
		if d, ok := s.retry(pctx, term, sub, o); ok {
			s.record(ctx, term, now, []sdk.Decision{d}, res)
		}
	}
	elapsed := s.cfg.Clock.Now().Sub(start)
	res.Overran = (pctx.Err() != nil && ctx.Err() == nil) || elapsed > budget
	s.cfg.Metrics.Phase("teardown", elapsed, res.Overran)
	if res.Overran {
		s.cfg.Logger.Warn("owed teardowns overran their budget: the rest wait for the next cycle", "budget", budget, "elapsed", elapsed)
	}
}

// liveAttempt is why an owed teardown of a live attempt is not tried.
const liveAttempt = "not tried: the attempt is still its task's current attempt on its way to execute or " +
	"executing (for a run: the run is still running), so no mark stands behind the teardown"

// retry tries one owed teardown again and writes what came of it; the
// decision says so (ok false: nothing was written, the term no longer
// leads).
func (s *Service) retry(ctx context.Context, term int64, sub sdk.Substrate, o board.OwedTeardown) (sdk.Decision, bool) {
	var (
		why, summary string
		owed         bool
	)
	if o.Live {
		// No applied mark stands behind it (a reaper tore down what it had
		// not reaped): when in doubt, defer, and say so each time it is due.
		why, summary, owed = liveAttempt, "not tried", true
	} else {
		out, err := sub.Teardown(ctx, o.Request(term))
		why, owed = teardownOwed(out, err)
		_, _, summary = reap.TeardownTrouble(out, err)
	}
	now := s.cfg.Clock.Now()
	a := sdk.Attempt{RunID: o.RunID}
	if o.Attempt != nil {
		a = *o.Attempt
	}
	ev := map[string]string{reap.EvTeardown: summary, "reason": o.Reason,
		"tries": strconv.Itoa(o.Tries), "owed_since": o.FirstFailedAt.UTC().Format(time.RFC3339)}
	if o.PodUID != "" {
		ev["pod_uid"] = o.PodUID
	}
	// The write is not cut short with the budget: what the try did must be
	// on the board.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	if !owed {
		if _, err := s.board.TeardownDone(wctx, o.ID, term, now); err != nil {
			s.cfg.Logger.Warn("an owed teardown completed, but removing it failed: tried again later",
				"what", o.Subject(), "error", err)
			return sdk.Decision{}, false
		}
		ev["tries"] = strconv.Itoa(o.Tries + 1)
		return sdk.Decision{Reaper: o.Reaper, Label: sdk.LabelTeardownRetried, Attempt: a, Applied: true,
			Detail: fmt.Sprintf("the teardown owed since %s (%s) completed on try %d", o.FirstFailedAt.UTC().Format(time.RFC3339),
				o.Label, o.Tries+1), Evidence: ev}, true
	}
	n, err := s.board.TeardownFailed(wctx, o.ID, term, now, why, s.cfg.Backoff)
	if err != nil {
		s.cfg.Logger.Warn("an owed teardown failed again, and recording it failed", "what", o.Subject(),
			"teardown_error", why, "error", err)
		if errors.Is(err, board.ErrDeposed) {
			return sdk.Decision{}, false
		}
		n = o
		n.Tries++
	}
	ev["tries"], ev["next_try_at"] = strconv.Itoa(n.Tries), n.NextTryAt.UTC().Format(time.RFC3339)
	return sdk.Decision{Reaper: o.Reaper, Label: o.Label, Attempt: a,
		Detail: "the owed teardown failed again, the mark stays: " + why, Evidence: ev}, true
}

// count sets the gauge of owed teardowns: the board's rows and those the
// board could not record yet.
func (s *Service) count(ctx context.Context) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	n, err := s.board.OwedTeardownCount(cctx)
	if err != nil {
		s.cfg.Logger.Warn("could not count the owed teardowns", "error", err)
		return
	}
	s.cfg.Metrics.OwedTeardowns(n + s.owing.count())
}

// record meters, logs and audits a retry's decisions through the
// pipeline, as the loop does its own, and adds them to the run's result;
// an audit failure is kept by the pipeline for the next run.
func (s *Service) record(ctx context.Context, term int64, at time.Time, ds []sdk.Decision, res *Result) {
	res.Decisions = append(res.Decisions, ds...)
	s.decisions.Record(ctx, term, at, ds)
}

package owed

import (
	"context"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
)

// executions records every teardown of a pass that does not complete.
type executions struct {
	sdk.Executions
	s      *Service
	reaper string
	term   int64
}

// feed is executions over executions that serve the change feed, so that
// the feed stays visible to the reaper.
type feed struct {
	executions
	sdk.ChangeFeed
}

// Wrap returns exec for reaper's pass under term: each of its teardowns
// that does not complete is owed.
func (s *Service) Wrap(exec sdk.Executions, reaper string, term int64) sdk.Executions {
	o := executions{Executions: exec, s: s, reaper: reaper, term: term}
	if f, ok := exec.(sdk.ChangeFeed); ok {
		return feed{executions: o, ChangeFeed: f}
	}
	return o
}

func (e executions) Teardown(ctx context.Context, req sdk.TeardownRequest) ([]sdk.TeardownOutcome, error) {
	out, err := e.Executions.Teardown(ctx, req)
	if why, owed := teardownOwed(out, err); owed {
		e.s.owe(ctx, e.reaper, e.term, req, why)
	}
	return out, err
}

// owe writes one failed teardown to the board, or keeps it for the next
// run when the board cannot take it.
func (s *Service) owe(ctx context.Context, reaper string, term int64, req sdk.TeardownRequest, why string) {
	f := board.TeardownFailure{Reaper: reaper, Label: DeleteErrLabel(s.cfg.Declared[reaper], req.Reason), Reason: req.Reason,
		Error: why, At: s.cfg.Clock.Now(), Term: term}
	switch {
	case req.Attempt != nil:
		a := *req.Attempt
		f.RunID, f.Attempt = a.RunID, &a
	case req.RunID != "":
		f.RunID = req.RunID
	default:
		return // a request the substrate refused outright: there is nothing to retry
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	defer s.TestSignals.Owed.Signal(f)
	o, err := s.board.OweTeardown(wctx, f, s.cfg.Backoff)
	if err != nil {
		s.cfg.Logger.Warn("could not record an owed teardown: kept for the next cycle", "reaper", reaper,
			"what", subjectOf(f), "error", err)
		if s.owing.keep(f) {
			s.cfg.Logger.Error("owed teardowns kept past the bound: the oldest given up", "bound", MaxUnrecorded)
		}
		return
	}
	s.cfg.Logger.Warn("teardown did not complete: owed, retried from a later cycle", "reaper", reaper,
		"what", o.Subject(), "tries", o.Tries, "next_try_at", o.NextTryAt, "error", why)
}

func subjectOf(f board.TeardownFailure) string {
	if f.Attempt != nil {
		return f.Attempt.String()
	}
	return "run " + f.RunID
}

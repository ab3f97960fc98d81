package prune

import (
	"context"
	"time"

	"github.com/dexaflow/reaper/board"
)

// The attempt history's retention.
//
// attempt_history (the board's migration 011) gains a row for every attempt
// a rail releases; the replay and the shadow scorer read it, nothing else
// does. History deletes what is older than its retention, one bounded
// batch an interval.

// HistoryPruner deletes attempt history released before a time, at most
// limit rows a call (board.Store).
type HistoryPruner interface {
	PruneHistory(ctx context.Context, term int64, now, before time.Time, limit int) (int64, error)
}

// History prunes the attempt history past its retention on the leader.
type History struct {
	cfg    Config
	lead   Leadership
	pruner HistoryPruner

	// TestSignals are for tests; production leaves them alone.
	TestSignals TestSignals
}

// NewHistory returns the attempt history's prune; Config.Retention
// defaults to board.HistoryRetentionDefault.
func NewHistory(cfg Config, lead Leadership, pruner HistoryPruner) *History {
	return &History{cfg: cfg.withDefaults(board.HistoryRetentionDefault), lead: lead, pruner: pruner}
}

// NeedsLeadership is true: its deletes are fenced by the elector's term.
func (h *History) NeedsLeadership() bool { return true }

// Run deletes a batch every interval until ctx is done, then returns nil.
func (h *History) Run(ctx context.Context) error {
	return every(ctx, h.cfg.Clock, h.cfg.Interval, h.RunOnce)
}

// RunOnce deletes one batch of history past the retention now, when this
// replica leads.
func (h *History) RunOnce(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	now := h.cfg.Clock.Now()
	term, ok := leading(h.lead, now)
	if !ok {
		return
	}
	n, err := h.pruner.PruneHistory(ctx, term, now, now.Add(-h.cfg.Retention), 0)
	switch {
	case err != nil:
		h.cfg.Logger.Warn("could not prune the attempt history: next cycle", "error", err)
	case n > 0:
		h.cfg.Logger.Debug("attempt history pruned", "rows", n, "retention", h.cfg.Retention)
	}
	h.TestSignals.Batch.Signal(term)
}

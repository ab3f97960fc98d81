package cycle

import (
	"context"
	"time"
)

// The attempt history's retention, kept on the leader after every cycle.
//
// attempt_history (the board's migration 011) gains a row for every attempt
// a rail releases; the replay and the shadow scorer read it, nothing else
// does. The loop deletes what is older than Config.HistoryRetention, one
// bounded batch a cycle, last of all and under the global dry run too (a
// retention is no judgment of any attempt).

// HistoryPruner deletes attempt history released before a time, at most
// limit rows a call (board.Store).
type HistoryPruner interface {
	PruneHistory(ctx context.Context, term int64, now, before time.Time, limit int) (int64, error)
}

// pruneHistory deletes one batch of history past the retention.
func (l *Loop) pruneHistory(ctx context.Context, term int64) {
	if l.cfg.History == nil || ctx.Err() != nil {
		return
	}
	now := l.cfg.Clock.Now()
	if st := l.lead.Status(now); !st.Leading || st.Term != term {
		return
	}
	n, err := l.cfg.History.PruneHistory(ctx, term, now, now.Add(-l.cfg.HistoryRetention), 0)
	switch {
	case err != nil:
		l.cfg.Logger.Warn("could not prune the attempt history: next cycle", "error", err)
	case n > 0:
		l.cfg.Logger.Debug("attempt history pruned", "rows", n, "retention", l.cfg.HistoryRetention)
	}
}

package cycle

import (
	"context"
	"time"
)

// The audit's retention, kept by the leader beside its cycles.
//
// reap_decisions (the board's audit) gains a row for every decision of
// every pass, fence_refusals one for every write the fence refused, and
// warm_worker_claims a row for every warm worker that ever claimed; explain, the shadow scorer and the kube sweep read them, the
// newest parts only. The leader deletes what is older than
// Config.AuditRetention, one bounded batch of each after a cycle. Unlike
// the history's, the audit's prune runs on a goroutine of its own: a batch
// at 10,000,000 decisions is a statement of some tens of milliseconds, and
// no cycle waits for it. A cycle that ends while a batch is still under
// way asks for none more; the next one after it does.

// AuditPruner deletes decisions made, the fence's refusals recorded, and
// warm worker claims claimed, before a time, at most limit rows a call
// (board.Store).
type AuditPruner interface {
	PruneDecisions(ctx context.Context, term int64, now, before time.Time, limit int) (int64, error)
	PruneRefusals(ctx context.Context, term int64, now, before time.Time, limit int) (int64, error)
	PruneWarmClaims(ctx context.Context, term int64, now, before time.Time, limit int) (int64, error)
}

// askAuditPrune asks the pruner for one batch under term, unless a batch
// is already asked for or under way: it never blocks.
func (l *Loop) askAuditPrune(term int64) {
	if l.cfg.AuditPrune == nil {
		return
	}
	select {
	case l.pruneAsked <- term:
	default:
	}
}

// pruneAudit deletes a batch of the audit past its retention for every
// ask, until ctx is done. Run runs it on a goroutine of its own.
func (l *Loop) pruneAudit(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case term := <-l.pruneAsked:
			l.pruneAuditBatch(ctx, term)
		}
	}
}

// pruneAuditBatch deletes one batch of decisions, one of the fence's
// refusals and one of warm worker claims past the retention, while term
// still leads.
func (l *Loop) pruneAuditBatch(ctx context.Context, term int64) {
	if ctx.Err() != nil {
		return
	}
	now := l.cfg.Clock.Now()
	if st := l.lead.Status(now); !st.Leading || st.Term != term {
		return
	}
	before := now.Add(-l.cfg.AuditRetention)
	n, err := l.cfg.AuditPrune.PruneDecisions(ctx, term, now, before, 0)
	switch {
	case err != nil:
		l.cfg.Logger.Warn("could not prune the audit of decisions: after the next cycle", "error", err)
	case n > 0:
		l.cfg.Logger.Debug("audit of decisions pruned", "rows", n, "retention", l.cfg.AuditRetention)
	}
	n, err = l.cfg.AuditPrune.PruneRefusals(ctx, term, now, before, 0)
	switch {
	case err != nil:
		l.cfg.Logger.Warn("could not prune the fence's refusals: after the next cycle", "error", err)
	case n > 0:
		l.cfg.Logger.Debug("the fence's refusals pruned", "rows", n, "retention", l.cfg.AuditRetention)
	}
	n, err = l.cfg.AuditPrune.PruneWarmClaims(ctx, term, now, before, 0)
	switch {
	case err != nil:
		l.cfg.Logger.Warn("could not prune the warm workers' claims: after the next cycle", "error", err)
	case n > 0:
		l.cfg.Logger.Debug("warm workers' claims pruned", "rows", n, "retention", l.cfg.AuditRetention)
	}
}

package prune

import (
	"context"
	"time"

	"github.com/dexaflow/reaper/board"
)

// The audit's retention.
//
// reap_decisions (the board's audit) gains a row for every decision of
// every pass, fence_refusals one for every write the fence refused, and
// warm_worker_claims a row for every warm worker that ever claimed;
// explain, the shadow scorer and the kube sweep read them, the newest parts
// only. Audit deletes what is older than its retention, one bounded batch
// of each an interval. A batch at 10,000,000 decisions is a statement of
// some tens of milliseconds, and no cycle waits for it: it runs on its own
// goroutine, and a batch still under way when the next falls due delays
// it.

// AuditPruner deletes decisions made, the fence's refusals recorded, and
// warm worker claims claimed, before a time, at most limit rows a call
// (board.Store).
type AuditPruner interface {
	PruneDecisions(ctx context.Context, term int64, now, before time.Time, limit int) (int64, error)
	PruneRefusals(ctx context.Context, term int64, now, before time.Time, limit int) (int64, error)
	PruneWarmClaims(ctx context.Context, term int64, now, before time.Time, limit int) (int64, error)
}

// Audit prunes the audit past its retention on the leader.
type Audit struct {
	cfg    Config
	lead   Leadership
	pruner AuditPruner

	// TestSignals are for tests; production leaves them alone.
	TestSignals TestSignals
}

// NewAudit returns the audit's prune; Config.Retention defaults to
// board.AuditRetentionDefault.
func NewAudit(cfg Config, lead Leadership, pruner AuditPruner) *Audit {
	return &Audit{cfg: cfg.withDefaults(board.AuditRetentionDefault), lead: lead, pruner: pruner}
}

// NeedsLeadership is true: its deletes are fenced by the elector's term.
func (a *Audit) NeedsLeadership() bool { return true }

// Run deletes a batch every interval until ctx is done, then returns nil.
func (a *Audit) Run(ctx context.Context) error {
	return every(ctx, a.cfg.Clock, a.cfg.Interval, a.RunOnce)
}

// RunOnce deletes one batch of decisions, one of the fence's refusals and
// one of warm worker claims past the retention now, when this replica
// leads.
func (a *Audit) RunOnce(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	now := a.cfg.Clock.Now()
	term, ok := leading(a.lead, now)
	if !ok {
		return
	}
	before := now.Add(-a.cfg.Retention)
	log := a.cfg.Logger
	n, err := a.pruner.PruneDecisions(ctx, term, now, before, 0)
	switch {
	case err != nil:
		log.Warn("could not prune the audit of decisions: after the next cycle", "error", err)
	case n > 0:
		log.Debug("audit of decisions pruned", "rows", n, "retention", a.cfg.Retention)
	}
	n, err = a.pruner.PruneRefusals(ctx, term, now, before, 0)
	switch {
	case err != nil:
		log.Warn("could not prune the fence's refusals: after the next cycle", "error", err)
	case n > 0:
		log.Debug("the fence's refusals pruned", "rows", n, "retention", a.cfg.Retention)
	}
	n, err = a.pruner.PruneWarmClaims(ctx, term, now, before, 0)
	switch {
	case err != nil:
		log.Warn("could not prune the warm workers' claims: after the next cycle", "error", err)
	case n > 0:
		log.Debug("warm workers' claims pruned", "rows", n, "retention", a.cfg.Retention)
	}
	a.TestSignals.Batch.Signal(term)
}

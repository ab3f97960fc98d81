// Package prune keeps the board's retentions on the leader: the attempt
// history (History) and the audit of decisions, the fence's refusals and
// the warm workers' claims (Audit). Each is a leader component of its own,
// beside the maintenance loop (host/cycle): every interval it deletes one
// bounded batch past its retention, fenced by the term it leads, and runs
// under the global dry run too (a retention is no judgment of any
// attempt). A batch that outlives its interval delays the next one (the
// ticks are coalesced); it never delays a cycle.
package prune

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/internal/testsignal"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// Leadership tells whether this replica leads at a moment.
type Leadership interface {
	Status(now time.Time) leader.Status
}

// Config configures a prune service.
type Config struct {
	// Interval is the time between two batches. Default the ladder's
	// maintenance interval (ladder.Defaults).
	Interval time.Duration
	// Retention is how long the rows are kept. Default the board's
	// (board.HistoryRetentionDefault, board.AuditRetentionDefault).
	Retention time.Duration
	Clock     clock.Clock
	Logger    hclog.Logger
}

// withDefaults fills in every default but the retention, which is each
// service's own.
func (c Config) withDefaults(retention time.Duration) Config {
	if c.Interval <= 0 {
		c.Interval = ladder.Defaults().MaintenanceInterval
	}
	if c.Retention <= 0 {
		c.Retention = retention
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	return c
}

// TestSignals are the points a test can wait for (internal/testsignal).
type TestSignals struct {
	// Batch carries the term of every batch run to its end (not one a
	// replica that does not lead skipped).
	Batch testsignal.TestSignal[int64]
}

// Init makes every signal record (tests only).
func (s *TestSignals) Init(tb testsignal.TB) { s.Batch.Init(tb) }

// every runs once every interval until ctx is done, then returns nil;
// ticks that fall due while once still runs are coalesced into one.
func every(ctx context.Context, clk clock.Clock, interval time.Duration, once func(context.Context)) error {
	tk := clk.NewTicker(interval)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tk.C():
			once(ctx)
		}
	}
}

// leading is the term this replica leads at now, if it leads.
func leading(lead Leadership, now time.Time) (int64, bool) {
	st := lead.Status(now)
	return st.Term, st.Leading
}

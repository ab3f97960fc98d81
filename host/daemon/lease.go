package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/sdk/clock"
)

// leaseStore adapts the board's lease row to the elector's interface.
type leaseStore struct{ store *board.Store }

func (l leaseStore) TryAcquire(ctx context.Context, holder string, ttl time.Duration, now time.Time) (int64, bool, error) {
	lease, ok, err := l.store.TryAcquire(ctx, holder, ttl, now)
	return lease.Term, ok, err
}

func (l leaseStore) Renew(ctx context.Context, term int64, holder string, ttl time.Duration, now time.Time) (bool, error) {
	_, ok, err := l.store.Renew(ctx, term, holder, ttl, now)
	return ok, err
}

func (l leaseStore) Resign(ctx context.Context, term int64, holder string) error {
	_, err := l.store.Resign(ctx, term, holder)
	return err
}

// The schema gate's retry period: it starts at gateRetryMin and doubles
// up to gateRetryMax (or the elector's renewal period, when shorter: the
// pace at which a replica retried the board before the gate) while the
// check fails.
const (
	gateRetryMin = 500 * time.Millisecond
	gateRetryMax = 5 * time.Second
	// gateRelogEvery is how often a refusal that lasts is logged again.
	gateRelogEvery = 10 * time.Minute
)

// schemaGate holds reaperd's work (leadership, the attempt API, the
// runner) until the board's schema is one this binary may run on: its own
// version, or a newer one whose floor it meets (board.Schema.Admits).
// While it is closed, it says why in one line: to the health report and,
// when the line changes, to the log. It never closes again once open.
type schemaGate struct {
	pool     *pgxpool.Pool
	clock    clock.Clock
	log      hclog.Logger
	maxRetry time.Duration // the longest wait between checks; 0: gateRetryMax

	mu       sync.Mutex
	openedAt time.Time // zero while closed
	reason   string    // why it is closed
	loggedAt time.Time // when reason was last logged
}

// gateFirstCheck is the gate's reason before its first check has answered.
const gateFirstCheck = "the database's schema is being checked"

// state is the health report's view: when the gate opened (zero while
// closed) and why it is closed.
func (g *schemaGate) state() (time.Time, string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.openedAt.IsZero() && g.reason == "" {
		return g.openedAt, gateFirstCheck
	}
	return g.openedAt, g.reason
}

// check checks the schema once, unless the gate is open already, and
// returns nil once it is.
func (g *schemaGate) check(ctx context.Context) error {
	g.mu.Lock()
	open := !g.openedAt.IsZero()
	g.mu.Unlock()
	if open {
		return nil
	}
	return g.recheck(ctx)
}

// recheck checks the schema even when the gate is open: before every
// acquisition of a term, so that a replica started before a migration that
// raised the floor above it takes no term after it. A refusal closes the
// gate (readiness says why); a database that cannot be reached leaves an
// open gate open (the acquisition fails on its own).
func (g *schemaGate) recheck(ctx context.Context) error {
	known := board.SchemaVersion()
	st, err := board.ReadSchema(ctx, g.pool)
	if err == nil {
		err = st.Admits(known)
	}
	if err != nil && ctx.Err() != nil {
		// Stopped mid-check: that says nothing of the database.
		return ctx.Err()
	}
	now := g.clock.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	var serr *board.SchemaError
	switch {
	case err == nil:
		if !g.openedAt.IsZero() {
			return nil // open already: a recheck before a term
		}
		g.openedAt, g.reason = now, ""
		if st.Version > known {
			g.log.Info("the database's schema is newer than this binary, and its floor admits it: its newer migrations are additive",
				"database_schema", st.Version, "binary_schema", known, "floor", st.Floor, "floor_set_by", st.FloorSetBy)
		}
		return nil
	case errors.As(err, &serr):
		// A refusal: one line, logged when it appears or changes, and
		// again now and then while it lasts.
		g.openedAt = time.Time{}
		line := "reaperd cannot start: " + serr.Error()
		if line != g.reason || now.Sub(g.loggedAt) >= gateRelogEvery {
			g.log.Error(line)
			g.loggedAt = now
		}
		g.reason = line
	default:
		if !g.openedAt.IsZero() {
			return fmt.Errorf("schema gate: the database's schema cannot be checked: %w", err)
		}
		g.reason = "the database's schema cannot be checked yet: " + board.ConnProblem(err)
		g.log.Debug("schema check", "error", err)
	}
	return &gateClosed{reason: g.reason, err: err}
}

// gateClosed is check's error: the gate's one line, wrapping the cause (a
// *board.SchemaError, or the database's error).
type gateClosed struct {
	reason string
	err    error
}

func (e *gateClosed) Error() string { return "schema gate: " + e.reason }
func (e *gateClosed) Unwrap() error { return e.err }

// wait checks the schema until the gate opens (nil) or ctx ends (its
// error), backing off from gateRetryMin to gateRetryMax between checks.
// While the database cannot be reached, each failed check is logged.
func (g *schemaGate) wait(ctx context.Context) error {
	longest := gateRetryMax
	if g.maxRetry > 0 && g.maxRetry < longest {
		longest = g.maxRetry
	}
	delay := min(gateRetryMin, longest)
	for {
		err := g.check(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !errors.As(err, new(*board.SchemaError)) {
			_, reason := g.state()
			g.log.Warn(reason, "retry_in", delay)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-g.clock.After(delay):
		}
		delay = min(2*delay, longest)
	}
}

// gatedLease is a lease whose acquisition waits behind the schema gate, so
// that a replica that drives its elector step by step (Campaign) checks
// the schema too.
type gatedLease struct {
	leader.Lease
	gate *schemaGate
}

func (l gatedLease) TryAcquire(ctx context.Context, holder string, ttl time.Duration, now time.Time) (int64, bool, error) {
	// Every acquisition may start a term: the schema is read again, not
	// taken from the first check.
	if err := l.gate.recheck(ctx); err != nil {
		return 0, false, err
	}
	return l.Lease.TryAcquire(ctx, holder, ttl, now)
}

package daemon

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/host/leader"
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

// schemaGate makes leadership wait for a database whose schema this binary
// knows. While the database is unreachable, acquisition fails (and is
// retried by the elector); a schema of the wrong version is fatal.
type schemaGate struct {
	leader.Lease
	pool  *pgxpool.Pool
	fatal func(error)

	mu sync.Mutex
	ok bool
}

func (g *schemaGate) TryAcquire(ctx context.Context, holder string, ttl time.Duration, now time.Time) (int64, bool, error) {
	g.mu.Lock()
	checked := g.ok
	g.mu.Unlock()
	if !checked {
		if err := board.CheckSchema(ctx, g.pool); err != nil {
			var serr *board.SchemaError
			if errors.As(err, &serr) {
				g.fatal(err)
			}
			return 0, false, err
		}
		g.mu.Lock()
		g.ok = true
		g.mu.Unlock()
	}
	return g.Lease.TryAcquire(ctx, holder, ttl, now)
}

package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/testkit/eventually"
)

// WriteCounts is what the server's statistics count of a database's
// writes: what a benchmark divides by its calls.
type WriteCounts struct {
	// Updated is the rows updated in the table asked for.
	Updated int64
	// Commits is the transactions committed in the database (the reads of
	// ReadWriteCounts itself included: two per read).
	Commits int64
}

// ReadWriteCounts reads, over pool, the rows updated in table and the
// transactions committed in pool's database. Every idle session of pool
// hands its pending counts over first; a session of another pool hands
// its over when it exits (close that pool and WaitSessionsEnd first).
func ReadWriteCounts(tb testing.TB, pool *pgxpool.Pool, table string) WriteCounts {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range pool.AcquireAllIdle(ctx) {
		_, err := c.Exec(ctx, "SELECT pg_stat_force_next_flush()")
		c.Release()
		if err != nil {
			tb.Fatalf("pgtest: flush the session's statistics: %v", err)
		}
	}
	if _, err := pool.Exec(ctx, "SELECT pg_stat_clear_snapshot()"); err != nil {
		tb.Fatalf("pgtest: clear the statistics snapshot: %v", err)
	}
	var w WriteCounts
	if err := pool.QueryRow(ctx, `SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = $1`, table).Scan(&w.Updated); err != nil {
		tb.Fatalf("pgtest: read the rows updated in %s: %v", table, err)
	}
	if err := pool.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&w.Commits); err != nil {
		tb.Fatalf("pgtest: read the commits: %v", err)
	}
	return w
}

// WaitSessionsEnd waits (at most 30 s) until no session of the
// application named application is left on pool's server: once they have
// exited, their statistics are counted.
func WaitSessionsEnd(tb testing.TB, pool *pgxpool.Pool, application string) {
	tb.Helper()
	eventually.True(tb, 30*time.Second, "the sessions of "+application+" to end", func() bool {
		var left int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`,
			application).Scan(&left); err != nil {
			tb.Fatalf("pgtest: count the sessions of %s: %v", application, err)
		}
		return left == 0
	})
}

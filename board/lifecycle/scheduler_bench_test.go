package lifecycle_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// BenchmarkSchedulerReads measures what the graphs and pools add to each
// runner tick on a board of 150,000 running attempts in 1,500 runs (four
// pools), with 15,000 more task instances waiting in state none behind an
// upstream that still runs (a chain per run): the pools' use, the bounded
// runs, the scheduling of new task instances (which must skip every one
// whose upstream has not succeeded) and the settling of blocked ones
// (none to settle).
func BenchmarkSchedulerReads(b *testing.B) {
	ctx := context.Background()
	pool := pgtest.NewDB(b)
	seedScheduler(b, pool)
	w := lifecycle.New(pool, lifecycle.Options{})
	now := base
	for _, c := range []struct {
		name string
		run  func() error
	}{
		{"PoolUsage", func() error { _, err := w.PoolUsage(ctx, now.Add(-45*time.Second)); return err }},
		{"BoundedRuns", func() error { _, err := w.BoundedRuns(ctx); return err }},
		{"EnqueueNew", func() error {
			as, err := w.EnqueueNew(ctx, sdk.ExecutorLite, 0, now)
			if err == nil && len(as) != 0 {
				b.Fatalf("scheduled %d behind running upstreams", len(as))
			}
			return err
		}},
		{"SettleBlocked", func() error {
			bs, err := w.SettleBlocked(ctx, sdk.ExecutorLite, 0, now)
			if err == nil && len(bs) != 0 {
				b.Fatalf("settled %d behind running upstreams", len(bs))
			}
			return err
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if err := c.run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// seedScheduler fills the board of BenchmarkSchedulerReads.
func seedScheduler(tb testing.TB, pool *pgxpool.Pool) {
	tb.Helper()
	ctx := context.Background()
	for _, s := range []string{
		`INSERT INTO runs (run_id, dag_id, state, started_at, updated_at, max_active_tasks)
         SELECT 'run' || lpad(r::text, 6, '0'), 'dag', 'running', $1::timestamptz - interval '1 hour', $1,
             CASE WHEN r % 10 = 0 THEN 200 END
         FROM generate_series(0, 1499) r`,
		`INSERT INTO task_instances (run_id, task_id, executor, state, queued_at, running_at, last_heartbeat_at, pool, updated_at)
         SELECT 'run' || lpad((i / 100)::text, 6, '0'), 'task' || lpad((i % 100)::text, 3, '0'), 'lite', 'running',
             $1::timestamptz - interval '10 minutes', $1::timestamptz - interval '9 minutes',
             $1::timestamptz - (i % 60) * interval '1 second', 'pool' || (i % 4), $1
         FROM generate_series(0, 149999) i`,
		`INSERT INTO task_instances (run_id, task_id, executor, state, upstreams, updated_at)
         SELECT 'run' || lpad((i / 10)::text, 6, '0'), 'next' || lpad((i % 10)::text, 3, '0'), 'lite', 'none',
             ARRAY['task' || lpad((i % 10)::text, 3, '0')], $1
         FROM generate_series(0, 14999) i`,
		`VACUUM ANALYZE runs`, `VACUUM ANALYZE task_instances`,
	} {
		var err error
		if strings.HasPrefix(s, "VACUUM") {
			_, err = pool.Exec(ctx, s)
		} else {
			_, err = pool.Exec(ctx, s, base)
		}
		if err != nil {
			tb.Fatal(err)
		}
	}
}

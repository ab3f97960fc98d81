package lifecycle_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// Every read that lists or counts task instances by a live state still
// finds them through an index once the running rows left
// task_instances_queued_at_idx (migration 024): the runner's and the
// scheduler's reads of queued and running rows, and the reapers' listings
// by queued_at. The server's own count of sequential scans of
// task_instances, read around each call, says whether the statement read
// the table whole; a board of 120,000 task instances, half of them settled
// history, makes a scan the planner's worse choice for any read an index
// serves. (CountActive and PoolUsage are not held to it: they count every
// queued and running row, and on this board read the table whole, as they
// did on the schema before migration 024.)
func TestLiveReadsUseAnIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	seedLive(t, pool)
	w := lifecycle.New(pool, lifecycle.Options{})
	store := board.New(pool, board.Options{})

	listing := func(q sdk.CandidateQuery) func() error {
		return func() error { _, err := store.ListCandidates(ctx, q); return err }
	}
	for name, read := range map[string]func() error{
		"ListScheduled": func() error {
			_, err := w.ListScheduled(ctx, sdk.ExecutorKube, nil, 100)
			return err
		},
		"ListReleasable": func() error {
			_, err := w.ListReleasable(ctx, sdk.ExecutorKube, nil, 100)
			return err
		},
		"ListScheduledOpen": func() error {
			_, err := w.ListScheduledOpen(ctx, sdk.ExecutorKube, nil, 100, nil, nil, nil)
			return err
		},
		"ListWarmBound": func() error { _, err := w.ListWarmBound(ctx, nil, 100); return err },
		"BoundTo":       func() error { _, err := w.BoundTo(ctx, "worker-1", 100); return err },
		"DispatchLost": listing(sdk.CandidateQuery{States: []string{sdk.StateQueued},
			Executors: []string{sdk.ExecutorKube, sdk.ExecutorLite}, OrderBy: sdk.FieldQueuedAt, OlderThan: base}),
		"ParkedByQueuedAt": listing(sdk.CandidateQuery{States: []string{sdk.StateUpForRetry, sdk.StateScheduled},
			OrderBy: sdk.FieldQueuedAt, OlderThan: base}),
		"WarmWorkerLost": listing(sdk.CandidateQuery{States: []string{sdk.StateQueued, sdk.StateRunning},
			Executors: []string{sdk.ExecutorWarm}, OrderBy: sdk.FieldQueuedAt, OlderThan: base}),
		"PodLost": listing(sdk.CandidateQuery{States: []string{sdk.StateRunning},
			Executors: []string{sdk.ExecutorKube}, OrderBy: sdk.FieldRunningAt, OlderThan: base}),
		"AgentLost": listing(sdk.CandidateQuery{States: []string{sdk.StateRunning}, OrderBy: sdk.FieldHeartbeatAt,
			OlderThan: base, Heartbeat: sdk.HeartbeatSeen}),
	} {
		before := seqScans(t, pool)
		if err := read(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if after := seqScans(t, pool); after != before {
			t.Errorf("%s read task_instances whole (%d sequential scans)", name, after-before)
		}
	}
}

// seedLive fills the board of TestLiveReadsUseAnIndex: 1,200 running runs
// of 100 task instances each, half of them settled (success), the others
// mostly running (every executor), the rest queued, scheduled, up for
// retry or deferred, some bound to a warm worker.
func seedLive(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	for _, s := range []string{
		`INSERT INTO runs (run_id, dag_id, state, started_at, updated_at)
         SELECT 'run' || lpad(r::text, 6, '0'), 'dag', 'running', $1::timestamptz - interval '1 hour', $1
         FROM generate_series(0, 1199) r`,
		`INSERT INTO task_instances (run_id, task_id, executor, state, queued_at, running_at, last_heartbeat_at,
             ended_at, warm_worker, pool, updated_at)
         SELECT 'run' || lpad((i / 100)::text, 6, '0'), 'task' || lpad((i % 100)::text, 3, '0'),
             (ARRAY['kube', 'kube', 'lite', 'warm'])[i % 4 + 1], st,
             CASE WHEN st <> 'scheduled' THEN q END,
             CASE WHEN st = 'running' THEN q + interval '1 second' END,
             CASE WHEN st = 'running' THEN $1::timestamptz - (i % 60) * interval '1 second' END,
             CASE WHEN st IN ('up_for_retry', 'deferred') THEN q + interval '1 minute' END,
             CASE WHEN i % 4 = 3 AND st IN ('queued', 'running') THEN 'worker-' || (i % 7) END,
             'pool' || (i % 3), $1
         FROM generate_series(0, 119999) i,
             LATERAL (SELECT $1::timestamptz - interval '1 hour' + (i % 3000) * interval '1 second' AS q,
                 (ARRAY['success', 'success', 'success', 'success', 'success', 'success', 'success',
                        'success', 'success', 'success', 'running', 'running', 'running', 'running',
                        'running', 'running', 'queued', 'scheduled', 'up_for_retry', 'deferred'])[i % 20 + 1] AS st) t`,
		`VACUUM ANALYZE runs, task_instances`,
	} {
		var err error
		if s[:6] == "VACUUM" {
			_, err = pool.Exec(ctx, s)
		} else {
			_, err = pool.Exec(ctx, s, base)
		}
		if err != nil {
			t.Fatalf("seed: %v", err)
		}
	}
}

// seqScans is the server's count of sequential scans of task_instances,
// every idle session's pending counts flushed first.
func seqScans(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	ctx := context.Background()
	for _, c := range pool.AcquireAllIdle(ctx) {
		_, err := c.Exec(ctx, "SELECT pg_stat_force_next_flush()")
		c.Release()
		if err != nil {
			t.Fatalf("flush the session's statistics: %v", err)
		}
	}
	var n int64
	// (Its own transaction: a fresh snapshot of the statistics.)
	if err := pool.QueryRow(ctx, `SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'task_instances'`).Scan(&n); err != nil {
		t.Fatalf("read the sequential scans of task_instances: %v", err)
	}
	return n
}

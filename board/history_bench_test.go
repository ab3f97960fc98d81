package board_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// The shape of BenchmarkReplay1M's history: 1,000,000 attempts, a quarter
// current (task_instances), three quarters released (attempt_history), over
// runs of 100 tasks each, all within the last six days.
const (
	replayTasks        = 250_000
	replayTriesPerTask = 3 // released tries before the current one
	replayTasksPerRun  = 100
)

// seedReplayHistory fills a database with the benchmark's history. Every
// task instance succeeded on its fourth try; its earlier tries failed on
// their own, but one in a hundred was marked agent_lost and one in 137
// dispatch_lost. Gaps, waits and lives spread over minutes. One current
// attempt in seven had a closed pod cache window, one released try in
// eleven a window left open that its later heartbeat ended.
func seedReplayHistory(b *testing.B, pool *pgxpool.Pool) {
	b.Helper()
	ctx := context.Background()
	for _, s := range []string{
		`INSERT INTO runs (run_id, dag_id, state, started_at, ended_at, updated_at)
         SELECT 'run' || lpad(r::text, 6, '0'), 'dag', 'success',
             $1::timestamptz - interval '6 days' + r * interval '3 minutes',
             $1::timestamptz - interval '6 days' + r * interval '3 minutes' + interval '5 hours',
             $1::timestamptz - interval '6 days' + r * interval '3 minutes' + interval '5 hours'
         FROM generate_series(0, $2::int / $3::int - 1) r`,
		`INSERT INTO task_instances (run_id, task_id, try_number, executor, state, queued_at, running_at,
             last_heartbeat_at, ended_at, credential_minted_at, max_heartbeat_gap, pod_missing_max, updated_at)
         SELECT 'run' || lpad((i / $3::int)::text, 6, '0'), 'task' || lpad((i % $3::int)::text, 3, '0'), 4, 'lite',
             'success', t.q, t.q + (i % 50) * interval '1 second', t.q + interval '50 minutes',
             t.q + interval '50 minutes 10 seconds', t.q, (i % 300) * interval '1 second',
             CASE WHEN i % 7 = 0 THEN (i % 90) * interval '1 second' END,
             t.q + interval '50 minutes 10 seconds'
         FROM generate_series(0, $2::int - 1) i
         CROSS JOIN LATERAL (SELECT $1::timestamptz - interval '6 days' + (i / $3::int) * interval '3 minutes'
             + interval '3 hours' + (i % 60) * interval '1 second' AS q) t`,
		`INSERT INTO attempt_history (run_id, task_id, try_number, attempt_epoch, executor, state, queued_at,
             running_at, last_heartbeat_at, ended_at, last_failure_kind, failure_reason, infra_marked_at,
             credential_minted_at, max_heartbeat_gap, pod_missing_since, released_at)
         SELECT 'run' || lpad((k / $3::int)::text, 6, '0'), 'task' || lpad((k % $3::int)::text, 3, '0'), j + 1, 0,
             'lite', 'failed', t.q,
             CASE WHEN n % 137 = 0 THEN NULL ELSE t.q + (n % 40) * interval '1 second' END,
             CASE WHEN n % 137 = 0 THEN NULL ELSE t.q + interval '40 minutes' END,
             t.q + interval '45 minutes',
             CASE WHEN n % 137 = 0 OR n % 100 = 0 THEN 'infra' ELSE 'task' END,
             CASE WHEN n % 137 = 0 THEN 'dispatch_lost' WHEN n % 100 = 0 THEN 'agent_lost' ELSE 'exit_code' END,
             CASE WHEN n % 137 = 0 OR n % 100 = 0 THEN t.q + interval '45 minutes' END,
             t.q, CASE WHEN n % 137 = 0 THEN NULL ELSE (n % 240) * interval '1 second' END,
             CASE WHEN n % 11 = 0 AND n % 137 <> 0 THEN t.q + interval '30 minutes' END,
             t.q + interval '46 minutes'
         FROM generate_series(0, $2::int - 1) k
         CROSS JOIN generate_series(0, $4::int - 1) j
         CROSS JOIN LATERAL (SELECT k * $4::int + j AS n,
             $1::timestamptz - interval '6 days' + (k / $3::int) * interval '3 minutes' + j * interval '1 hour'
                 + (k % 60) * interval '1 second' AS q) t`,
		`VACUUM ANALYZE runs`,
		`VACUUM ANALYZE task_instances`,
		`VACUUM ANALYZE attempt_history`,
	} {
		// Each statement takes the parameters it names, in order.
		args := []any{base, replayTasks, replayTasksPerRun, replayTriesPerTask}
		for len(args) > 0 && !strings.Contains(s, fmt.Sprintf("$%d", len(args))) {
			args = args[:len(args)-1]
		}
		if _, err := pool.Exec(ctx, s, args...); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReplay1M replays every rung over 1,000,000 attempts of history,
// the window the default seven days: each rung is one statement, and
// AllRungs is what reaperctl replay reads.
func BenchmarkReplay1M(b *testing.B) {
	ctx := context.Background()
	pool := pgtest.NewDB(b)
	store := board.New(pool, board.Options{})
	seedReplayHistory(b, pool)
	var n int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM task_instances) + (SELECT count(*) FROM attempt_history)`).
		Scan(&n); err != nil || n != replayTasks*(replayTriesPerTask+1) {
		b.Fatalf("%d attempts seeded: %v", n, err)
	}
	fractions := make([]float64, 0, 107)
	for i := 0; i <= 100; i++ {
		fractions = append(fractions, float64(i)/100)
	}
	fractions = append(fractions, 0.995, 0.999, 0.9995, 0.9999, 0.99995, 0.99999)
	q := func(thresholds ...time.Duration) board.ReplayQuery {
		return board.ReplayQuery{Since: base.Add(-7 * 24 * time.Hour), Thresholds: thresholds, Quantiles: fractions}
	}
	rungs := []struct {
		name string
		read func(context.Context, board.ReplayQuery) (board.Replay, error)
		q    board.ReplayQuery
	}{
		{"AgentLost", store.ReplayAgentLost, q(23*time.Second, 45*time.Second, 70*time.Second, 90*time.Second,
			140*time.Second, 5*time.Minute)},
		{"DispatchLost", store.ReplayDispatchLost, q(45*time.Second, 90*time.Second, 3*time.Minute, 6*time.Minute,
			12*time.Minute)},
		{"PodLostFloor", store.ReplayPodLostFloor, q(15*time.Second, 30*time.Second, 45*time.Second, time.Minute,
			90*time.Second, 2*time.Minute, 3*time.Minute, 4*time.Minute)},
		{"OrphanRun", store.ReplayOrphanRun, q(80*time.Second, 150*time.Second, 5*time.Minute, 10*time.Minute,
			20*time.Minute)},
		{"CredentialCeiling", store.ReplayCredentialCeiling, q(15*time.Minute, 30*time.Minute, time.Hour,
			2*time.Hour, 4*time.Hour)},
	}
	for _, r := range rungs {
		b.Run(r.name, func(b *testing.B) {
			for b.Loop() {
				rep, err := r.read(ctx, r.q)
				if err != nil {
					b.Fatal(err)
				}
				if rep.Count == 0 {
					b.Fatalf("%s: nothing observed", r.name)
				}
			}
		})
	}
	b.Run("AllRungs", func(b *testing.B) {
		for b.Loop() {
			for _, r := range rungs {
				if _, err := r.read(ctx, r.q); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}

package board_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

const benchRows = 100_000

// seedRunning fills a database with benchRows running attempts over
// benchRows/100 runs, running since one second apart before base.
func seedRunning(b *testing.B, pool *pgxpool.Pool) {
	b.Helper()
	ctx := context.Background()
	for _, s := range []string{
		`INSERT INTO runs (run_id, dag_id, state, started_at, updated_at)
         SELECT 'run' || lpad(r::text, 6, '0'), 'dag', 'running', $1::timestamptz - interval '2 days', $1
         FROM generate_series(0, $2::int / 100 - 1) r`,
		`INSERT INTO task_instances (run_id, task_id, executor, state, queued_at, running_at, last_heartbeat_at, updated_at)
         SELECT 'run' || lpad((i / 100)::text, 6, '0'), 'task' || lpad((i % 100)::text, 3, '0'), 'lite', 'running',
             $1::timestamptz - i * interval '1 second' - interval '1 minute',
             $1::timestamptz - i * interval '1 second',
             $1::timestamptz - i * interval '1 second' + interval '10 seconds', $1
         FROM generate_series(0, $2::int - 1) i`,
	} {
		if _, err := pool.Exec(ctx, s, base.Add(-time.Hour), benchRows); err != nil {
			b.Fatal(err)
		}
	}
	resetRunning(b, pool)
}

// resetRunning puts every attempt back to running and vacuums, so that each
// measured pass starts from the same table.
func resetRunning(b *testing.B, pool *pgxpool.Pool) {
	b.Helper()
	ctx := context.Background()
	for _, s := range []string{
		`UPDATE task_instances SET state = 'running', last_failure_kind = NULL, failure_reason = NULL,
             error_message = NULL, ended_at = NULL, infra_marked_at = NULL WHERE state <> 'running'`,
		`VACUUM ANALYZE task_instances`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMark marks pages of 100 silent running attempts over a table of
// 100,000, the way a reaper pass does: list a keyset page ordered by the
// threshold timestamp, then mark it with guards, one commit per page. It
// runs the same work as plain SQL first, as the ceiling to compare with.
func BenchmarkMark(b *testing.B) {
	ctx := context.Background()
	pool := pgtest.NewDB(b)
	store := board.New(pool, board.Options{})
	lease, ok, err := store.TryAcquire(ctx, "bench", 24*time.Hour, base.Add(-time.Hour))
	if err != nil || !ok {
		b.Fatal(ok, err)
	}
	seedRunning(b, pool)
	threshold := base.Add(-90 * time.Second)
	var plainRate float64

	b.Run("PlainSQL", func(b *testing.B) {
		resetRunning(b, pool)
		var after *sdk.Cursor
		marked := 0
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			n, next := plainPage(b, pool, threshold, after, base)
			marked += n
			after = next
			if next == nil {
				b.StopTimer()
				resetRunning(b, pool)
				b.StartTimer()
			}
		}
		plainRate = float64(marked) / b.Elapsed().Seconds()
		b.ReportMetric(plainRate, "marks/s")
	})

	b.Run("Board", func(b *testing.B) {
		resetRunning(b, pool)
		q := sdk.CandidateQuery{States: []string{sdk.StateRunning}, OrderBy: sdk.FieldHeartbeatAt,
			OlderThan: threshold, Heartbeat: sdk.HeartbeatSeen}
		marks := make([]sdk.Mark, 0, 100)
		marked := 0
		self := selfCPU()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			page, err := store.ListCandidates(ctx, q)
			if err != nil {
				b.Fatal(err)
			}
			marks = marks[:0]
			for _, c := range page.Candidates {
				marks = append(marks, sdk.Mark{Attempt: c.Attempt, FromStates: []string{sdk.StateRunning},
					HeartbeatBefore: threshold, Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost,
					Message: "agent_lost: no heartbeat", Confirm: true, Term: lease.Term, At: base})
			}
			res, err := store.Mark(ctx, marks)
			if err != nil {
				b.Fatal(err)
			}
			for _, r := range res {
				if !r.Applied {
					b.Fatalf("mark not applied: %+v", r)
				}
			}
			marked += len(res)
			q.After = page.Next
			if page.Next == nil {
				b.StopTimer()
				resetRunning(b, pool)
				b.StartTimer()
			}
		}
		// The test's process CPU a mark (the listing, the mark and the
		// benchmark's own loop; the resets between walks included).
		b.ReportMetric(float64((selfCPU()-self).Nanoseconds())/1e3/float64(marked), "go-µs/row")
		rate := float64(marked) / b.Elapsed().Seconds()
		b.ReportMetric(rate, "marks/s")
		if plainRate > 0 {
			b.ReportMetric(rate/plainRate, "x_plain_sql")
		}
	})
}

// plainPage is the hand-written ceiling: a keyset page and a guarded update
// of it in one transaction.
func plainPage(b *testing.B, pool *pgxpool.Pool, threshold time.Time, after *sdk.Cursor, now time.Time) (int, *sdk.Cursor) {
	ctx := context.Background()
	var n int
	var next *sdk.Cursor
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		at, run, task := time.Time{}, "", ""
		if after != nil {
			at, run, task = after.At, after.RunID, after.TaskID
		}
		rows, err := tx.Query(ctx, `SELECT run_id, task_id, try_number, attempt_epoch, last_heartbeat_at
            FROM task_instances
            WHERE state = 'running' AND last_heartbeat_at < $1
              AND (last_heartbeat_at, run_id, task_id) > ($2, $3, $4)
            ORDER BY last_heartbeat_at, run_id, task_id LIMIT 100`, threshold, at, run, task)
		if err != nil {
			return err
		}
		var runs, tasks []string
		var tries, epochs []int32
		var last time.Time
		for rows.Next() {
			var r, t string
			var try, epoch int32
			if err := rows.Scan(&r, &t, &try, &epoch, &last); err != nil {
				return err
			}
			runs, tasks, tries, epochs = append(runs, r), append(tasks, t), append(tries, try), append(epochs, epoch)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `UPDATE task_instances ti SET state = 'failed', last_failure_kind = 'infra',
                infra_marked_at = $5, infra_confirmed_at = $5, ended_at = $5, updated_at = $5
            FROM unnest($1::text[], $2::text[], $3::int4[], $4::int4[]) AS m(run_id, task_id, try_number, attempt_epoch)
            WHERE ti.run_id = m.run_id AND ti.task_id = m.task_id AND ti.try_number = m.try_number
              AND ti.attempt_epoch = m.attempt_epoch AND ti.state = 'running' AND ti.last_heartbeat_at < $6`,
			runs, tasks, tries, epochs, now, threshold)
		if err != nil {
			return err
		}
		n = int(tag.RowsAffected())
		if len(runs) == 100 {
			next = &sdk.Cursor{At: last, RunID: runs[99], TaskID: tasks[99]}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return n, next
}

// BenchmarkListCandidates lists pages of running attempts over 100,000 rows,
// half of them settled, walking the keyset to the end and starting over.
func BenchmarkListCandidates(b *testing.B) {
	ctx := context.Background()
	pool := pgtest.NewDB(b)
	store := board.New(pool, board.Options{})
	seedBulk(b, pool, benchRows)
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE task_instances"); err != nil {
		b.Fatal(err)
	}
	q := sdk.CandidateQuery{States: []string{sdk.StateRunning}, Executors: []string{sdk.ExecutorKube, sdk.ExecutorLite},
		OrderBy: sdk.FieldRunningAt, OlderThan: base.Add(-time.Minute)}
	listed := 0
	self := selfCPU()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		page, err := store.ListCandidates(ctx, q)
		if err != nil {
			b.Fatal(err)
		}
		listed += len(page.Candidates)
		q.After = page.Next
	}
	b.ReportMetric(float64((selfCPU()-self).Nanoseconds())/1e3/float64(listed), "go-µs/row")
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/page")
}

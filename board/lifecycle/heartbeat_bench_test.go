package lifecycle_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/machinecpu"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// The board of BenchmarkHeartbeatWrite: the fleet of issue #44, seeded as
// test/scale seeds it (ten task instances a run), each with the mint of
// its credential recorded, so that every heartbeat passes the credential
// fence by its comparison.
const (
	beatAttempts    = 150_000
	beatTasksPerRun = 10
	beatBatch       = 200
	beatRate        = 10_000 // heartbeats a second
)

// BenchmarkHeartbeatWrite measures what PostgreSQL spends on the board's
// heartbeat write alone: batches of beatBatch calls (REAPER_BEAT_BATCH
// sets another size) through HeartbeatCredentials, one at a time, paced at
// beatRate heartbeats a second for REAPER_BEAT_SECONDS (20 by default),
// round robin over 150,000 running attempts. It reports, per heartbeat,
// PostgreSQL's CPU over the load (the postmaster and all its processes,
// from /proc), the WAL it wrote, the share of its row updates that were
// HOT, and the CPU of vacuuming the dead tuples the load left: the test
// server runs no autovacuum, so one VACUUM after the load does what an
// autovacuum worker would. With REAPER_BEAT_EXPLAIN set it writes to
// standard error the indexes of task_instances and the plans of one batch
// under EXPLAIN (ANALYZE, BUFFERS, WAL).
//
// REAPER_BEAT_SETUP, statements separated by ';', runs after the seed: what
// an index or a table setting costs the heartbeat is read by dropping or
// changing it there.
//
// Run it alone, with -benchtime 1x: the figures are per heartbeat of one
// paced load, whatever b.N.
func BenchmarkHeartbeatWrite(b *testing.B) {
	ctx := context.Background()
	seconds := 20
	if s := os.Getenv("REAPER_BEAT_SECONDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			b.Fatalf("REAPER_BEAT_SECONDS=%q: want a positive number of seconds", s)
		}
		seconds = n
	}
	size := beatBatch
	if s := os.Getenv("REAPER_BEAT_BATCH"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 || n > beatRate {
			b.Fatalf("REAPER_BEAT_BATCH=%q: want a number of heartbeats from 1 to %d", s, beatRate)
		}
		size = n
	}
	pool := pgtest.NewDB(b)
	start := time.Now().UTC().Truncate(time.Millisecond)
	minted := start.Add(-time.Hour)
	seedBeats(b, pool, start, minted)
	if sql := os.Getenv("REAPER_BEAT_SETUP"); sql != "" {
		for _, q := range strings.Split(sql, ";") {
			if strings.TrimSpace(q) == "" {
				continue
			}
			if _, err := pool.Exec(ctx, q); err != nil {
				b.Fatal(err)
			}
		}
	}
	w := lifecycle.New(pool, lifecycle.Options{})

	calls := make([]lifecycle.HeartbeatCall, size)
	next := 0
	batch := func(at time.Time) []lifecycle.HeartbeatCall {
		for i := range calls {
			calls[i] = lifecycle.HeartbeatCall{Attempt: beatAttempt(next), MintedAt: minted, At: at}
			next = (next + 1) % beatAttempts
		}
		return calls
	}
	beat := func(at time.Time) {
		stop, err := w.HeartbeatCredentials(ctx, batch(at))
		if err != nil {
			b.Fatal(err)
		}
		for i, s := range stop {
			if s {
				b.Fatalf("heartbeat %s refused", calls[i].Attempt)
			}
		}
	}
	// Warm: one pass of batches over the first attempts, outside the
	// figures (the sessions, the statement's plan, the cache).
	for range 20 {
		beat(time.Now())
	}
	if os.Getenv("REAPER_BEAT_EXPLAIN") != "" {
		explainBeat(b, pool)
	}

	pgPID := pgtest.Current(b).PID()
	hotBefore, updBefore := beatUpdates(b, pool)
	walBefore := walLSN(b, pool)
	load := loadAverage()
	cpuBefore := machinecpu.Process(pgPID)
	interval := time.Second * time.Duration(size) / beatRate
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var beats, behind int
	began := time.Now()
	end := began.Add(time.Duration(seconds) * time.Second)
	b.ResetTimer()
	for time.Now().Before(end) {
		<-tick.C
		t0 := time.Now()
		beat(t0)
		beats += size
		if time.Since(t0) > interval {
			behind++
		}
	}
	b.StopTimer()
	elapsed := time.Since(began)
	pgCPU := machinecpu.Process(pgPID) - cpuBefore
	walBytes := walLSN(b, pool) - walBefore
	hotAfter, updAfter := beatUpdates(b, pool)

	vacBefore := machinecpu.Process(pgPID)
	if _, err := pool.Exec(ctx, "VACUUM task_instances"); err != nil {
		b.Fatal(err)
	}
	vacCPU := machinecpu.Process(pgPID) - vacBefore

	per := func(v float64) float64 { return v / float64(beats) }
	b.ReportMetric(per(pgCPU)*1e6, "pg-µs/hb")
	b.ReportMetric(per(vacCPU)*1e6, "vacuum-µs/hb")
	b.ReportMetric(per(float64(walBytes)), "wal-B/hb")
	if upd := updAfter - updBefore; upd > 0 {
		b.ReportMetric(100*float64(hotAfter-hotBefore)/float64(upd), "hot-%")
	}
	b.ReportMetric(float64(beats)/elapsed.Seconds(), "hb/s")
	b.Logf("%d heartbeats in %d s (%d batches over their %v), load average %s before; PostgreSQL %.1f µs/hb, vacuum %.1f µs/hb, WAL %.0f B/hb",
		beats, seconds, behind, interval, load, per(pgCPU)*1e6, per(vacCPU)*1e6, per(float64(walBytes)))
}

// beatAttempt is the i-th attempt seedBeats seeds.
func beatAttempt(i int) sdk.Attempt {
	return sdk.Attempt{RunID: fmt.Sprintf("run%06d", i/beatTasksPerRun), TaskID: fmt.Sprintf("task%02d", i%beatTasksPerRun), Try: 1}
}

// seedBeats seeds beatAttempts running Kube attempts in their runs, as
// test/scale seeds its fleet, each last heard 30 s before now and holding
// a credential first minted at minted.
func seedBeats(tb testing.TB, pool *pgxpool.Pool, now, minted time.Time) {
	tb.Helper()
	ctx := context.Background()
	for _, s := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO runs (run_id, dag_id, state, started_at, updated_at)
         SELECT 'run' || lpad(r::text, 6, '0'), 'dag', 'running', $1::timestamptz - interval '1 hour', $1
         FROM generate_series(0, $2::int - 1) r`, []any{now, beatAttempts / beatTasksPerRun}},
		{`INSERT INTO task_instances (run_id, task_id, executor, state, queued_at, running_at,
             last_heartbeat_at, credential_minted_at, updated_at)
         SELECT 'run' || lpad((i / $3::int)::text, 6, '0'), 'task' || lpad((i % $3::int)::text, 2, '0'), 'kube', 'running',
             $1::timestamptz - interval '51 minutes' + (i % 2400) * interval '1 second',
             $1::timestamptz - interval '50 minutes' + (i % 2400) * interval '1 second',
             $1::timestamptz - interval '30 seconds' - (i % 1000) * interval '1 millisecond', $4, $1
         FROM generate_series(0, $2::int - 1) i`, []any{now, beatAttempts, beatTasksPerRun, minted}},
		{`VACUUM ANALYZE runs, task_instances`, nil},
	} {
		if _, err := pool.Exec(ctx, s.sql, s.args...); err != nil {
			tb.Fatalf("seed the heartbeat board: %v", err)
		}
	}
}

// beatUpdates reads the table's HOT and all row updates from the server's
// statistics, the sessions' pending counts flushed first.
func beatUpdates(tb testing.TB, pool *pgxpool.Pool) (hot, all int64) {
	tb.Helper()
	ctx := context.Background()
	for _, c := range pool.AcquireAllIdle(ctx) {
		_, err := c.Exec(ctx, "SELECT pg_stat_force_next_flush()")
		c.Release()
		if err != nil {
			tb.Fatalf("flush the session's statistics: %v", err)
		}
	}
	if _, err := pool.Exec(ctx, "SELECT pg_stat_clear_snapshot()"); err != nil {
		tb.Fatalf("clear the statistics snapshot: %v", err)
	}
	if err := pool.QueryRow(ctx, `SELECT n_tup_hot_upd, n_tup_upd FROM pg_stat_user_tables WHERE relname = 'task_instances'`).
		Scan(&hot, &all); err != nil {
		tb.Fatalf("read the updates of task_instances: %v", err)
	}
	return hot, all
}

// walLSN is the server's current WAL insert position, in bytes.
func walLSN(tb testing.TB, pool *pgxpool.Pool) int64 {
	tb.Helper()
	var lsn int64
	if err := pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn`).Scan(&lsn); err != nil {
		tb.Fatalf("read the WAL position: %v", err)
	}
	return lsn
}

// loadAverage is the machine's one-minute load average, or "?".
func loadAverage() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(raw)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

// explainBeat logs the indexes of task_instances that hold a running row
// and the plan of one batch of the heartbeat's write under EXPLAIN
// (ANALYZE, BUFFERS, WAL), rolled back.
func explainBeat(tb testing.TB, pool *pgxpool.Pool) {
	tb.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid)
        FROM pg_index WHERE indrelid = 'task_instances'::regclass ORDER BY 1`)
	if err != nil {
		tb.Fatal(err)
	}
	for rows.Next() {
		var name, def string
		if err := rows.Scan(&name, &def); err != nil {
			tb.Fatal(err)
		}
		fmt.Fprintf(os.Stderr, "index %s\n", def)
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	runs, tasks := make([]string, beatBatch), make([]string, beatBatch)
	ones, zeros := make([]int32, beatBatch), make([]int32, beatBatch)
	ats, gaps := make([]time.Time, beatBatch), make([]int64, beatBatch)
	minted := make([]*time.Time, beatBatch)
	nulls := make([]*time.Time, beatBatch)
	var m time.Time
	if err := tx.QueryRow(ctx, `SELECT credential_minted_at FROM task_instances LIMIT 1`).Scan(&m); err != nil {
		tb.Fatal(err)
	}
	for i := range runs {
		a := beatAttempt(50_000 + i)
		runs[i], tasks[i], ones[i], ats[i], minted[i] = a.RunID, a.TaskID, 1, time.Now(), &m
	}
	args := []any{runs, tasks, ones, zeros, ats, ats, gaps, nulls, nulls, time.Time{}, minted}
	// The statement as the writer runs it: prepared, so after five runs
	// the server may keep a generic plan, which is shown too.
	// (EXPLAIN EXECUTE takes no parameters of its own: its arguments are
	// written as literals.)
	stamps := func(ts []time.Time) string {
		out := make([]string, len(ts))
		for i, t := range ts {
			out[i] = t.Format(time.RFC3339Nano)
		}
		return "'{" + strings.Join(out, ",") + "}'"
	}
	ints := func(n []int32) string {
		out := make([]string, len(n))
		for i, v := range n {
			out[i] = strconv.Itoa(int(v))
		}
		return "'{" + strings.Join(out, ",") + "}'"
	}
	nullList := "'{" + strings.TrimSuffix(strings.Repeat("NULL,", beatBatch), ",") + "}'"
	mintList := make([]time.Time, beatBatch)
	for i := range mintList {
		mintList[i] = m
	}
	params := []string{"'{" + strings.Join(runs, ",") + "}'", "'{" + strings.Join(tasks, ",") + "}'", ints(ones), ints(zeros),
		stamps(ats), stamps(ats), "'{" + strings.TrimSuffix(strings.Repeat("0,", beatBatch), ",") + "}'", nullList, nullList,
		"'" + time.Time{}.Format(time.RFC3339Nano) + "'", stamps(mintList)}
	for _, s := range []struct{ what, sql string }{
		{"custom plan", "EXPLAIN (ANALYZE, BUFFERS, WAL) " + lifecycle.HeartbeatSQL},
		{"generic plan", "EXPLAIN (ANALYZE, BUFFERS, WAL) EXECUTE beat (" + strings.Join(params, ", ") + ")"},
	} {
		if s.what == "generic plan" {
			if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = force_generic_plan"); err != nil {
				tb.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "PREPARE beat AS "+lifecycle.HeartbeatSQL); err != nil {
				tb.Fatal(err)
			}
		}
		qargs := args
		if s.what == "generic plan" {
			qargs = nil
		}
		prows, err := tx.Query(ctx, s.sql, qargs...)
		if err != nil {
			tb.Fatal(err)
		}
		var plan []string
		for prows.Next() {
			var line string
			if err := prows.Scan(&line); err != nil {
				tb.Fatal(err)
			}
			plan = append(plan, line)
		}
		if err := prows.Err(); err != nil {
			tb.Fatal(err)
		}
		fmt.Fprintf(os.Stderr, "one batch of %d, %s:\n%s\n", beatBatch, s.what, strings.Join(plan, "\n"))
		if s.what == "generic plan" {
			// (A prepared statement outlives the transaction.)
			if _, err := tx.Exec(ctx, "DEALLOCATE beat"); err != nil {
				tb.Fatal(err)
			}
		}
	}
}

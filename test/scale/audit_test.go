package scale_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/cmd/reaperctl/ctl"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// The audit at fleet scale: reap_decisions holding auditDecisions
// decisions spread over auditDays days, auditRuns runs of auditTasks tasks
// each (50 decisions a task instance on average), a deferral on most
// passes, a mark on some, a shadow decision on a few, a run-level and a
// host-level decision now and then. REAPER_SCALE_AUDIT sets another size.
const (
	auditDecisions = 10_000_000
	auditRuns      = 20_000
	auditTasks     = 10
	auditDays      = 100
	auditSample    = 200 // explains timed
)

// BenchmarkScaleAudit: explain's board reads (the task, its decisions, its
// log, its owed teardowns, as `reaperctl explain` makes them) over sampled
// attempts, the shadow scorer's page and `reaperctl shadow`'s window, and
// the retention prune: its batches and the whole of what a 90-day
// retention removes from 100 days.
func BenchmarkScaleAudit(b *testing.B) {
	n := auditDecisions
	if s := os.Getenv("REAPER_SCALE_AUDIT"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < auditRuns {
			b.Fatalf("REAPER_SCALE_AUDIT=%q: want a count of at least %d", s, auditRuns)
		}
		n = v
	}
	ctx := context.Background()
	pool := pgtest.NewDB(b)
	store := board.New(pool, board.Options{QueryTimeout: 5 * time.Minute})
	now := time.Now().UTC().Truncate(time.Second)
	for range b.N {
		start := time.Now()
		seedAudit(b, pool, store, now, n)
		seeded := time.Since(start)
		figure("audit", fmt.Sprintf("seed %d decisions (INSERT ... SELECT, indexes built after)", n),
			seeded.Round(time.Second).String())

		explains := timeExplains(b, store)
		// The first pays the pool's connections and their statements'
		// preparing, as a reaperctl invocation does once.
		figure("audit", "explain's board reads, the first (fresh connections)", ms(explains[0]))
		explains = explains[1:]
		p50, worst := quantile(explains, 0.5), slices.Max(explains)
		aimed("audit", fmt.Sprintf("explain's board reads, p50 of %d more attempts", auditSample-1), ms(p50), "< 50 ms", p50 < 50*time.Millisecond)
		aimed("audit", fmt.Sprintf("explain's board reads, max of %d more attempts", auditSample-1), ms(worst), "< 50 ms", worst < 50*time.Millisecond)

		t0 := time.Now()
		page, err := store.UnscoredDecisions(ctx, 0, 500)
		if err != nil {
			b.Fatal(err)
		}
		figure("audit", fmt.Sprintf("shadow scorer's page (%d pending decisions)", len(page)), ms(time.Since(t0)))
		t0 = time.Now()
		groups, _, err := store.ShadowDecisions(ctx, now.Add(-24*time.Hour))
		if err != nil {
			b.Fatal(err)
		}
		figure("audit", fmt.Sprintf("reaperctl shadow's last 24 h (%d groups)", len(groups)), ms(time.Since(t0)))

		var (
			batches []time.Duration
			removed int64
		)
		before := now.Add(-board.AuditRetentionDefault)
		lease, ok, err := store.TryAcquire(ctx, "bench", time.Hour, now)
		if err != nil || !ok {
			b.Fatalf("take the lease for the prune: %v %v", ok, err)
		}
		t0 = time.Now()
		for {
			t1 := time.Now()
			d, err := store.PruneDecisions(ctx, lease.Term, now, before, 0)
			if err != nil {
				b.Fatal(err)
			}
			batches = append(batches, time.Since(t1))
			removed += d
			if d == 0 {
				break
			}
			if len(batches)%20 == 0 {
				progress("audit: pruned %d decisions in %d batches", removed, len(batches))
			}
		}
		whole := time.Since(t0)
		bp50, bmax := quantile(batches, 0.5), slices.Max(batches)
		aimed("audit", fmt.Sprintf("prune batch (%d rows), p50", board.AuditPruneBatchDefault), ms(bp50), "< 1 s (no cycle waits: own goroutine)", bp50 < time.Second)
		figure("audit", fmt.Sprintf("prune batch (%d rows), max", board.AuditPruneBatchDefault), ms(bmax))
		figure("audit", fmt.Sprintf("prune, whole (%d decisions past 90 days, %d batches)", removed, len(batches)-1),
			whole.Round(time.Millisecond).String())
		explains = timeExplains(b, store)
		p50 = quantile(explains, 0.5)
		aimed("audit", "explain's board reads after the prune, p50", ms(p50), "< 50 ms", p50 < 50*time.Millisecond)
	}
}

// seedAudit fills the board with auditRuns runs and n decisions about
// them: three evidences as the board packs them (a deferral, a mark, a
// dry run), copied into every row by one INSERT ... SELECT a million rows
// at a time, with the secondary indexes dropped and built again after.
func seedAudit(b *testing.B, pool *pgxpool.Pool, store *board.Store, now time.Time, n int) {
	b.Helper()
	ctx := context.Background()
	exec := func(sql string, args ...any) {
		b.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			b.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`INSERT INTO runs (run_id, dag_id, state, started_at, updated_at)
        SELECT 'run' || lpad(r::text, 6, '0'), 'dag', 'running', $1::timestamptz - interval '100 days', $1
        FROM generate_series(0, $2::int - 1) r`, now, auditRuns)
	exec(`INSERT INTO task_instances (run_id, task_id, executor, state, queued_at, running_at, last_heartbeat_at, updated_at)
        SELECT 'run' || lpad((i / $3)::text, 6, '0'), 'task' || lpad((i % $3)::text, 2, '0'), 'lite', 'running',
            $1::timestamptz - interval '1 hour', $1::timestamptz - interval '50 minutes', $1, $1
        FROM generate_series(0, $2::int * $3 - 1) i`, now, auditRuns, auditTasks)

	a := sdk.Attempt{RunID: "run000000", TaskID: "task00", Try: 1}
	ev := func(extra ...string) map[string]string {
		e := map[string]string{"term": "7", "edition": "lite", "state": "running", "executor": "lite", "threshold": "1m30s",
			"heartbeat_age": "10m1.234s", "running_age": "49m12s", "queued_age": "50m3s", "liveness_live": "true",
			"liveness": "dead", "agent": "dead", "group": "dead", "ceiling": "24h0m0s", "signal": "positive",
			"liveness_detail": "agent 40213 gone (start time 123456789); group 40214 gone"}
		for i := 0; i < len(extra); i += 2 {
			e[extra[i]] = extra[i+1]
		}
		return e
	}
	samples := []sdk.Decision{
		{Reaper: "agentlost", Label: sdk.LabelAgentLostProcessAlive, Attempt: a, Evidence: ev("liveness", "alive", "agent", "alive")},
		{Reaper: "agentlost", Label: sdk.LabelAgentLost, Attempt: a, Applied: true, Evidence: ev("mark", "agent_lost", "policy", "fail")},
		{Reaper: "agentlost", Label: sdk.LabelAgentLost, Attempt: a, DryRun: true, Evidence: ev("mark", "agent_lost")},
	}
	if err := store.RecordDecisions(ctx, 7, now, samples); err != nil {
		b.Fatal(err)
	}
	var packed [][]byte
	rows, err := pool.Query(ctx, "SELECT evidence_packed FROM reap_decisions ORDER BY id")
	if err != nil {
		b.Fatal(err)
	}
	for rows.Next() {
		var p []byte
		if err := rows.Scan(&p); err != nil {
			b.Fatal(err)
		}
		packed = append(packed, p)
	}
	if rows.Err() != nil || len(packed) != len(samples) {
		b.Fatalf("sample evidence: %d of %d (%v)", len(packed), len(samples), rows.Err())
	}
	exec("TRUNCATE reap_decisions")

	// The secondary indexes as the migrations made them, built again after
	// the rows are in.
	var defs []string
	irows, err := pool.Query(ctx, `SELECT indexname, indexdef FROM pg_indexes
        WHERE tablename = 'reap_decisions' AND indexname <> 'reap_decisions_pkey'`)
	if err != nil {
		b.Fatal(err)
	}
	var names []string
	for irows.Next() {
		var name, def string
		if err := irows.Scan(&name, &def); err != nil {
			b.Fatal(err)
		}
		names, defs = append(names, name), append(defs, def)
	}
	for _, name := range names {
		exec("DROP INDEX " + name)
	}

	// Decision i: about task instance (i * 7919) mod the fleet (every one
	// in turn, scattered), made at now - 100 days + i's share of them. Of
	// ten: seven deferrals, two marks, one dry run (scored; judged right
	// when older than a day). One in a hundred is about the run only, one
	// in a hundred about no run (the host's). The marks and the dry run are
	// kills (agent_lost).
	const chunk = 1_000_000
	for from := 0; from < n; from += chunk {
		exec(`INSERT INTO reap_decisions (at, term, reaper, label, run_id, task_id, try_number, attempt_epoch,
                applied, dry_run, detail, evidence_packed, scored, verdict, verdict_at, verdict_term, kill)
            SELECT at, 7, CASE WHEN host THEN 'host' WHEN runonly THEN 'orphanrun' ELSE 'agentlost' END,
                CASE WHEN host THEN $7 WHEN runonly THEN $8 WHEN kind < 7 THEN $9 ELSE $10 END,
                CASE WHEN NOT host THEN 'run' || lpad((ti / $5)::text, 6, '0') END,
                CASE WHEN NOT host AND NOT runonly THEN 'task' || lpad((ti % $5)::text, 2, '0') END,
                CASE WHEN NOT host AND NOT runonly THEN 1 END, CASE WHEN NOT host AND NOT runonly THEN 0 END,
                NOT host AND NOT runonly AND kind IN (7, 8), NOT host AND NOT runonly AND kind = 9, '',
                ($6::bytea[])[CASE WHEN kind < 7 THEN 1 WHEN kind < 9 THEN 2 ELSE 3 END],
                scored,
                CASE WHEN scored AND at < $1::timestamptz - interval '1 day' THEN 'right' END,
                CASE WHEN scored AND at < $1::timestamptz - interval '1 day' THEN at + interval '1 hour' END,
                CASE WHEN scored AND at < $1::timestamptz - interval '1 day' THEN 7 END,
                NOT host AND NOT runonly AND kind >= 7
            FROM (SELECT $1::timestamptz - interval '100 days' + (i::float8 / $3) * interval '100 days' AS at,
                    (i::bigint * 7919) % ($4::int * $5) AS ti, i % 10 AS kind,
                    i % 100 = 0 AS runonly, i % 100 = 1 AS host,
                    i % 10 = 9 AND i % 100 NOT IN (0, 1) AS scored
                FROM generate_series($2::int, $2::int + $11::int - 1) i) s`,
			now, from, n, auditRuns, auditTasks, packed,
			sdk.LabelSettlingSkip, sdk.LabelOrphanReapNoop, sdk.LabelAgentLostProcessAlive, sdk.LabelAgentLost,
			min(chunk, n-from))
		progress("audit: seeded %d of %d decisions", min(from+chunk, n), n)
	}
	for _, def := range defs {
		exec(def)
	}
	exec("VACUUM ANALYZE reap_decisions, runs, task_instances")
	progress("audit: indexes built, vacuumed")
}

// timeExplains times explain's board reads, as `reaperctl explain RUN TASK`
// makes them with its default limit, over auditSample attempts spread over
// the fleet.
func timeExplains(b *testing.B, store *board.Store) []time.Duration {
	b.Helper()
	ctx := context.Background()
	out := make([]time.Duration, 0, auditSample)
	for k := range auditSample {
		ti := (k * 104729) % (auditRuns * auditTasks)
		run, task := fmt.Sprintf("run%06d", ti/auditTasks), fmt.Sprintf("task%02d", ti%auditTasks)
		t0 := time.Now()
		if _, err := store.Run(ctx, run); err != nil {
			b.Fatal(err)
		}
		if _, err := store.TaskInstance(ctx, run, task); err != nil {
			b.Fatal(err)
		}
		if _, err := store.DecisionsFor(ctx, run, task, ctl.ExplainLimitDefault+1); err != nil {
			b.Fatal(err)
		}
		if _, err := store.AttemptLog(ctx, run, task); err != nil {
			b.Fatal(err)
		}
		if _, err := store.OwedTeardownsFor(ctx, run, task); err != nil {
			b.Fatal(err)
		}
		out = append(out, time.Since(t0))
	}
	return out
}

// quantile is the q-quantile of ds (nearest rank).
func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

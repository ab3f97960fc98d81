package board_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
)

// seedBulk fills a database with n task instances over n/100 running runs:
// half of them settled (success), the rest queued, running (heartbeated or
// not) or failed with an infra mark, spread over executors and over the
// hours before base.
func seedBulk(t testing.TB, pool *pgxpool.Pool, n int) {
	t.Helper()
	ctx := context.Background()
	stmts := []string{
		`INSERT INTO runs (run_id, dag_id, state, started_at, updated_at)
         SELECT 'run' || lpad(r::text, 6, '0'), 'dag', 'running', $1::timestamptz - interval '1 day', $1
         FROM generate_series(0, ($2::int - 1) / 100) r`,
		`INSERT INTO task_instances (run_id, task_id, executor, state, queued_at, running_at, last_heartbeat_at,
             ended_at, last_failure_kind, infra_marked_at, updated_at)
         SELECT 'run' || lpad((i / 100)::text, 6, '0'), 'task' || lpad((i % 100)::text, 3, '0'),
             (ARRAY['kube', 'lite', 'warm'])[i % 3 + 1], st, q,
             CASE WHEN st <> 'queued' THEN q + interval '1 minute' END,
             CASE WHEN st <> 'queued' AND i % 10 <> 8 THEN q + interval '2 minutes' END,
             CASE WHEN st IN ('success', 'failed') THEN q + interval '3 minutes' END,
             CASE WHEN st = 'failed' THEN 'infra' END,
             CASE WHEN st = 'failed' THEN q + interval '3 minutes' END,
             $1
         FROM generate_series(0, $2::int - 1) i,
             LATERAL (SELECT $1::timestamptz - (i * interval '1 second') AS q,
                 (ARRAY['success', 'success', 'success', 'success', 'success',
                        'queued', 'running', 'running', 'running', 'failed'])[i % 10 + 1] AS st) t`,
		`ANALYZE`,
	}
	for _, s := range stmts {
		args := []any{base, n}
		if s == "ANALYZE" {
			args = nil
		}
		if _, err := pool.Exec(ctx, s, args...); err != nil {
			t.Fatalf("seed: %v", err)
		}
	}
}

// reaperQueries are the listings the reapers make.
func reaperQueries() map[string]sdk.CandidateQuery {
	after := &sdk.Cursor{At: base.Add(-10 * time.Hour), RunID: "run000500", TaskID: "task050"}
	return map[string]sdk.CandidateQuery{
		"DispatchLost": {States: []string{sdk.StateQueued}, Executors: []string{sdk.ExecutorKube, sdk.ExecutorLite},
			OrderBy: sdk.FieldQueuedAt, OlderThan: base.Add(-3 * time.Minute)},
		"DispatchLostNextPage": {States: []string{sdk.StateQueued}, Executors: []string{sdk.ExecutorKube, sdk.ExecutorLite},
			OrderBy: sdk.FieldQueuedAt, OlderThan: base.Add(-3 * time.Minute), After: after},
		"PodLost": {States: []string{sdk.StateRunning}, Executors: []string{sdk.ExecutorKube},
			OrderBy: sdk.FieldRunningAt, OlderThan: base.Add(-time.Minute), After: after},
		"AgentLost": {States: []string{sdk.StateRunning}, OrderBy: sdk.FieldHeartbeatAt,
			OlderThan: base.Add(-90 * time.Second), Heartbeat: sdk.HeartbeatSeen},
		"AgentLostNeverHeartbeated": {States: []string{sdk.StateRunning}, Executors: []string{sdk.ExecutorLite},
			OrderBy: sdk.FieldRunningAt, OlderThan: base.Add(-90 * time.Second), Heartbeat: sdk.HeartbeatNever, After: after},
		"CredentialCeiling": {States: []string{sdk.StateRunning}, Executors: []string{sdk.ExecutorLite},
			OrderBy: sdk.FieldRunningAt, OlderThan: base.Add(-time.Hour), After: after},
		"WarmWorkerLost": {States: []string{sdk.StateQueued, sdk.StateRunning}, Executors: []string{sdk.ExecutorWarm},
			OrderBy: sdk.FieldQueuedAt, OlderThan: base, After: after},
		"InfraConfirmValve": {States: []string{sdk.StateFailed}, OrderBy: sdk.FieldMarkedAt,
			OlderThan: base.Add(-2 * time.Minute), After: after},
		"ParkedPastTTL": {States: []string{sdk.StateUpForReschedule, sdk.StateDeferred}, OrderBy: sdk.FieldEndedAt,
			OlderThan: base.Add(-24 * time.Hour), After: after},
	}
}

func TestCandidateQueriesUseAnIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seedBulk(t, b.pool, 100_000)

	for name, q := range reaperQueries() {
		sql, args, _, err := board.CandidateSQL(q)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(name, func(t *testing.T) {
			// As planned for these values (a fresh statement)...
			plan, err := b.store.ExplainCandidates(context.Background(), q)
			if err != nil {
				t.Fatal(err)
			}
			assertIndexed(t, "custom plan", plan)
			// ...and as a cached statement's generic plan, where the
			// threshold and the cursor are unknown.
			assertIndexed(t, "generic plan", explainGeneric(t, b.pool, sql, args))
		})
	}

	t.Run("MarkFindsRowsByKey", func(t *testing.T) {
		var runs, tasks, from, kinds, reasons, msgs []string
		var tries, epochs []int32
		var noHB, confirm, hold []bool
		var hb, ats []time.Time
		var terms []int64
		for i := 0; i < 100; i++ {
			runs, tasks = append(runs, fmt.Sprintf("run%06d", i)), append(tasks, "task006")
			tries, epochs, from = append(tries, 1), append(epochs, 0), append(from, sdk.StateRunning)
			noHB, confirm, hold = append(noHB, false), append(confirm, false), append(hold, false)
			hb, kinds, reasons, msgs = append(hb, base), append(kinds, "infra"), append(reasons, "agent_lost"), append(msgs, "")
			terms, ats = append(terms, b.term), append(ats, base)
		}
		plan := explain(t, b.pool, "EXPLAIN (FORMAT JSON) "+board.MarkSQL, []string{board.LeaderNameDefault, ""}, runs, tasks, tries, epochs,
			from, hb, noHB, kinds, confirm, hold, reasons, msgs, terms, ats,
			sdk.MarkSourceStates(sdk.MarkInfra), sdk.MarkSourceStates(sdk.MarkTask))
		for _, n := range planNodes(plan) {
			if n["Node Type"] == "Seq Scan" && n["Relation Name"] == "task_instances" {
				t.Fatalf("the mark statement scans task_instances:\n%s", plan)
			}
		}
	})
}

// The warm-worker reaper lists every queued and running warm attempt each
// pass, with no threshold a healthy one stays under, so its listing must
// read the warm pool's rows only: on the index of every executor it walked
// all queued and running attempts and dropped the others one by one, a cost
// that grew with the kube fleet beside the pool (issue #44).
func TestWarmListingReadsOnlyTheWarmPool(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seedBulk(t, b.pool, 30_000) // a third of it warm
	q := reaperQueries()["WarmWorkerLost"]
	q.After = nil
	plan, err := b.store.ExplainAnalyzeCandidates(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	scans := 0
	for _, n := range planNodes(plan) {
		if n["Relation Name"] != "task_instances" {
			continue
		}
		scans++
		if n["Index Name"] != "task_instances_warm_queued_at_idx" {
			t.Fatalf("the warm listing reads task_instances through %v, not the warm pool's index:\n%s", n["Index Name"], plan)
		}
		if removed, _ := n["Rows Removed by Filter"].(float64); removed > 0 {
			t.Fatalf("the warm listing read and dropped %v rows:\n%s", removed, plan)
		}
	}
	if scans == 0 {
		t.Fatalf("no scan of task_instances in the plan:\n%s", plan)
	}
}

func explain(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) string {
	t.Helper()
	var plan string
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&plan); err != nil {
		t.Fatalf("explain: %v\n%s", err, sql)
	}
	return plan
}

// explainGeneric prepares sql and explains its generic plan.
func explainGeneric(t *testing.T, pool *pgxpool.Pool, sql string, args []any) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	types := []string{"timestamptz", "timestamptz", "text", "text"}[:len(args)]
	lits := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case time.Time:
			lits[i] = "'" + v.Format(time.RFC3339Nano) + "'"
		case string:
			lits[i] = "'" + v + "'"
		}
	}
	// The listing's settings hold for its transaction; so they do here.
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	for _, s := range []string{
		board.ListingSettings,
		"SET LOCAL plan_cache_mode = force_generic_plan",
		"PREPARE generic (" + strings.Join(types, ", ") + ") AS " + sql,
	} {
		if _, err := tx.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	defer conn.Exec(ctx, "DEALLOCATE generic") //nolint:errcheck
	var plan string
	if err := tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) EXECUTE generic ("+strings.Join(lits, ", ")+")").Scan(&plan); err != nil {
		t.Fatal(err)
	}
	return plan
}

func assertIndexed(t *testing.T, what, plan string) {
	t.Helper()
	indexed := false
	for _, n := range planNodes(plan) {
		switch typ := n["Node Type"]; {
		case typ == "Seq Scan" || typ == "Sort" || typ == "Incremental Sort" || typ == "Bitmap Heap Scan":
			t.Fatalf("%s has a %s node:\n%s", what, typ, plan)
		case typ == "Index Scan" || typ == "Index Only Scan":
			indexed = true
		}
	}
	if !indexed {
		t.Fatalf("%s uses no index:\n%s", what, plan)
	}
}

// planNodes flattens an EXPLAIN (FORMAT JSON) plan into its nodes.
func planNodes(plan string) []map[string]any {
	var doc []struct {
		Plan map[string]any `json:"Plan"`
	}
	if err := json.Unmarshal([]byte(plan), &doc); err != nil || len(doc) == 0 {
		return nil
	}
	var out []map[string]any
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		out = append(out, n)
		kids, _ := n["Plans"].([]any)
		for _, k := range kids {
			if m, ok := k.(map[string]any); ok {
				walk(m)
			}
		}
	}
	walk(doc[0].Plan)
	return out
}

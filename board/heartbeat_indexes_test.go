package board_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// Migrations 024 and 025 apply over a board that already holds live
// attempts: task_instances_queued_at_idx keeps its name, holds the queued
// ones and no running one, and the listing of queued attempts by queued_at
// still reads them all; task_instances_pool_active_idx is gone. (A fresh
// board takes them in TestMigrate with the rest.)
func TestHeartbeatIndexesOverAnExistingBoard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewEmptyDB(t)
	ms, err := board.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	// The board as a binary of schema 23 left it.
	if _, err := pool.Exec(ctx, board.CreateMigrationsTable); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Version >= 24 {
			break
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			if m.Version < board.FloorsSince {
				_, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name)
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version, name, floor) VALUES ($1, $2, $3)", m.Version, m.Name, m.Floor)
			return err
		}); err != nil {
			t.Fatalf("apply %s: %v", m.Name, err)
		}
	}
	now := time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)
	for _, s := range []string{
		`INSERT INTO runs (run_id, dag_id, state, started_at, updated_at)
         SELECT 'run' || r, 'dag', 'running', $1::timestamptz - interval '1 hour', $1 FROM generate_series(0, 99) r`,
		`INSERT INTO task_instances (run_id, task_id, executor, state, queued_at, running_at, last_heartbeat_at, updated_at)
         SELECT 'run' || (i / 10), 'task' || (i % 10), 'kube', CASE WHEN i % 4 = 0 THEN 'queued' ELSE 'running' END,
             $1::timestamptz - interval '10 minutes' + i * interval '1 second',
             CASE WHEN i % 4 <> 0 THEN $1::timestamptz - interval '5 minutes' END,
             CASE WHEN i % 4 <> 0 THEN $1::timestamptz END, $1
         FROM generate_series(0, 999) i`,
	} {
		if _, err := pool.Exec(ctx, s, now); err != nil {
			t.Fatalf("seed: %v", err)
		}
	}

	applied, err := board.Migrate(ctx, pool)
	if err != nil || len(applied) == 0 || !strings.HasPrefix(applied[0], "024_") {
		t.Fatalf("migrate over schema 23: %v (%v)", applied, err)
	}
	var def string
	var valid bool
	if err := pool.QueryRow(ctx, `SELECT pg_get_indexdef(i.indexrelid), i.indisvalid FROM pg_index i
        WHERE i.indexrelid = 'task_instances_queued_at_idx'::regclass`).Scan(&def, &valid); err != nil {
		t.Fatal(err)
	}
	if !valid || strings.Contains(def, "'running'") || !strings.Contains(def, "'queued'") {
		t.Fatalf("task_instances_queued_at_idx after 024 (valid %v): %s", valid, def)
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname = 'task_instances_pool_active_idx'`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("task_instances_pool_active_idx after 025: %d (%v)", left, err)
	}
	store := board.New(pool, board.Options{})
	page, err := store.ListCandidates(ctx, sdk.CandidateQuery{States: []string{sdk.StateQueued}, OrderBy: sdk.FieldQueuedAt,
		OlderThan: now.Add(time.Hour), Limit: 1000})
	if err != nil || len(page.Candidates) != 250 {
		t.Fatalf("queued attempts listed by queued_at after 024: %d (%v), want 250", len(page.Candidates), err)
	}
}

// A running attempt's heartbeat writes an entry in every index of
// task_instances whose predicate holds its row (the update is not HOT:
// docs/board.md, "What a heartbeat writes"). Those are exactly the ones a
// read of running rows needs: the primary key, running_at's and
// last_heartbeat_at's, and for a warm attempt the warm pool's listing. An
// index added over running rows must be read by some listing of them, and
// is then added here.
func TestIndexesARunningRowLivesIn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	now := time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)
	want := map[string][]string{
		sdk.ExecutorKube: {"task_instances_heartbeat_idx", "task_instances_pkey", "task_instances_running_at_idx"},
		sdk.ExecutorLite: {"task_instances_heartbeat_idx", "task_instances_pkey", "task_instances_running_at_idx"},
		sdk.ExecutorWarm: {"task_instances_heartbeat_idx", "task_instances_pkey", "task_instances_running_at_idx",
			"task_instances_warm_queued_at_idx"},
	}
	for executor, want := range want {
		// One running attempt that has heartbeated, alone in the table.
		for _, s := range []string{
			`DELETE FROM task_instances`,
			`INSERT INTO runs (run_id, dag_id, state, started_at, updated_at) VALUES ('run', 'dag', 'running', $1, $1)
             ON CONFLICT DO NOTHING`,
			`INSERT INTO task_instances (run_id, task_id, executor, state, queued_at, running_at, last_heartbeat_at,
                 warm_worker, credential_minted_at, updated_at)
             VALUES ('run', 'task', $2, 'running', $1, $1, $1, CASE WHEN $2 = 'warm' THEN 'worker' END, $1, $1)`,
		} {
			args := []any{now, executor}
			switch {
			case strings.HasPrefix(s, "DELETE"):
				args = nil
			case strings.Contains(s, "INSERT INTO runs"):
				args = args[:1]
			}
			if _, err := pool.Exec(ctx, s, args...); err != nil {
				t.Fatalf("%s: %v", executor, err)
			}
		}
		rows, err := pool.Query(ctx, `SELECT c.relname, coalesce(pg_get_expr(i.indpred, i.indrelid), 'true')
            FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
            WHERE i.indrelid = 'task_instances'::regclass ORDER BY c.relname`)
		if err != nil {
			t.Fatal(err)
		}
		preds := map[string]string{}
		var names []string
		for rows.Next() {
			var name, pred string
			if err := rows.Scan(&name, &pred); err != nil {
				t.Fatal(err)
			}
			preds[name] = pred
			names = append(names, name)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		var holding []string
		for _, name := range names {
			var n int
			// The predicate is the server's own text of a catalog entry.
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM task_instances WHERE "+preds[name]).Scan(&n); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if n > 0 {
				holding = append(holding, name)
			}
		}
		if strings.Join(holding, " ") != strings.Join(want, " ") {
			t.Errorf("a running %s attempt's heartbeat writes %v, want %v", executor, holding, want)
		}
	}
}

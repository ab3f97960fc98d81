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

// Migration 024 rebuilds task_instances_queued_at_idx without the running
// rows over a board that already holds live attempts: the index keeps its
// name, holds the queued ones and no running one, and the listing of queued
// attempts by queued_at still reads them all. (A fresh board takes it in
// TestMigrate with the rest.)
func TestQueuedAtIndexNarrowedOverAnExistingBoard(t *testing.T) {
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
	store := board.New(pool, board.Options{})
	page, err := store.ListCandidates(ctx, sdk.CandidateQuery{States: []string{sdk.StateQueued}, OrderBy: sdk.FieldQueuedAt,
		OlderThan: now.Add(time.Hour), Limit: 1000})
	if err != nil || len(page.Candidates) != 250 {
		t.Fatalf("queued attempts listed by queued_at after 024: %d (%v), want 250", len(page.Candidates), err)
	}
}

package board_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

func TestMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	all, err := board.Migrations()
	if err != nil || len(all) == 0 {
		t.Fatalf("embedded migrations: %v %v", all, err)
	}

	t.Run("AppliesEachMigrationOnce", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewEmptyDB(t)
		applied, err := board.Migrate(ctx, pool)
		if err != nil || len(applied) != len(all) || applied[0] != all[0].Name {
			t.Fatalf("first migrate: %v %v", applied, err)
		}
		again, err := board.Migrate(ctx, pool)
		if err != nil || len(again) != 0 {
			t.Fatalf("second migrate applied %v (%v), want nothing", again, err)
		}
		if err := board.CheckSchema(ctx, pool); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("ConcurrentMigrationsApplyEachOnce", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewEmptyDB(t)
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			total []string
		)
		for i := 0; i < 3; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				applied, err := board.Migrate(ctx, pool)
				if err != nil {
					t.Error(err)
				}
				mu.Lock()
				total = append(total, applied...)
				mu.Unlock()
			}()
		}
		wg.Wait()
		if len(total) != len(all) {
			t.Fatalf("three concurrent migrations applied %v, want each file once", total)
		}
	})

	t.Run("CheckSchemaNamesWhatItFoundAndExpected", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewEmptyDB(t)
		want := board.SchemaVersion()
		err := board.CheckSchema(ctx, pool)
		var se *board.SchemaError
		if !errors.As(err, &se) || se.Found != 0 || se.Expected != want || !strings.Contains(err.Error(), "reaperd migrate") {
			t.Fatalf("unmigrated: %v", err)
		}
		if _, err := board.Migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
		// A newer migration that raised the floor above this binary: the
		// check and the migration refuse it, in one line that names this
		// binary's schema, the floor and the migration that raised it.
		future := fmt.Sprintf("%03d_future.sql", want+1)
		if _, err := pool.Exec(ctx, "INSERT INTO schema_migrations (version, name, floor) VALUES ($1, $2, $1)", want+1, future); err != nil {
			t.Fatal(err)
		}
		err = board.CheckSchema(ctx, pool)
		if !errors.As(err, &se) || se.Found != want+1 || se.Expected != want || se.Floor != want+1 || se.FloorSetBy != future {
			t.Fatalf("above the floor: %v (%+v)", err, se)
		}
		line := se.Error()
		for _, part := range []string{fmt.Sprintf("schema %d", want), fmt.Sprintf("floor %d", want+1), future, "upgrade this binary"} {
			if !strings.Contains(line, part) {
				t.Errorf("%q does not name %q", line, part)
			}
		}
		if strings.Contains(line, "\n") {
			t.Errorf("%q is more than one line", line)
		}
		if _, err := board.Migrate(ctx, pool); !errors.As(err, &se) || se.Floor != want+1 {
			t.Fatalf("migrating a database whose floor is above the binary: %v, want a schema error", err)
		}
	})

	t.Run("NewerAdditiveMigrationsKeepOlderBinariesRunning", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewEmptyDB(t)
		want := board.SchemaVersion()
		if _, err := board.Migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
		st, err := board.ReadSchema(ctx, pool)
		if err != nil || st.Version != want || st.Floor != all[len(all)-1].Floor {
			t.Fatalf("schema %+v (%v), want version %d at floor %d", st, err, want, all[len(all)-1].Floor)
		}
		// Two newer additive migrations (the floor stays where this
		// binary's newest left it), as a newer release would record them.
		for v := want + 1; v <= want+2; v++ {
			if _, err := pool.Exec(ctx, "INSERT INTO schema_migrations (version, name, floor) VALUES ($1, $2, $3)",
				v, fmt.Sprintf("%03d_additive.sql", v), st.Floor); err != nil {
				t.Fatal(err)
			}
		}
		if err := board.CheckSchema(ctx, pool); err != nil {
			t.Fatalf("a newer database with additive migrations refused a binary at its floor: %v", err)
		}
		applied, err := board.Migrate(ctx, pool)
		if err != nil || len(applied) != 0 {
			t.Fatalf("migrating a newer additive database: applied %v (%v), want nothing and no error", applied, err)
		}
		if st, err := board.ReadSchema(ctx, pool); err != nil || st.Version != want+2 || st.Floor != all[len(all)-1].Floor {
			t.Fatalf("schema %+v (%v)", st, err)
		}
		// Then a breaking one: from here on this binary is below the floor.
		if _, err := pool.Exec(ctx, "INSERT INTO schema_migrations (version, name, floor) VALUES ($1, $2, $1)",
			want+3, fmt.Sprintf("%03d_breaking.sql", want+3)); err != nil {
			t.Fatal(err)
		}
		var se *board.SchemaError
		if err := board.CheckSchema(ctx, pool); !errors.As(err, &se) || se.Floor != want+3 {
			t.Fatalf("after a breaking migration: %v", err)
		}
	})

	t.Run("FloorsAreRecorded", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewEmptyDB(t)
		if _, err := board.Migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
		rows, err := pool.Query(ctx, "SELECT version, floor FROM schema_migrations ORDER BY version")
		if err != nil {
			t.Fatal(err)
		}
		floors := map[int]int{}
		for rows.Next() {
			var v, f int
			if err := rows.Scan(&v, &f); err != nil {
				t.Fatal(err)
			}
			floors[v] = f
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		// Before migration 019: each raised the floor to itself but 003,
		// 004 and 015 (indexes, functions), which kept the one before.
		for v := 1; v < board.FloorsSince; v++ {
			want := v
			switch v {
			case 3, 4:
				want = 2
			case 15:
				want = 14
			}
			if floors[v] != want {
				t.Errorf("migration %d: floor %d, want %d", v, floors[v], want)
			}
		}
		for _, m := range all {
			if m.Version >= board.FloorsSince && floors[m.Version] != m.Floor {
				t.Errorf("%s: floor %d recorded, its file says %d", m.Name, floors[m.Version], m.Floor)
			}
		}
		if len(floors) != len(all) {
			t.Errorf("%d rows, %d migrations", len(floors), len(all))
		}
		// The column holds a floor for every row, within 1..version.
		for _, sql := range []string{
			"INSERT INTO schema_migrations (version, name) VALUES (1000, '1000_x.sql')",
			"INSERT INTO schema_migrations (version, name, floor) VALUES (1000, '1000_x.sql', 1001)",
			"INSERT INTO schema_migrations (version, name, floor) VALUES (1000, '1000_x.sql', 0)",
		} {
			if _, err := pool.Exec(ctx, sql); err == nil {
				t.Errorf("%s: accepted", sql)
			}
		}
	})

	t.Run("ADatabaseThatLacksAMigrationBelowItsNewestIsRefused", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewEmptyDB(t)
		if _, err := board.Migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
		last := all[len(all)-1]
		if _, err := pool.Exec(ctx, "DELETE FROM schema_migrations WHERE version = $1", last.Version-1); err != nil {
			t.Fatal(err)
		}
		if _, err := board.Migrate(ctx, pool); err == nil || !strings.Contains(err.Error(), all[len(all)-2].Name) {
			t.Fatalf("a gap below the newest: %v, want a refusal naming %s", err, all[len(all)-2].Name)
		}
	})

	t.Run("OlderSchemaIsNamedOlder", func(t *testing.T) {
		t.Parallel()
		err := (&board.SchemaError{Found: 1, Expected: 2}).Error()
		if !strings.Contains(err, "older") || !strings.Contains(err, "found version 1, expected 2") {
			t.Fatalf("message %q", err)
		}
	})
}

// TestMigrationFiles: the versions run from 1 without a gap, and every file
// from FloorsSince on declares its floor on its first line (Migrations
// refuses one that does not; the floors it computes are checked here).
func TestMigrationFiles(t *testing.T) {
	t.Parallel()
	ms, err := board.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	floor := 0
	for i, m := range ms {
		if m.Version != i+1 {
			t.Fatalf("%s at position %d", m.Name, i)
		}
		if m.Version < board.FloorsSince {
			if m.Floor != 0 || strings.HasPrefix(m.SQL, "-- reaper:") {
				t.Errorf("%s: before migration %d, it declares no floor", m.Name, board.FloorsSince)
			}
			continue
		}
		if m.Floor < floor || m.Floor > m.Version || (m.Additive && m.Floor != floor) {
			t.Errorf("%s: floor %d (additive %v) after floor %d", m.Name, m.Floor, m.Additive, floor)
		}
		floor = m.Floor
	}
	if ms[board.FloorsSince-1].Floor != board.FloorsSince {
		t.Errorf("migration %d raises the floor to itself: %+v", board.FloorsSince, ms[board.FloorsSince-1])
	}
}

func TestCheckConstraints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.run(t, "run", "task")
	for name, sql := range map[string]string{
		"RunState":        "UPDATE runs SET state = 'paused'",
		"TaskState":       "UPDATE task_instances SET state = 'zombie'",
		"Executor":        "UPDATE task_instances SET executor = 'k8s'",
		"FailureKind":     "UPDATE task_instances SET last_failure_kind = 'cosmic_ray'",
		"NegativeTry":     "UPDATE task_instances SET try_number = 0",
		"NegativeBudget":  "UPDATE task_instances SET infra_used = -1",
		"RunningNoStart":  "UPDATE runs SET started_at = NULL",
		"EmptyAuditLabel": "INSERT INTO reap_decisions (at, term, reaper, label, applied, dry_run) VALUES (now(), 1, 'x', '', false, false)",
	} {
		t.Run(name+"IsRejected", func(t *testing.T) {
			if _, err := b.pool.Exec(ctx, sql); !isCheckViolation(err) {
				t.Fatalf("%s: err = %v, want a check violation", sql, err)
			}
		})
	}
}

func TestUnreachableDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	pool, err := pgxpool.New(ctx, "postgres://reaper@"+addr+"/reaper?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s := board.New(pool, board.Options{QueryTimeout: 5 * time.Second})
	a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}
	calls := map[string]func() error{
		"board: list candidates": func() error {
			_, err := s.ListCandidates(ctx, sdk.CandidateQuery{States: []string{sdk.StateQueued}, OrderBy: sdk.FieldQueuedAt, OlderThan: base})
			return err
		},
		"board: mark": func() error {
			_, err := s.Mark(ctx, []sdk.Mark{{Attempt: a, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra, Term: 1, At: base}})
			return err
		},
		"board: list orphan runs": func() error { _, err := s.ListOrphanRuns(ctx, sdk.RunQuery{OlderThan: base}); return err },
		"board: reap run": func() error {
			_, err := s.ReapRun(ctx, sdk.RunReap{RunID: "r", OlderThan: base, Term: 1, At: base})
			return err
		},
		"board: list provisional marks": func() error { _, err := s.ListProvisional(ctx, sdk.ProvisionalQuery{}); return err },
		"board: confirm infra": func() error {
			_, err := s.ConfirmInfra(ctx, []sdk.Confirm{{Attempt: a, Term: 1, At: base}})
			return err
		},
		"board: override infra mark": func() error {
			_, err := s.OverrideInfra(ctx, []sdk.Override{{Attempt: a, Term: 1, At: base}})
			return err
		},
		"board: settle": func() error {
			_, err := s.Settle(ctx, []sdk.Settlement{{Attempt: a, Outcome: sdk.OutcomeSuccess,
				FromStates: []string{sdk.StateRunning}, Term: 1, At: base}})
			return err
		},
		"board: append log": func() error {
			return s.AppendLog(ctx, 1, []sdk.LogLine{{Attempt: a, At: base, Line: "x"}})
		},
		"board: record decisions": func() error {
			return s.RecordDecisions(ctx, 1, base, []sdk.Decision{{Label: sdk.LabelAgentLost}})
		},
		"board: acquire leadership": func() error { _, _, err := s.TryAcquire(ctx, "h", time.Second, base); return err },
		"board: check schema":       func() error { return board.CheckSchema(ctx, pool) },
		"board: migrate":            func() error { _, err := board.Migrate(ctx, pool); return err },
	}
	for prefix, call := range calls {
		err := call()
		if err == nil || !strings.HasPrefix(err.Error(), prefix) {
			t.Errorf("%s: err = %v, want an error naming the operation", prefix, err)
		}
	}
}

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
		if _, err := pool.Exec(ctx, "INSERT INTO schema_migrations (version, name) VALUES (999, '999_future.sql')"); err != nil {
			t.Fatal(err)
		}
		err = board.CheckSchema(ctx, pool)
		if !errors.As(err, &se) || se.Found != 999 || se.Expected != want ||
			!strings.Contains(err.Error(), fmt.Sprintf("found version 999, expected %d", want)) ||
			!strings.Contains(err.Error(), "newer") {
			t.Fatalf("newer: %v", err)
		}
		if _, err := board.Migrate(ctx, pool); !errors.As(err, &se) {
			t.Fatalf("migrating a newer database: %v, want a schema error", err)
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

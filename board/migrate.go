package board

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board/migrations"
)

// migrateLockKey is the advisory lock that serialises migrations: two
// reaperd processes migrating the same database at once apply each file once.
const migrateLockKey int64 = 0x7265617065720001 // "reaper" + 1

// Migration is one embedded schema file.
type Migration struct {
	Version int
	Name    string // the file name, e.g. 001_board.sql
	SQL     string
}

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(migrations.FS, ".")
	if err != nil {
		return nil, fmt.Errorf("board: read migrations: %w", err)
	}
	var ms []Migration
	seen := map[int]string{}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".sql") {
			continue
		}
		num, _, ok := strings.Cut(name, "_")
		if !ok {
			return nil, fmt.Errorf("board: migration %s: name is not NNN_name.sql", name)
		}
		v, err := strconv.Atoi(num)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("board: migration %s: version %q is not a positive number", name, num)
		}
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("board: migrations %s and %s share version %d", prev, name, v)
		}
		seen[v] = name
		body, err := fs.ReadFile(migrations.FS, name)
		if err != nil {
			return nil, fmt.Errorf("board: read migration %s: %w", name, err)
		}
		ms = append(ms, Migration{Version: v, Name: name, SQL: string(body)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	return ms, nil
}

// SchemaVersion is the newest schema version this binary knows.
func SchemaVersion() int {
	ms, err := Migrations()
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

// SchemaError says that the database's schema is not the one this binary
// was built for.
type SchemaError struct {
	Found    int // the newest version applied to the database; 0: none
	Expected int // the newest version this binary knows
}

func (e *SchemaError) Error() string {
	switch {
	case e.Found == 0:
		return fmt.Sprintf("database schema is not migrated (found no version, expected %d): run `reaperd migrate`", e.Expected)
	case e.Found < e.Expected:
		return fmt.Sprintf("database schema is older than this binary (found version %d, expected %d): run `reaperd migrate`", e.Found, e.Expected)
	default:
		return fmt.Sprintf("database schema is newer than this binary (found version %d, expected %d): upgrade this binary", e.Found, e.Expected)
	}
}

const createMigrationsTable = `
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`

// Migrate applies every embedded migration the database lacks, each in its
// own transaction, under an advisory lock, and returns the names of those it
// applied (none when the schema is current). It refuses a database that
// already holds a version this binary does not know.
func Migrate(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	ms, err := Migrations()
	if err != nil {
		return nil, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("board: migrate: acquire connection: %w", err)
	}
	defer conn.Release()

	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrateLockKey); err != nil {
		return nil, fmt.Errorf("board: migrate: take advisory lock: %w", err)
	}
	defer func() {
		// A fresh context: the unlock must run even when ctx is done. If it
		// fails the session ends with the connection and the lock with it.
		if _, err := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", migrateLockKey); err != nil {
			conn.Conn().Close(context.WithoutCancel(ctx))
		}
	}()

	if _, err := conn.Exec(ctx, createMigrationsTable); err != nil {
		return nil, fmt.Errorf("board: migrate: create schema_migrations: %w", err)
	}
	applied, err := appliedVersions(ctx, conn.Conn())
	if err != nil {
		return nil, fmt.Errorf("board: migrate: %w", err)
	}
	known := map[int]bool{}
	for _, m := range ms {
		known[m.Version] = true
	}
	for v := range applied {
		if !known[v] {
			return nil, fmt.Errorf("board: migrate: %w", &SchemaError{Found: maxVersion(applied), Expected: SchemaVersion()})
		}
	}

	var names []string
	for _, m := range ms {
		if applied[m.Version] {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name)
			return err
		})
		if err != nil {
			return names, fmt.Errorf("board: migrate: apply %s: %w", m.Name, err)
		}
		names = append(names, m.Name)
	}
	return names, nil
}

// CheckSchema returns nil when the database holds exactly the schema this
// binary knows, and a *SchemaError (wrapped) naming the version found and the
// version expected otherwise.
func CheckSchema(ctx context.Context, pool *pgxpool.Pool) error {
	expected := SchemaVersion()
	var found int
	err := pool.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM schema_migrations").Scan(&found)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		found, err = 0, nil
	}
	if err != nil {
		return fmt.Errorf("board: check schema: %w", err)
	}
	if found != expected {
		return fmt.Errorf("board: check schema: %w", &SchemaError{Found: found, Expected: expected})
	}
	return nil
}

func appliedVersions(ctx context.Context, conn *pgx.Conn) (map[int]bool, error) {
	rows, err := conn.Query(ctx, "SELECT version FROM schema_migrations")
	if err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	applied := make(map[int]bool, len(vs))
	for _, v := range vs {
		applied[int(v)] = true
	}
	return applied, nil
}

func maxVersion(vs map[int]bool) int {
	m := 0
	for v := range vs {
		if v > m {
			m = v
		}
	}
	return m
}

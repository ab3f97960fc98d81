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
	"github.com/dexaflow/reaper/sdk"
)

// migrateLockKey is the advisory lock that serialises migrations: two
// reaperd processes migrating the same database at once apply each file once.
const migrateLockKey int64 = 0x7265617065720001 // "reaper" + 1

// Migration is one embedded schema file.
type Migration struct {
	Version int
	Name    string // the file name, e.g. 001_board.sql
	SQL     string
	// Floor is the floor in force once the migration is applied: the
	// oldest schema version a binary must know to run on a database whose
	// newest migration is this one (see board/migrations). 0 for the
	// migrations before FloorsSince, whose floors that migration records.
	Floor int
	// Additive: the migration keeps the floor where the one before it left
	// it (its first line is "-- reaper: additive").
	Additive bool
}

// FloorsSince is the migration that records floors (019_migration_floor):
// from it on, every migration file's first line declares its floor.
const FloorsSince = 19

// floorDirective is how a migration's first line begins.
const floorDirective = "-- reaper:"

// Migrations returns the embedded migrations in version order: the
// product's, then the upgrade probe's in a build with the tag
// reaper_upgrade_probe. The versions run from 1 without a gap.
func Migrations() ([]Migration, error) {
	ms, err := readMigrations()
	if err != nil {
		return nil, err
	}
	probe, err := fs.ReadDir(migrations.Probe, "probe")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("board: read the upgrade probe's migration: %w", err)
	}
	for _, e := range probe {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		body, err := fs.ReadFile(migrations.Probe, "probe/"+e.Name())
		if err != nil {
			return nil, fmt.Errorf("board: read the upgrade probe's migration: %w", err)
		}
		v := len(ms) + 1
		ms = append(ms, Migration{Version: v, Name: fmt.Sprintf("%03d_%s", v, e.Name()), SQL: string(body)})
	}
	floor := 0
	for i := range ms {
		m := &ms[i]
		if m.Version < FloorsSince {
			continue
		}
		declared, additive, err := parseFloor(m.Version, m.SQL)
		if err != nil {
			return nil, fmt.Errorf("board: migration %s: %w", m.Name, err)
		}
		switch {
		case additive && floor == 0:
			return nil, fmt.Errorf("board: migration %s: the first migration with a floor cannot be additive", m.Name)
		case additive:
			m.Floor, m.Additive = floor, true
		case declared < floor:
			return nil, fmt.Errorf("board: migration %s: floor=%d is below the floor already in force (%d): write %s additive",
				m.Name, declared, floor, floorDirective)
		default:
			m.Floor = declared
		}
		floor = m.Floor
	}
	return ms, nil
}

// readMigrations reads the product's files, checks their names and that
// their versions run from 1 without a gap, and returns them in order.
func readMigrations() ([]Migration, error) {
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
	for i, m := range ms {
		if m.Version != i+1 {
			return nil, fmt.Errorf("board: migration %s: version %d follows %d: the versions run from 1 without a gap", m.Name, m.Version, i)
		}
	}
	return ms, nil
}

// parseFloor reads the floor directive on the first line of a migration
// of the given version: "-- reaper: additive" or "-- reaper: floor=N".
func parseFloor(version int, sql string) (floor int, additive bool, err error) {
	first, _, _ := strings.Cut(sql, "\n")
	first = strings.TrimSpace(strings.TrimSuffix(first, "\r"))
	rest, ok := strings.CutPrefix(first, floorDirective)
	if !ok {
		return 0, false, fmt.Errorf("the first line must declare the floor (%s additive, or %s floor=N), not %q",
			floorDirective, floorDirective, first)
	}
	rest = strings.TrimSpace(rest)
	if rest == "additive" {
		return 0, true, nil
	}
	num, ok := strings.CutPrefix(rest, "floor=")
	n, perr := strconv.Atoi(num)
	switch {
	case !ok || perr != nil:
		return 0, false, fmt.Errorf("%q: want %s additive, or %s floor=N", first, floorDirective, floorDirective)
	case n < 1 || n > version:
		return 0, false, fmt.Errorf("%q: the floor must be between 1 and the migration's own version %d", first, version)
	}
	return n, false, nil
}

// SchemaVersion is the newest schema version this binary knows.
func SchemaVersion() int {
	ms, err := Migrations()
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

// Schema is what the database holds: its newest migration and the floor
// recorded with it.
type Schema struct {
	Version int // the newest migration applied; 0: none
	// Floor is the floor recorded with the newest migration, and FloorSetBy
	// the name of the migration that raised it there; 0 and "" on a
	// database older than FloorsSince.
	Floor      int
	FloorSetBy string
}

// Admits returns nil when a binary whose newest migration is known may run
// on the schema: the schema is known's own, or newer with a floor at or
// below known. Otherwise it returns the *SchemaError that says why not.
func (s Schema) Admits(known int) error {
	switch {
	case s.Version == known:
		return nil
	case s.Version < known:
		return &SchemaError{Found: s.Version, Expected: known}
	case s.Floor == 0 || s.Floor > known:
		return &SchemaError{Found: s.Version, Expected: known, Floor: s.Floor, FloorSetBy: s.FloorSetBy}
	}
	return nil
}

// SchemaError says that this binary may not run on the database's schema:
// the database is not migrated, older than the binary (run reaperd
// migrate), or newer with a floor above the binary (upgrade the binary).
type SchemaError struct {
	Found    int // the newest version applied to the database; 0: none
	Expected int // the newest version this binary knows
	// Floor is the floor recorded with the database's newest migration
	// when that is newer than the binary (0: none recorded), and
	// FloorSetBy the migration that raised it there.
	Floor      int
	FloorSetBy string
}

// Error is one line: what was found, and what to do.
func (e *SchemaError) Error() string {
	switch {
	case e.Found == 0:
		return fmt.Sprintf("database schema is not migrated (found no version, expected %d): run `reaperd migrate`", e.Expected)
	case e.Found < e.Expected:
		return fmt.Sprintf("database schema is older than this binary (found version %d, expected %d): run `reaperd migrate`", e.Found, e.Expected)
	case e.Floor > e.Expected:
		return fmt.Sprintf("this binary (version %s, schema %d) is below the database's floor %d, raised by migration %s "+
			"(the database is at schema %d): upgrade this binary to a release of schema %d or newer",
			sdk.BuildVersion, e.Expected, e.Floor, e.FloorSetBy, e.Found, e.Floor)
	default:
		return fmt.Sprintf("database schema is newer than this binary and records no floor (found version %d, expected %d): upgrade this binary", e.Found, e.Expected)
	}
}

const createMigrationsTable = `
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`

// Migrate applies every embedded migration the database lacks, each in its
// own transaction with its row in schema_migrations (and, from FloorsSince
// on, its floor), under an advisory lock, and returns the names of those it
// applied (none when the schema is current). On a database newer than the
// binary it applies nothing: it returns no error when the binary is at or
// above the database's floor, and a *SchemaError (wrapped) when below.
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
	known := ms[len(ms)-1].Version
	if newest := maxVersion(applied); newest > known {
		// A newer database: this binary applies nothing, and runs on it
		// only at or above its floor.
		st, err := readSchema(ctx, conn)
		if err != nil {
			return nil, fmt.Errorf("board: migrate: %w", err)
		}
		if err := st.Admits(known); err != nil {
			return nil, fmt.Errorf("board: migrate: %w", err)
		}
	}
	var names []string
	for _, m := range ms {
		if applied[m.Version] {
			continue
		}
		if maxVersion(applied) > m.Version {
			// A gap below the newest applied version: the database was
			// migrated by a build with other files.
			return names, fmt.Errorf("board: migrate: the database lacks migration %s but holds version %d: "+
				"it was migrated by a build whose migrations differ from this binary's", m.Name, maxVersion(applied))
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			if m.Version < FloorsSince {
				_, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name)
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version, name, floor) VALUES ($1, $2, $3)",
				m.Version, m.Name, m.Floor)
			return err
		})
		if err != nil {
			return names, fmt.Errorf("board: migrate: apply %s: %w", m.Name, err)
		}
		applied[m.Version] = true
		names = append(names, m.Name)
	}
	return names, nil
}

// CheckSchema returns nil when this binary may run on the database's
// schema (its own version, or a newer one whose floor is at or below it),
// and a *SchemaError (wrapped) saying why not otherwise.
func CheckSchema(ctx context.Context, pool *pgxpool.Pool) error {
	st, err := ReadSchema(ctx, pool)
	if err != nil {
		return fmt.Errorf("board: check schema: %w", err)
	}
	if err := st.Admits(SchemaVersion()); err != nil {
		return fmt.Errorf("board: check schema: %w", err)
	}
	return nil
}

// ReadSchema reads the database's newest migration and the floor recorded
// with it. A database without schema_migrations holds version 0.
func ReadSchema(ctx context.Context, pool *pgxpool.Pool) (Schema, error) {
	return readSchema(ctx, pool)
}

// querier is a pool or one of its connections.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func readSchema(ctx context.Context, q querier) (Schema, error) {
	var st Schema
	err := q.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM schema_migrations").Scan(&st.Version)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return Schema{}, nil
	}
	if err != nil {
		return Schema{}, fmt.Errorf("read schema_migrations: %w", err)
	}
	if st.Version < FloorsSince {
		return st, nil
	}
	// The floor of the newest migration, and the first migration that
	// recorded it: the one that raised it there.
	err = q.QueryRow(ctx, `SELECT n.floor, f.name
FROM schema_migrations n, LATERAL (
    SELECT name FROM schema_migrations WHERE floor = n.floor ORDER BY version LIMIT 1) f
WHERE n.version = $1`, st.Version).Scan(&st.Floor, &st.FloorSetBy)
	if err != nil {
		return Schema{}, fmt.Errorf("read the floor of schema version %d: %w", st.Version, err)
	}
	return st, nil
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

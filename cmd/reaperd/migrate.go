package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
)

// cmdMigrate applies the migrations the database lacks and says where the
// schema stands: its version and the floor recorded with it. On a database
// newer than this binary it applies nothing: it exits 0 when the binary is
// at or above the floor (a rollback across additive migrations), and 1 with
// the one line of board.SchemaError when below.
func cmdMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	_, cfg, _, code := commandSetup("migrate", args, stderr, hclog.Warn)
	if code != 0 {
		return code
	}
	if cfg.StoreDSN == "" {
		fmt.Fprintln(stderr, "reaperd migrate: no database: set store.dsn or REAPER_DSN")
		return 1
	}
	poolCfg, err := board.ParseDSN(cfg.StoreDSN)
	if err != nil {
		fmt.Fprintf(stderr, "reaperd migrate: %v\n", err)
		return 1
	}
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		fmt.Fprintf(stderr, "reaperd migrate: open store: %s\n", board.ConnProblem(err))
		return 1
	}
	defer pool.Close()
	applied, err := board.Migrate(ctx, pool)
	if err != nil {
		fmt.Fprintf(stderr, "reaperd migrate: %s\n", migrateProblem(err))
		return 1
	}
	for _, name := range applied {
		fmt.Fprintf(stdout, "applied %s\n", name)
	}
	st, err := board.ReadSchema(ctx, pool)
	if err != nil {
		fmt.Fprintf(stderr, "reaperd migrate: %s\n", migrateProblem(err))
		return 1
	}
	known := board.SchemaVersion()
	switch {
	case st.Version > known:
		fmt.Fprintf(stdout, "schema is at version %d, newer than this binary's %d; its floor %d (set by %s) admits this binary: nothing to apply\n",
			st.Version, known, st.Floor, st.FloorSetBy)
	case len(applied) == 0:
		fmt.Fprintf(stdout, "schema is up to date (version %d, floor %d)\n", st.Version, st.Floor)
	default:
		fmt.Fprintf(stdout, "schema is at version %d (floor %d)\n", st.Version, st.Floor)
	}
	return 0
}

// migrateProblem is the one line said of a failed migration: a schema
// this binary may not run on says so itself; a connection that failed is
// said without the DSN's contents (pgx's error names the user, the
// database and the host).
func migrateProblem(err error) string {
	var (
		se   *board.SchemaError
		conn *pgconn.ConnectError
	)
	switch {
	case errors.As(err, &se):
		return se.Error()
	case errors.As(err, &conn):
		return "cannot connect: " + board.ConnProblem(err)
	}
	return oneLine(err)
}

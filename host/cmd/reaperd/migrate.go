package main

import (
	"context"
	"fmt"
	"io"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
)

func cmdMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	_, cfg, _, code := commandSetup("migrate", args, stderr, hclog.Warn)
	if code != 0 {
		return code
	}
	if cfg.StoreDSN == "" {
		fmt.Fprintln(stderr, "reaperd migrate: no database: set store.dsn or REAPER_DSN")
		return 1
	}
	pool, err := pgxpool.New(ctx, cfg.StoreDSN)
	if err != nil {
		fmt.Fprintf(stderr, "reaperd migrate: open store: %v\n", err)
		return 1
	}
	defer pool.Close()
	applied, err := board.Migrate(ctx, pool)
	if err != nil {
		fmt.Fprintf(stderr, "reaperd migrate: %v\n", err)
		return 1
	}
	if len(applied) == 0 {
		fmt.Fprintf(stdout, "schema is up to date (version %d)\n", board.SchemaVersion())
		return 0
	}
	for _, name := range applied {
		fmt.Fprintf(stdout, "applied %s\n", name)
	}
	fmt.Fprintf(stdout, "schema is at version %d\n", board.SchemaVersion())
	return 0
}

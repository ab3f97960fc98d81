package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/lite/agent"
)

// boardReporter reports to the board through its writers' package. Every
// call is guarded on the attempt: one that moved on (reaped, re-placed,
// cleared) changes nothing and is answered should_terminate.
type boardReporter struct {
	pool *pgxpool.Pool
	w    *lifecycle.Writer
}

func newBoardReporter(ctx context.Context, dsn string) (*boardReporter, error) {
	if dsn == "" {
		return nil, errors.New("-reporter board needs REAPER_DSN in the environment")
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse REAPER_DSN: %w", err)
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open the board: %w", err)
	}
	return &boardReporter{pool: pool, w: lifecycle.New(pool, lifecycle.Options{})}, nil
}

func (r *boardReporter) Close() { r.pool.Close() }

func (r *boardReporter) Running(ctx context.Context, a sdk.Attempt, now time.Time) (bool, error) {
	return r.w.Running(ctx, a, now)
}

func (r *boardReporter) Heartbeat(ctx context.Context, a sdk.Attempt, now time.Time) (bool, error) {
	return r.w.Heartbeat(ctx, a, now)
}

func (r *boardReporter) Report(ctx context.Context, a sdk.Attempt, o agent.Outcome, now time.Time) (bool, error) {
	return r.w.Report(ctx, a, lifecycle.Outcome{State: o.State, Reason: o.Reason, Message: o.Message}, now)
}

package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
	term, err := r.w.Running(ctx, a, now)
	return term, unanswered(err)
}

func (r *boardReporter) Heartbeat(ctx context.Context, a sdk.Attempt, now time.Time) (bool, error) {
	term, err := r.w.Heartbeat(ctx, a, now)
	return term, unanswered(err)
}

func (r *boardReporter) Report(ctx context.Context, a sdk.Attempt, o agent.Outcome, now time.Time) (bool, error) {
	term, err := r.w.Report(ctx, a, lifecycle.Outcome{State: o.State, Reason: o.Reason, Message: o.Message}, now)
	return term, unanswered(err)
}

// unanswered gives the board's failures that are answers that never came
// the gRPC code the agent counts as such (agent.ControlPlaneUnanswered): a
// board that cannot be reached is Unavailable, a call that ran out of time
// DeadlineExceeded. Anything else (an error the database answered) is left
// as it is.
func unanswered(err error) error {
	var ce *pgconn.ConnectError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ce):
		return fmt.Errorf("%w: %w", status.Error(codes.Unavailable, "the board cannot be reached"), err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %w", status.Error(codes.DeadlineExceeded, "the board did not answer in time"), err)
	}
	return err
}

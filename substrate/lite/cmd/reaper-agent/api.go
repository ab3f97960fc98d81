package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dexaflow/reaper/internal/attemptapi"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/lite/agent"
)

// apiReporter reports through reaperd's attempt API with the attempt's own
// credential: the token, the API's address and the CA it trusts, all from
// the environment the runner gave the agent. Each renewed token a heartbeat
// returns replaces the one held. The times are reaperd's, not the agent's.
type apiReporter struct {
	c *attemptapi.Client
}

func newAPIReporter(getenv func(string) string) (*apiReporter, error) {
	c, err := attemptapi.ClientFromEnv(getenv)
	if err != nil {
		return nil, fmt.Errorf("-reporter api: %w", err)
	}
	return &apiReporter{c: c}, nil
}

func (r *apiReporter) Close() { r.c.Close() }

func (r *apiReporter) Running(ctx context.Context, a sdk.Attempt, _ time.Time) (bool, error) {
	term, err := r.c.Running(ctx, a)
	return term, refused(err)
}

func (r *apiReporter) Heartbeat(ctx context.Context, a sdk.Attempt, _ time.Time) (bool, error) {
	resp, err := r.c.Heartbeat(ctx, a)
	return resp.ShouldTerminate, refused(err)
}

func (r *apiReporter) Report(ctx context.Context, a sdk.Attempt, o agent.Outcome, _ time.Time) (bool, error) {
	term, err := r.c.Report(ctx, a, attemptapi.Outcome{State: o.State, Reason: o.Reason, Message: o.Message})
	return term, refused(err)
}

// refused marks a call the API refused (its retry cannot succeed) so the
// agent stops retrying it; any other error stays retryable.
func refused(err error) error {
	if err != nil && errors.Is(err, attemptapi.ErrRefused) {
		return fmt.Errorf("%w: %w", agent.ErrRefused, err)
	}
	return err
}

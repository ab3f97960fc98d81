package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dexaflow/reaper/internal/attemptapi"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/lite/agent"
)

// apiReporter reports through reaperd's attempt API with the attempt's own
// credential: the token, the API's address and the CA it trusts, all from
// the environment the runner gave the agent. The token is a bootstrap
// token, exchanged for the working token before RUNNING. Each renewed token a heartbeat
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

// Running first exchanges the bootstrap token the runner handed the agent
// for the attempt's working token (once: a retry after the exchange
// applied goes straight to RUNNING), then reports RUNNING with it.
func (r *apiReporter) Running(ctx context.Context, a sdk.Attempt, _ time.Time) (bool, error) {
	if term, err := r.c.Exchange(ctx, a); err != nil || term {
		return term, refused(err)
	}
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

// refused classifies a failed call. A refusal of the API (its retry cannot
// succeed) wraps agent.ErrRefused so the agent stops retrying it. Any other
// failure is an answer that never came and carries the gRPC code
// agent.ControlPlaneUnanswered counts (see unansweredCode).
func refused(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, attemptapi.ErrRefused) {
		return fmt.Errorf("%w: %w", agent.ErrRefused, err)
	}
	if c, ok := unansweredCode(err); ok {
		return &unanswered{code: c, err: err}
	}
	return err
}

// unansweredCode maps a failure that is no refusal to its gRPC code:
// the API unreachable (connection refused or reset, EOF, a TLS failure),
// a 502 or 503 answer or a 429 (the API shedding load) is Unavailable; a
// deadline or client timeout and a 504 are DeadlineExceeded; any other 5xx
// and an unreadable answer are Internal. The agent's own cancellation is
// no failure of the control plane: it gets no code.
func unansweredCode(err error) (codes.Code, bool) {
	var ce *attemptapi.CallError
	switch {
	case errors.As(err, &ce):
		switch {
		case ce.Status == http.StatusServiceUnavailable || ce.Status == http.StatusBadGateway ||
			ce.Status == http.StatusTooManyRequests:
			return codes.Unavailable, true
		case ce.Status == http.StatusGatewayTimeout:
			return codes.DeadlineExceeded, true
		case ce.Status >= 500:
			return codes.Internal, true
		}
		return codes.Unknown, false
	case errors.Is(err, context.Canceled):
		return codes.Unknown, false
	case errors.Is(err, context.DeadlineExceeded), isTimeout(err):
		return codes.DeadlineExceeded, true
	case isDecode(err):
		return codes.Internal, true
	}
	return codes.Unavailable, true
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func isDecode(err error) bool {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	return errors.As(err, &se) || errors.As(err, &te)
}

// unanswered is a failed call of the API with the gRPC code that says its
// answer never came.
type unanswered struct {
	code codes.Code
	err  error
}

func (u *unanswered) Error() string { return u.err.Error() }
func (u *unanswered) Unwrap() error { return u.err }

// GRPCStatus is what agent.ControlPlaneUnanswered reads.
func (u *unanswered) GRPCStatus() *status.Status { return status.New(u.code, u.err.Error()) }

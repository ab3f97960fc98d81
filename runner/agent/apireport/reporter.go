// Package apireport is the agent's reporter over reaperd's attempt API: it
// holds the attempt's credential and classifies each failed call as a
// refusal, an answer that never came, or an answer to retry.
package apireport

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/sdk"
)

// Reporter reports through reaperd's attempt API with the attempt's own
// credential: the token, the API's address and the CA it trusts, all from
// the environment the runner gave the agent. The token is a bootstrap
// token, exchanged for the working token before RUNNING. Each renewed token a heartbeat
// returns replaces the one held. The times are reaperd's, not the agent's.
type Reporter struct {
	c *attemptapi.Client
	// exchangeUnanswered: an exchange of the bootstrap token went
	// unanswered, so it may have applied (see exchangeFailed). Only
	// Running exchanges, and the agent calls it from one goroutine.
	exchangeUnanswered bool
}

// New returns a Reporter whose client and credential come from the
// environment the runner gave the agent (read through getenv).
func New(getenv func(string) string) (*Reporter, error) {
	c, err := attemptapi.ClientFromEnv(getenv)
	if err != nil {
		return nil, fmt.Errorf("-reporter api: %w", err)
	}
	return &Reporter{c: c}, nil
}

// ForClient returns a Reporter calling through c (a claimed attempt's
// client, its credential the claim's). Closing the Reporter closes c.
func ForClient(c *attemptapi.Client) *Reporter { return &Reporter{c: c} }

// Close closes the Reporter's client.
func (r *Reporter) Close() { r.c.Close() }

// Running first exchanges the bootstrap token the runner handed the agent
// for the attempt's working token (once: a retry after the exchange
// applied goes straight to RUNNING), then reports RUNNING with it.
func (r *Reporter) Running(ctx context.Context, a sdk.Attempt, _ time.Time) (bool, error) {
	if term, err := r.c.Exchange(ctx, a); err != nil || term {
		return term, r.exchangeFailed(err)
	}
	term, err := r.c.Running(ctx, a)
	return term, Classify(err)
}

// exchangeFailed classifies a failed exchange of the bootstrap token (nil
// stays nil). An exchange whose answer never came may still have applied:
// the API recorded the one exchange and minted the working token, and the
// answer carrying it was lost (reaperd killed after its commit, the
// connection cut). The retry is then refused bootstrap_spent, rightly, and
// no retry can bring the token back. That refusal, once an exchange of this
// agent went unanswered, is the lost answer rather than a verdict on the
// attempt: it is classified unanswered and lost for good, so the agent
// gives up at once as if the control plane had never answered (on a
// dedicated pod: the infra marker, and a re-place on the infra budget).
// A bootstrap_spent before any unanswered exchange (somebody else spent a
// copy of the token first) stays a refusal, as does any other refusal. The
// API's 503s that say the pod proof is not decided yet (the pod not
// recorded, its token not reviewable) are retried like an unanswered call
// but do not count as one: they answer that nothing applied.
func (r *Reporter) exchangeFailed(err error) error {
	classified := Classify(err)
	switch {
	case errors.Is(classified, agent.ErrUnanswered) && !notApplied(err):
		r.exchangeUnanswered = true
	case r.exchangeUnanswered && refusedWith(err, attemptapi.CodeBootstrapSpent):
		return fmt.Errorf("%w: %w (an earlier exchange went unanswered): %w", agent.ErrUnanswered, agent.ErrAnswerLost, err)
	}
	return classified
}

// notApplied reports whether err is the API's answer that the exchange was
// not made yet and should be retried: the pod is not recorded yet, or its
// token could not be reviewed. It is retried like a call unanswered, but it
// is an answer: the exchange did not apply.
func notApplied(err error) bool {
	var ce *attemptapi.CallError
	return errors.As(err, &ce) && (ce.Body.Code == attemptapi.CodePodNotRecorded || ce.Body.Code == attemptapi.CodePodUnverified)
}

// refusedWith reports whether err is the API's refusal with code.
func refusedWith(err error, code string) bool {
	var ce *attemptapi.CallError
	return errors.As(err, &ce) && errors.Is(ce, attemptapi.ErrRefused) && ce.Body.Code == code
}

// Heartbeat reports that the attempt is alive.
func (r *Reporter) Heartbeat(ctx context.Context, a sdk.Attempt, _ time.Time) (bool, error) {
	resp, err := r.c.Heartbeat(ctx, a)
	return resp.ShouldTerminate, Classify(err)
}

// Report reports the attempt's terminal outcome.
func (r *Reporter) Report(ctx context.Context, a sdk.Attempt, o agent.Outcome, _ time.Time) (bool, error) {
	term, err := r.c.Report(ctx, a, attemptapi.ReportBody{State: o.State, Reason: o.Reason, Message: o.Message})
	return term, Classify(err)
}

// Classify classifies a failed call of the attempt API. A refusal of the API (its retry cannot
// succeed) wraps agent.ErrRefused so the agent stops retrying it. A failure
// whose answer never came (see unanswered) wraps agent.ErrUnanswered. Any
// other failure is returned as it is: an answer, retried within its bound.
func Classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, attemptapi.ErrRefused):
		return fmt.Errorf("%w: %w", agent.ErrRefused, err)
	case unanswered(err):
		return fmt.Errorf("%w: %w", agent.ErrUnanswered, err)
	}
	return err
}

// unanswered reports whether a failure that is no refusal is an answer
// that never came. Of the API's error answers, a 5xx and a 429 (the API
// shedding load) are; any other status (a 3xx, say) is an answer. Every
// failure short of an answer is one (the API unreachable: connection
// refused or reset, EOF, a TLS failure; a deadline or client timeout; an
// answer cut short or unreadable), except the agent's own cancellation: no
// failure of the control plane.
func unanswered(err error) bool {
	var ce *attemptapi.CallError
	switch {
	case errors.As(err, &ce):
		return ce.Status >= 500 || ce.Status == http.StatusTooManyRequests
	case errors.Is(err, context.Canceled):
		return false
	}
	return true
}

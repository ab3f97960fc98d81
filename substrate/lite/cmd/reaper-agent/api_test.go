package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dexaflow/reaper/internal/attemptapi"
	"github.com/dexaflow/reaper/internal/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/lite/agent"
)

func callErr(code int) error {
	return fmt.Errorf("attempt api /v1/running: %w", &attemptapi.CallError{Status: code})
}

func transportErr(err error) error {
	return fmt.Errorf("attempt api /v1/running: %w", &url.Error{Op: "Post", URL: "https://api", Err: err})
}

// A failure of the API that is no refusal is an answer that never came,
// with the gRPC code the agent's pre-start rule counts.
func TestAPIReporterFailuresThatAreNoRefusalAreUnanswered(t *testing.T) {
	for name, c := range map[string]struct {
		err  error
		code codes.Code
	}{
		"connection refused": {transportErr(syscall.ECONNREFUSED), codes.Unavailable},
		"connection reset":   {transportErr(syscall.ECONNRESET), codes.Unavailable},
		"EOF":                {transportErr(io.EOF), codes.Unavailable},
		"503":                {callErr(503), codes.Unavailable},
		"502":                {callErr(502), codes.Unavailable},
		"429":                {callErr(429), codes.Unavailable},
		"deadline":           {transportErr(context.DeadlineExceeded), codes.DeadlineExceeded},
		"504":                {callErr(504), codes.DeadlineExceeded},
		"500":                {callErr(500), codes.Internal},
	} {
		err := refused(c.err)
		if !agent.ControlPlaneUnanswered(err) || errors.Is(err, agent.ErrRefused) {
			t.Errorf("%s: %v is not unanswered (or is a refusal)", name, err)
			continue
		}
		if got := status.Code(err); got != c.code {
			t.Errorf("%s: code %s, want %s", name, got, c.code)
		}
		if !errors.Is(err, c.err) {
			t.Errorf("%s: %v does not wrap the call's error", name, err)
		}
	}
}

// A refusal is an answer: it stops the retries and never becomes the infra
// marker. A 409 (the attempt's guard no longer holds) is one too.
func TestAPIReporterRefusalsStayRefusals(t *testing.T) {
	for _, code := range []int{400, 401, 403, 404, 409} {
		err := refused(callErr(code))
		if !errors.Is(err, agent.ErrRefused) || agent.ControlPlaneUnanswered(err) {
			t.Errorf("%d: %v is not a refusal", code, err)
		}
	}
}

// The agent's own cancellation is no failure of the control plane.
func TestAPIReporterCancelledCallIsNotUnanswered(t *testing.T) {
	err := refused(transportErr(context.Canceled))
	if agent.ControlPlaneUnanswered(err) || errors.Is(err, agent.ErrRefused) {
		t.Fatalf("%v", err)
	}
}

// The real client against an address nothing listens on.
func TestAPIReporterUnreachableAPIIsUnavailable(t *testing.T) {
	c, err := attemptapi.NewClient("https://"+attemptapitest.FreeAddr(t), "rat1.unverified", "")
	if err != nil {
		t.Fatal(err)
	}
	r := &apiReporter{c: c}
	defer r.Close()
	_, err = r.Running(context.Background(), sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}, time.Time{})
	if !agent.ControlPlaneUnanswered(err) || status.Code(err) != codes.Unavailable {
		t.Fatalf("%v: code %s, want Unavailable", err, status.Code(err))
	}
}

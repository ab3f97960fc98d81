package attemptapi_test

import (
	"context"
	"testing"

	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/sdk"
)

// TestAReportsTextIsMadeSafeByTheBoard: an agent's (or a task's, with its
// own token) report whose reason holds a NUL and whose message is not
// UTF-8 is taken, over real TLS, and settles the attempt with its text made
// safe (sdk.SafeText) instead of failing at PostgreSQL.
func TestAReportsTextIsMadeSafeByTheBoard(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, c := b.oneRunning(t)
	term, err := c.Report(context.Background(), a, attemptapi.ReportBody{State: sdk.StateFailed,
		Reason: "exit\x00code", Message: "bad\x00\xffbyte"})
	if err != nil || term {
		t.Fatalf("report: %v %v", term, err)
	}
	ti := b.ti(t, a)
	// The client's JSON encoder already turns the invalid byte into U+FFFD;
	// the NULs travel as \u0000 and are the board's to make safe.
	if ti.State == sdk.StateRunning || ti.FailureReason != "exit\uFFFDcode" || ti.ErrorMessage != "bad\uFFFD\uFFFDbyte" {
		t.Fatalf("row after a poisoned report: %s %q %q", ti.State, ti.FailureReason, ti.ErrorMessage)
	}
}

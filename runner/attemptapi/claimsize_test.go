package attemptapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/sdk"
)

// TestClaimAnswerFitsWhatTheWorkerReads: a claim's answer never passes
// MaxClaimReply, the size the worker reads: attempts whose commands are as
// long as a command may be, each byte escaped six-fold in JSON, are handed
// over as many as fit, the rest at the next claims; and an attempt whose
// command is over the limit (a row written around the board's check) is
// handed over with its command withheld, for the worker to refuse, instead
// of making an answer no worker can read, claim after claim.
func TestClaimAnswerFitsWhatTheWorkerReads(t *testing.T) {
	ctx := context.Background()
	b := setup(t)
	const n = 12
	var bound []sdk.Attempt
	for i := range n {
		bound = append(bound, b.bindWarm(t, fmt.Sprintf("r%02d", i), "warm-a"))
	}
	// Control characters: JSON writes each as \u00XX.
	if _, err := b.pool.Exec(ctx, `UPDATE task_instances SET command = repeat(chr(1), $1)`, lifecycle.CommandMax); err != nil {
		t.Fatal(err)
	}
	over := b.bindWarm(t, "rover", "warm-a")
	if _, err := b.pool.Exec(ctx, `UPDATE task_instances SET command = repeat('x', $1) WHERE run_id = 'rover'`,
		lifecycle.CommandMax+1); err != nil {
		t.Fatal(err)
	}
	wc := b.workerClient(t, "warm-a")
	handed := map[sdk.Attempt]attemptapi.Claimed{}
	for claims := 0; len(handed) < n+1; claims++ {
		if claims > n {
			t.Fatalf("%d claims handed over %d of %d attempts", claims, len(handed), n+1)
		}
		got, err := wc.Claim(ctx, "warm-a", 100, nil)
		if err != nil {
			t.Fatalf("claim %d: %v", claims, err)
		}
		if len(got) == 0 {
			t.Fatalf("claim %d handed nothing with %d attempts bound", claims, n+1-len(handed))
		}
		if raw, _ := json.Marshal(attemptapi.Response{Attempts: got}); len(raw) > attemptapi.MaxClaimReply {
			t.Fatalf("claim %d: an answer of %d bytes, over %d", claims, len(raw), attemptapi.MaxClaimReply)
		}
		for _, c := range got {
			handed[c.Attempt()] = c
			// Started: no longer queued, so the next claim hands the rest.
			if term, err := b.w.Running(ctx, c.Attempt(), b.clk.Now()); err != nil || term {
				t.Fatal(term, err)
			}
		}
		if claims == 0 && len(got) >= n {
			t.Fatalf("the first claim handed all %d long commands at once", len(got))
		}
	}
	for _, a := range bound {
		if c := handed[a]; len(c.Command) != lifecycle.CommandMax || c.CommandWithheld != 0 {
			t.Fatalf("%s handed with a command of %d bytes (withheld %d)", a, len(c.Command), c.CommandWithheld)
		}
	}
	if c := handed[over]; c.Command != "" || c.CommandWithheld != lifecycle.CommandMax+1 {
		t.Fatalf("the overlong command was handed as %d bytes, withheld %d", len(c.Command), c.CommandWithheld)
	}
	if !strings.Contains(b.log.String(), "command is over the limit") {
		t.Errorf("the withheld command was not logged:\n%s", b.log)
	}
}

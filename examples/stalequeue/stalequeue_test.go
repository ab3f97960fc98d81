package stalequeue_test

import (
	"context"
	"testing"
	"time"

	"github.com/dexaflow/reaper/examples/stalequeue"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/sdktest"
)

// The example's test uses the SDK's harness: an in-memory board with the
// real board's guards, a scripted substrate and a fake clock.
func TestReportsOnlyStaleQueuedAttempts(t *testing.T) {
	ctx := context.Background()
	h := sdktest.New("lite")
	r := stalequeue.New(nil)
	if err := h.Configure(ctx, r, sdk.Values{"threshold": "2m"}); err != nil {
		t.Fatal(err)
	}
	stale := h.Queued("run", "stale", 5*time.Minute)
	fresh := h.Queued("run", "fresh", 30*time.Second)
	h.Exec.Alive(stale)

	ds, err := h.Reap(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if got := ds.Label(stale); got != stalequeue.Label {
		t.Fatalf("stale attempt: %q", got)
	}
	if got := ds.Label(fresh); got != "" {
		t.Fatalf("fresh attempt was judged: %q", got)
	}
	if d := ds.For(stale)[0]; d.Evidence["liveness"] != "alive" || d.Applied {
		t.Fatalf("decision %+v", d)
	}
}

package steps

import (
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
)

func TestRecoveryBudget(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)
	r := NewRecovery(lifecycle.RecoveryBudget{Default: lifecycle.RecoveryLimit{Rate: 10, Burst: 5},
		Pools: map[string]lifecycle.RecoveryLimit{"slow": {Rate: 1}, "free": {Rate: 0}}})
	admitted := func(pool string, at time.Time, n int) int {
		got := 0
		for range n {
			if r.Admit(pool, at) {
				got++
			}
		}
		return got
	}
	// A fresh bucket is full: the burst, then nothing more at that instant.
	if got := admitted("default_pool", t0, 20); got != 5 {
		t.Fatalf("admitted %d at once, want the burst of 5", got)
	}
	if !r.Spent("default_pool", t0) {
		t.Fatal("a drained pool is not spent")
	}
	// Refilled at the rate, within the jitter, never past the burst.
	if got := admitted("default_pool", t0.Add(300*time.Millisecond), 20); got < 2 || got > 3 {
		t.Fatalf("admitted %d after 300ms at 10/s (±20%%)", got)
	}
	if got := admitted("default_pool", t0.Add(time.Hour), 100); got != 5 {
		t.Fatalf("admitted %d after an hour, want the burst", got)
	}
	// A pool's own limit; its burst defaults to a second of its rate.
	if got := admitted("slow", t0, 10); got != 1 {
		t.Fatalf("slow admitted %d, want 1", got)
	}
	if got := admitted("free", t0, 1000); got != 1000 || r.Spent("free", t0) {
		t.Fatalf("an unbounded pool admitted %d of 1000", got)
	}
	// A pool no limit names takes the default, its bucket its own.
	if got := admitted("other", t0, 10); got != 5 {
		t.Fatalf("another pool admitted %d, want its own burst", got)
	}
}

func TestIsRecovery(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		try, epoch int32
		want       bool
	}{{1, 0, false}, {2, 0, true}, {1, 1, true}, {3, 2, true}} {
		ti := board.TaskInstance{Attempt: sdk.Attempt{RunID: "r", TaskID: "t", Try: c.try, Epoch: c.epoch}}
		if got := IsRecovery(ti); got != c.want {
			t.Errorf("try %d epoch %d: %v", c.try, c.epoch, got)
		}
	}
}

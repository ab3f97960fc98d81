package cycle

import (
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// TestConfigWithDefaults: the clock, logger and metrics are filled in, and
// an owed teardown's backoff starts at one interval and is capped at
// OwedBackoffCapDefault, or at its base when that is longer; set values
// are kept.
func TestConfigWithDefaults(t *testing.T) {
	l := ladder.Defaults()
	c := Config{Ladder: l}.withDefaults()
	if c.Clock == nil || c.Logger == nil || c.Metrics == nil {
		t.Fatalf("%+v: want a clock, a logger and metrics", c)
	}
	if want := (board.TeardownBackoff{Base: l.MaintenanceInterval, Cap: OwedBackoffCapDefault}); c.TeardownBackoff != want {
		t.Errorf("backoff %+v, want %+v", c.TeardownBackoff, want)
	}
	l.MaintenanceInterval = 10 * time.Minute
	if got := (Config{Ladder: l}).withDefaults().TeardownBackoff; got.Cap != 10*time.Minute {
		t.Errorf("CapNeverBelowTheBase: %+v", got)
	}
	set := board.TeardownBackoff{Base: time.Second, Cap: time.Minute}
	if got := (Config{Ladder: l, TeardownBackoff: set}).withDefaults().TeardownBackoff; got != set {
		t.Errorf("SetValuesKept: %+v, want %+v", got, set)
	}
}

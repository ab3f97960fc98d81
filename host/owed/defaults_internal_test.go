package owed

import (
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// TestConfigWithDefaults: the clock, logger and metrics are filled in, and
// an owed teardown's backoff starts at one interval and is capped at
// BackoffCapDefault, or at its base when that is longer; set values are
// kept.
func TestConfigWithDefaults(t *testing.T) {
	l := ladder.Defaults()
	c := Config{Interval: l.MaintenanceInterval}.withDefaults()
	if c.Clock == nil || c.Logger == nil || c.Metrics == nil {
		t.Fatalf("%+v: want a clock, a logger and metrics", c)
	}
	if want := (board.TeardownBackoff{Base: l.MaintenanceInterval, Cap: BackoffCapDefault}); c.Backoff != want {
		t.Errorf("backoff %+v, want %+v", c.Backoff, want)
	}
	if got := (Config{}).withDefaults(); got.Interval != l.MaintenanceInterval || got.Backoff.Base != l.MaintenanceInterval {
		t.Errorf("IntervalTheLadders: %+v", got)
	}
	if got := (Config{Interval: 10 * time.Minute}).withDefaults().Backoff; got.Cap != 10*time.Minute {
		t.Errorf("CapNeverBelowTheBase: %+v", got)
	}
	set := board.TeardownBackoff{Base: time.Second, Cap: time.Minute}
	if got := (Config{Interval: l.MaintenanceInterval, Backoff: set}).withDefaults().Backoff; got != set {
		t.Errorf("SetValuesKept: %+v, want %+v", got, set)
	}
}

package cycle

import (
	"testing"

	"github.com/dexaflow/reaper/sdk/ladder"
)

// TestConfigWithDefaults: the clock, logger and metrics are filled in.
// (The owed teardowns' backoff is host/owed's.)
func TestConfigWithDefaults(t *testing.T) {
	l := ladder.Defaults()
	c := Config{Ladder: l}.withDefaults()
	if c.Clock == nil || c.Logger == nil || c.Metrics == nil {
		t.Fatalf("%+v: want a clock, a logger and metrics", c)
	}
}

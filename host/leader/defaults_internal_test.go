package leader

import (
	"strings"
	"testing"
	"time"
)

// TestConfigWithDefaults: the margin and the renewal period default to
// their shares of the lease, set values are kept, and a configuration that
// cannot elect is refused naming what is wrong.
func TestConfigWithDefaults(t *testing.T) {
	t.Run("SharesOfTheLease", func(t *testing.T) {
		c, err := Config{Holder: "h/1", Lease: 15 * time.Second}.withDefaults()
		if err != nil || c.Margin != 3*time.Second || c.RenewEvery != 5*time.Second || c.Clock == nil || c.Logger == nil {
			t.Fatalf("%+v, %v: want a 3s margin, a 5s renewal, a clock and a logger", c, err)
		}
	})
	t.Run("SetValuesKept", func(t *testing.T) {
		c, err := Config{Holder: "h/1", Lease: 15 * time.Second, Margin: time.Second, RenewEvery: 2 * time.Second}.withDefaults()
		if err != nil || c.Margin != time.Second || c.RenewEvery != 2*time.Second {
			t.Fatalf("%+v, %v", c, err)
		}
	})
	for _, tc := range []struct {
		name string
		c    Config
		want string
	}{
		{"NoHolder", Config{Lease: time.Second}, "holder is required"},
		{"NoLease", Config{Holder: "h/1"}, "lease must be positive"},
		{"MarginNotShorterThanTheLease", Config{Holder: "h/1", Lease: time.Second, Margin: time.Second}, "must be shorter than the lease"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tc.c.withDefaults(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

//go:build reaper_upgrade_probe

package board_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// TestUpgradeProbe (built with the tag reaper_upgrade_probe): the probe's
// migration is the newest, one past the product's, additive, and applied
// once.
func TestUpgradeProbe(t *testing.T) {
	t.Parallel()
	ms, err := board.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	probe, prev := ms[len(ms)-1], ms[len(ms)-2]
	if want := fmt.Sprintf("%03d_upgrade_probe.sql", prev.Version+1); probe.Name != want || probe.Version != prev.Version+1 {
		t.Fatalf("newest migration %s (version %d), want %s", probe.Name, probe.Version, want)
	}
	if !probe.Additive || probe.Floor != prev.Floor {
		t.Fatalf("the probe's floor %d (additive %v), want %d: it must keep the floor", probe.Floor, probe.Additive, prev.Floor)
	}
	ctx := context.Background()
	pool := pgtest.NewEmptyDB(t)
	applied, err := board.Migrate(ctx, pool)
	if err != nil || applied[len(applied)-1] != probe.Name {
		t.Fatalf("migrate: %v (%v)", applied, err)
	}
	if st, err := board.ReadSchema(ctx, pool); err != nil || st.Version != probe.Version || st.Floor != prev.Floor {
		t.Fatalf("schema %+v (%v)", st, err)
	}
}

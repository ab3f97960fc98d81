//go:build !reaper_upgrade_probe

package board_test

import (
	"strings"
	"testing"

	"github.com/dexaflow/reaper/board"
)

// TestNoUpgradeProbe: a build without the tag reaper_upgrade_probe (the
// product's) holds no probe migration.
func TestNoUpgradeProbe(t *testing.T) {
	t.Parallel()
	ms, err := board.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if strings.Contains(m.Name, "upgrade_probe") {
			t.Fatalf("%s is in a build without the tag", m.Name)
		}
	}
}

package e2e_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/dexaflow/reaper/testkit/pgtest"
	"github.com/dexaflow/reaper/testkit/testbin"
)

// binDir holds every binary the scenarios run, built once by TestMain and
// removed after the last test.
var binDir string

// packages are built into binDir, each under its package's name.
var packages = []string{
	"github.com/dexaflow/reaper/cmd/reaperd",
	"github.com/dexaflow/reaper/cmd/reaper-agent",
	"github.com/dexaflow/reaper/substrate/lite/cmd/reaper-substrate-lite",
	"github.com/dexaflow/reaper/plugins/dispatchlost/cmd/reaper-dispatchlost",
	"github.com/dexaflow/reaper/plugins/agentlost/cmd/reaper-agentlost",
	"github.com/dexaflow/reaper/plugins/orphanrun/cmd/reaper-orphanrun",
}

// testReaper is the host's test reaper plugin. It takes its name from its
// file name, so it is linked under the names of the faulty reapers the
// scenarios configure: one that crashes in every pass, one that hangs.
const testReaper = "../../host/loader/testdata/testreaper"

var testReaperNames = []string{"reaper-crashy", "reaper-hang"}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// The test reaper is built beside the real binaries (named testreaper,
	// after its package), then linked under the names the suite runs.
	pkgs := append(append([]string(nil), packages...), testReaper)
	return testbin.Main(m, "e2e", pkgs, func(m *testing.M, bin string) int {
		if err := linkTestReaper(bin); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			return 2
		}
		binDir = bin
		return pgtest.Run(m)
	})
}

func linkTestReaper(dir string) error {
	tr := filepath.Join(dir, "testreaper")
	for _, name := range testReaperNames {
		if err := os.Link(tr, filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("link the test reaper as %s: %w", name, err)
		}
	}
	return nil
}

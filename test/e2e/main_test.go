package e2e_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/dexaflow/reaper/internal/pgtest"
)

// binDir holds every binary the scenarios run, built once by TestMain and
// removed after the last test.
var binDir string

// packages are built into binDir, each under its package's name.
var packages = []string{
	"github.com/dexaflow/reaper/host/cmd/reaperd",
	"github.com/dexaflow/reaper/substrate/lite/cmd/reaper-agent",
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
	dir, err := os.MkdirTemp("", "reaper-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: make the binary directory:", err)
		return 2
	}
	defer os.RemoveAll(dir)
	if err := build(dir); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 2
	}
	binDir = dir
	return pgtest.Run(m)
}

func build(dir string) error {
	// One go build for the real binaries: the toolchain builds them in
	// parallel and names each after its package.
	cmd := exec.Command("go", append([]string{"build", "-o", dir + string(os.PathSeparator)}, packages...)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build the binaries: %w", err)
	}
	tr := filepath.Join(dir, "testreaper")
	cmd = exec.Command("go", "build", "-o", tr, testReaper)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build the test reaper: %w", err)
	}
	for _, name := range testReaperNames {
		if err := os.Link(tr, filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("link the test reaper as %s: %w", name, err)
		}
	}
	return nil
}

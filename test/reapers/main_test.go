package reapers_test

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/dexaflow/reaper/internal/pgtest"
)

// binDir holds the binaries TestMain builds: the Lite agent, the Lite
// substrate plugin and the three reaper plugins.
var binDir string

// binaries are the packages built into binDir, each under its own name.
var binaries = []string{
	"github.com/dexaflow/reaper/substrate/lite/cmd/reaper-agent",
	"github.com/dexaflow/reaper/substrate/lite/cmd/reaper-substrate-lite",
	"github.com/dexaflow/reaper/plugins/agentlost/cmd/reaper-agentlost",
	"github.com/dexaflow/reaper/plugins/dispatchlost/cmd/reaper-dispatchlost",
	"github.com/dexaflow/reaper/plugins/orphanrun/cmd/reaper-orphanrun",
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "reapers-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "reapers test: make the binary directory:", err)
		return 2
	}
	defer os.RemoveAll(dir)
	// One go build for all of them: the toolchain builds them in parallel
	// and writes each into the directory under its package's name.
	build := exec.Command("go", append([]string{"build", "-o", dir + string(os.PathSeparator)}, binaries...)...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "reapers test: build the binaries:", err)
		return 2
	}
	binDir = dir
	return pgtest.Run(m)
}

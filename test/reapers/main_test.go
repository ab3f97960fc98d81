package reapers_test

import (
	"os"
	"testing"

	"github.com/dexaflow/reaper/testkit/pgtest"
	"github.com/dexaflow/reaper/testkit/testbin"
)

// binDir holds the binaries TestMain builds: the Lite agent, the Lite
// substrate plugin and the three reaper plugins.
var binDir string

// binaries are the packages built into binDir, each under its own name.
var binaries = []string{
	"github.com/dexaflow/reaper/cmd/reaper-agent",
	"github.com/dexaflow/reaper/substrate/lite/cmd/reaper-substrate-lite",
	"github.com/dexaflow/reaper/plugins/agentlost/cmd/reaper-agentlost",
	"github.com/dexaflow/reaper/plugins/dispatchlost/cmd/reaper-dispatchlost",
	"github.com/dexaflow/reaper/plugins/orphanrun/cmd/reaper-orphanrun",
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	return testbin.Main(m, "reapers", binaries, func(m *testing.M, bin string) int {
		binDir = bin
		return pgtest.Run(m)
	})
}

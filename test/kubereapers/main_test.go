package kubereapers_test

import (
	"os"
	"testing"

	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/pgtest"
	"github.com/dexaflow/reaper/testkit/testbin"
)

// binDir holds the plugin binaries TestMain builds: the kube substrate and
// the five reapers, for the tests that run reaperd's own daemon.
var binDir string

// binaries are the packages built into binDir, each under its own name.
var binaries = []string{
	"github.com/dexaflow/reaper/substrate/kube/cmd/reaper-substrate-kube",
	"github.com/dexaflow/reaper/plugins/dispatchlost/cmd/reaper-dispatchlost",
	"github.com/dexaflow/reaper/plugins/podlost/cmd/reaper-podlost",
	"github.com/dexaflow/reaper/plugins/agentlost/cmd/reaper-agentlost",
	"github.com/dexaflow/reaper/plugins/warmworker/cmd/reaper-warmworker",
	"github.com/dexaflow/reaper/plugins/orphanrun/cmd/reaper-orphanrun",
}

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	return testbin.Main(m, "kubereapers", binaries, func(m *testing.M, bin string) int {
		binDir = bin
		return kubetest.RunWithin(m, kubetest.Options{}, pgtest.Run)
	})
}

package kubee2e_test

import (
	"os"
	"testing"

	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/pgtest"
	"github.com/dexaflow/reaper/testkit/testbin"
)

// binDir holds the binaries the scenarios run, built once by TestMain.
var binDir string

// packages are built into binDir, each under its package's name: reaperd,
// the agent the task pods run, the kube substrate and the five reapers.
var packages = []string{
	"github.com/dexaflow/reaper/cmd/reaperd",
	"github.com/dexaflow/reaper/cmd/reaper-agent",
	"github.com/dexaflow/reaper/substrate/kube/cmd/reaper-substrate-kube",
	"github.com/dexaflow/reaper/plugins/dispatchlost/cmd/reaper-dispatchlost",
	"github.com/dexaflow/reaper/plugins/podlost/cmd/reaper-podlost",
	"github.com/dexaflow/reaper/plugins/agentlost/cmd/reaper-agentlost",
	"github.com/dexaflow/reaper/plugins/warmworker/cmd/reaper-warmworker",
	"github.com/dexaflow/reaper/plugins/orphanrun/cmd/reaper-orphanrun",
}

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	return testbin.Main(m, "kubee2e", packages, func(m *testing.M, bin string) int {
		binDir = bin
		// One cluster (with the controller manager: Pod GC) and one
		// PostgreSQL for every scenario; each scenario has a namespace,
		// nodes and a database of its own.
		// A real node beside the KWOK nodes where the machine can host
		// one (the real node's tier; it skips, saying why, elsewhere).
		return kubetest.RunWithin(m, kubetest.Options{RealNode: true}, pgtest.Run)
	})
}

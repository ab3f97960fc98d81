package kubee2e_test

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/dexaflow/reaper/internal/kubetest"
	"github.com/dexaflow/reaper/internal/pgtest"
)

// binDir holds the binaries the scenarios run, built once by TestMain.
var binDir string

// packages are built into binDir, each under its package's name: reaperd,
// the agent the task pods run, the kube substrate and the five reapers.
var packages = []string{
	"github.com/dexaflow/reaper/host/cmd/reaperd",
	"github.com/dexaflow/reaper/substrate/lite/cmd/reaper-agent",
	"github.com/dexaflow/reaper/substrate/kube/cmd/reaper-substrate-kube",
	"github.com/dexaflow/reaper/plugins/dispatchlost/cmd/reaper-dispatchlost",
	"github.com/dexaflow/reaper/plugins/podlost/cmd/reaper-podlost",
	"github.com/dexaflow/reaper/plugins/agentlost/cmd/reaper-agentlost",
	"github.com/dexaflow/reaper/plugins/warmworker/cmd/reaper-warmworker",
	"github.com/dexaflow/reaper/plugins/orphanrun/cmd/reaper-orphanrun",
}

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "reaper-kubee2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubee2e: make the binary directory:", err)
		return 2
	}
	defer os.RemoveAll(dir)
	build := exec.Command("go", append([]string{"build", "-o", dir + string(os.PathSeparator)}, packages...)...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "kubee2e: build the binaries:", err)
		return 2
	}
	binDir = dir
	// One cluster (with the controller manager: Pod GC) and one PostgreSQL
	// for every scenario; each scenario has a namespace, nodes and a
	// database of its own.
	return kubetest.RunWithin(m, kubetest.Options{}, pgtest.Run)
}

package kubereapers_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"

	"github.com/dexaflow/reaper/internal/kubetest"
	"github.com/dexaflow/reaper/internal/pgtest"
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

// cluster is the test binary's Kubernetes control plane, set by TestMain
// for the duration of the tests.
var cluster atomic.Pointer[kubetest.Cluster]

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "kubereapers-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubereapers: make the binary directory:", err)
		return 2
	}
	defer os.RemoveAll(dir)
	build := exec.Command("go", append([]string{"build", "-o", dir + string(os.PathSeparator)}, binaries...)...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "kubereapers: build the plugins:", err)
		return 2
	}
	binDir = dir
	c, err := kubetest.Start(context.Background(), kubetest.Options{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubereapers: the test cluster did not start, so these tests cannot run:\n%v\n", err)
		return 1
	}
	defer func() {
		cluster.Store(nil)
		if err := c.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	cluster.Store(c)
	return pgtest.Run(m)
}

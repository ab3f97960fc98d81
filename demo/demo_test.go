package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dexaflow/reaper/internal/testkit/testbin"
)

// binaries are what the kube demo runs, built by TestMain into one
// directory, each under its own name.
var binaries = []string{
	"github.com/dexaflow/reaper/host/cmd/reaperd",
	"github.com/dexaflow/reaper/substrate/kube/cmd/reaper-substrate-kube",
	"github.com/dexaflow/reaper/plugins/dispatchlost/cmd/reaper-dispatchlost",
	"github.com/dexaflow/reaper/plugins/podlost/cmd/reaper-podlost",
	"github.com/dexaflow/reaper/plugins/agentlost/cmd/reaper-agentlost",
	"github.com/dexaflow/reaper/plugins/warmworker/cmd/reaper-warmworker",
	"github.com/dexaflow/reaper/plugins/orphanrun/cmd/reaper-orphanrun",
	"github.com/dexaflow/reaper/substrate/lite/cmd/reaper-agent",
}

// binDir is TestMain's directory of binaries; read-only once the tests run.
var binDir string

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	return testbin.Main(m, "demo", binaries, func(m *testing.M, bin string) int {
		binDir = bin
		return m.Run()
	})
}

// The kube demo end to end on a shorter scenario: the local control plane,
// PostgreSQL, two reaperd replicas on the Lease, the kube runner and the
// kubelet player, every kind of fault the demo injects (a pod deleted, a
// node lost, an eviction, an agent killed, the leader killed, a run whose
// every pod vanished). runKube's exit code is its summary's verdict: every
// fault injected and answered (by a reaper, the sweep or the agent's own
// report), every task succeeded, and no live attempt touched, judged from
// the board, the audit, the pods' outcome records and the agents'
// journals. Then nothing of the demo is left running or on disk.
func TestKubeDemo_EveryFaultSettledAndNoLiveAttemptTouched(t *testing.T) {
	sc := kubeDemo(binDir)
	sc.name = "reaper-demo-kube-test"
	long, short := "sleep 8", "sleep 2"
	sc.runs = map[string][]string{
		"demo":   {long, long, long, long, long, long, short},
		"demo-b": {long, long},
	}
	sc.leaderAfter = 5 * time.Second
	sc.deadline = 3 * time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	if code := runKube(ctx, sc); code != 0 {
		t.Fatalf("the kube demo ended with code %d (its summary above says why)", code)
	}

	dir := filepath.Join(os.TempDir(), fmt.Sprintf("%s-%d", sc.name, os.Getuid()))
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the demo left %s behind (stat: %v)", dir, err)
	}
	if left := processesMentioning(dir); len(left) > 0 {
		t.Errorf("the demo left processes running: %v", left)
	}
}

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/testbin"
)

// binaries are what the kube demo runs, built by TestMain into one
// directory, each under its own name.
var binaries = []string{
	"github.com/dexaflow/reaper/cmd/reaperd",
	"github.com/dexaflow/reaper/substrate/kube/cmd/reaper-substrate-kube",
	"github.com/dexaflow/reaper/plugins/dispatchlost/cmd/reaper-dispatchlost",
	"github.com/dexaflow/reaper/plugins/podlost/cmd/reaper-podlost",
	"github.com/dexaflow/reaper/plugins/agentlost/cmd/reaper-agentlost",
	"github.com/dexaflow/reaper/plugins/warmworker/cmd/reaper-warmworker",
	"github.com/dexaflow/reaper/plugins/orphanrun/cmd/reaper-orphanrun",
	"github.com/dexaflow/reaper/cmd/reaper-agent",
}

// binDir is TestMain's directory of binaries; read-only once the tests run.
var binDir string

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	return testbin.Main(m, "demo", binaries, func(m *testing.M, bin string) int {
		binDir = bin
		// The real node's task image holds the agent built static (the
		// image has no libc), as make demo-kube builds it.
		build := exec.Command("go", "build", "-o", filepath.Join(bin, staticAgent), "github.com/dexaflow/reaper/cmd/reaper-agent")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "demo: build the static agent: %v\n%s", err, out)
			return 2
		}
		return m.Run()
	})
}

// shortScenario is the tests' kube scenario: every kind of fault the demo
// injects, on shorter tasks.
func shortScenario(name string) kubeScenario {
	sc := kubeDemo(binDir)
	sc.name = name
	long, short := "sleep 8", "sleep 2"
	sc.runs = map[string][]string{
		"demo":   {long, long, long, long, long, long, short},
		"demo-b": {long, long},
	}
	sc.leaderAfter = 5 * time.Second
	sc.deadline = 3 * time.Minute
	return sc
}

// leftBehind reports what a demo left of its session: its directory and
// processes naming it.
func leftBehind(t *testing.T, name string) {
	t.Helper()
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("%s-%d", name, os.Getuid()))
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the demo left %s behind (stat: %v)", dir, err)
	}
	if left := processesMentioning(dir); len(left) > 0 {
		t.Errorf("the demo left processes running: %v", left)
	}
}

// The kube demo end to end on a shorter scenario: the local control plane,
// PostgreSQL, two reaperd replicas on the Lease, the kube runner and the
// kubelet player, every kind of fault the demo injects (a pod deleted, a
// node lost, an eviction, an agent killed, the leader killed, a run whose
// every pod vanished). runKube's exit code is its summary's verdict: every
// fault injected and answered (by a reaper, the sweep or the agent's own
// report), every task succeeded, and no live attempt touched, judged from
// the board, the audit, the pods' outcome records and the agents'
// journals. Then nothing of the demo is left running or on disk. It asks
// for the real node where the machine can host one and is told it cannot:
// the demo falls back to the player, saying why.
func TestKubeDemo_EveryFaultSettledAndNoLiveAttemptTouched(t *testing.T) {
	sc := shortScenario("reaper-demo-kube-test")
	sc.unavailable = "the test asks for the player"
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	code, where, err := runKubeOn(ctx, sc)
	if err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		t.Fatalf("the kube demo ended with code %d (its summary above says why)", code)
	}
	if where.real || where.why != sc.unavailable {
		t.Errorf("the demo ran on %+v, want the player because %q", where, sc.unavailable)
	}
	leftBehind(t, sc.name)
}

// Told to run on the real node (-node real) where the machine cannot host
// one, the demo fails saying why, before any run, and leaves nothing.
func TestKubeDemo_RealNodeAskedForWhereThereCanBeNoneFailsSayingWhy(t *testing.T) {
	sc := shortScenario("reaper-demo-kube-test-none")
	sc.node, sc.unavailable = nodeReal, "the test's machine hosts no node"
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	_, _, err := runKubeOn(ctx, sc)
	var none *noRealNode
	if !errors.As(err, &none) || none.why != sc.unavailable {
		t.Fatalf("runKubeOn: %v, want no real node because %q", err, sc.unavailable)
	}
	leftBehind(t, sc.name)
}

// The kube demo on the real node: the pods run in real containers under a
// real kubelet, containerd and runc, and every fault is done for real (the
// pod deleted, the eviction, the agent killed inside its container, the
// leader killed, a run's pods frozen and purged, the node lost by freezing
// its kubelet). The verdict is the summary's, the executions counted by
// the ledger (each run once, none twice at once); then the node left
// nothing on the machine. Where the machine cannot host a node the test
// is skipped saying why (a failure with REAPER_REQUIRE_REAL_NODE=1). It
// waits for the machine's one real node while another test holds it.
func TestKubeDemo_OnTheRealNodeEveryFaultSettledAndNothingLeftBehind(t *testing.T) {
	sc := shortScenario("reaper-demo-kube-test-real")
	sc.node = nodeReal
	ctx, cancel := context.WithTimeout(context.Background(), kubetest.NodeWait+10*time.Minute)
	defer cancel()

	code, where, err := runKubeOn(ctx, sc)
	var none *noRealNode
	if errors.As(err, &none) {
		if os.Getenv(kubetest.EnvRequireRealNode) == "1" {
			t.Fatalf("the real node is required (%s=1) but there is none: %s", kubetest.EnvRequireRealNode, none.why)
		}
		t.Skipf("no real node: %s", none.why)
	}
	if err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		t.Fatalf("the kube demo on the real node ended with code %d (its summary above says why)", code)
	}
	if !where.real {
		t.Errorf("the demo ran on the player (%s), want the real node", where.why)
	}
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("%s-%d", sc.name, os.Getuid()), "cluster")
	if left, checked := leftovers(dir); !checked {
		t.Logf("the machine's real node is another cluster's since: the leftovers are not told apart")
	} else if len(left) > 0 {
		t.Errorf("the real node left behind: %v", left)
	}
	leftBehind(t, sc.name)
}

// make demo-helm where the machine cannot host the real node its chart's
// pods need fails before anything else, saying why in one line, and
// leaves nothing behind.
func TestHelmDemo_WhereNoRealNodeCanBeHostedFailsSayingWhyInOneLine(t *testing.T) {
	sc := helmDemo(binDir, "test")
	sc.name, sc.unavailable = "reaper-demo-helm-test-none", "the test's machine hosts no node"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	code, err := runHelmOn(ctx, sc)
	var none *noRealNode
	if code == 0 || !errors.As(err, &none) || none.why != sc.unavailable {
		t.Fatalf("runHelmOn: %d, %v; want a failure because %q", code, err, sc.unavailable)
	}
	if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, "real node") {
		t.Errorf("the failure says %q, want one line naming the real node", msg)
	}
	leftBehind(t, sc.name)
}

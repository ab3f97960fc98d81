package kubereapers_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/host/config"
	"github.com/dexaflow/reaper/host/cycle"
	"github.com/dexaflow/reaper/host/daemon"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/sdktest"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// kubeConfig is the kube edition as an operator writes it: the kube
// substrate on the test's namespace, the five reapers, the specification's
// ladder, and a postgres lease that outlasts the test.
const kubeConfig = `edition    = "kube"
plugin_dir = %q

store {
  dsn = %q
}

leader "postgres" {
  lease = "24h"
}

substrate "kube" {
  namespace  = %q
  kubeconfig = %q
}

reaper "dispatchlost" {}
reaper "podlost" {}
reaper "agentlost" {}
reaper "warmworker" {}
reaper "orphanrun" {}
`

// startDaemon boots reaperd's own daemon from a kube configuration, with
// the real plugin binaries, on the env's fake clock, and makes it leader.
func (e *env) startDaemon() *daemon.Daemon {
	e.t.Helper()
	ctx := context.Background()
	src := fmt.Sprintf(kubeConfig, binDir, pgtest.DSN(e.store.Pool()), e.ns, e.c.Kubeconfig())
	cfg, err := config.Parse(filepath.Join(e.t.TempDir(), "reaper.hcl"), []byte(src),
		config.Options{Getenv: func(string) string { return "" }})
	if err != nil {
		e.t.Fatalf("parse the kube configuration: %v", err)
	}
	logs := &sdktest.LogBuffer{}
	e.t.Cleanup(func() {
		if e.t.Failed() {
			e.t.Logf("host and plugin log:\n%s", logs.String())
		}
	})
	d, err := daemon.New(ctx, cfg, daemon.Options{Clock: e.clk,
		Logger: hclog.New(&hclog.LoggerOptions{Name: "host", Output: logs, Level: hclog.Debug})})
	if err != nil {
		e.t.Fatalf("start the host: %v", err)
	}
	e.t.Cleanup(d.Close)
	st := d.Campaign(ctx)
	if !st.Leading {
		e.t.Fatalf("the host did not gain leadership: %+v", st)
	}
	e.term = st.Term
	return d
}

// beat heartbeats the attempts at the fake clock's time.
func (e *env) beat(as ...sdk.Attempt) {
	e.t.Helper()
	for _, a := range as {
		if stop, err := e.w.Heartbeat(context.Background(), a, e.clk.Now()); err != nil || stop {
			e.t.Fatalf("heartbeat of %s: %v, %v", a, stop, err)
		}
	}
}

func decided(res cycle.Result, a sdk.Attempt, label string) bool {
	_, ok := applied(res.Decisions, a, label)
	return ok
}

// The kube edition end to end through reaperd's daemon: a deleted pod, a
// deleted warm worker and a lost dispatch are each settled by their reaper
// in the first cycle past the settling gate, a healthy attempt is left
// alone, and the next sweep confirms the provisional marks.
func TestDaemon_KubeEditionSettlesLostPodsWorkersAndDispatches(t *testing.T) {
	t.Parallel()
	e := newWorld(t)
	d := e.startDaemon()

	lostPod, healthy := att("run-1", "lost_pod"), att("run-1", "healthy")
	onWarm, lostDispatch := att("run-1", "on_warm"), att("run-1", "lost_dispatch")
	e.running(lostPod)
	e.running(healthy)
	e.queued(lostDispatch)
	e.warmPod("warm-0")
	gone := e.warmPod("warm-1")
	e.runningWarm(onWarm, gone.Name)
	p := e.pod(lostPod, true)
	e.pod(healthy, true)
	e.remove(p, nil)
	e.remove(gone, nil)

	// The settling gate holds for the grace; the first cycle past it, after
	// its sweep, reaps.
	e.clk.Advance(time.Minute)
	if res := d.RunCycle(context.Background()); len(res.Reaped) != 0 {
		t.Fatalf("reaped inside the settling grace: %+v", res)
	}
	e.clk.Advance(e.ladder.SettlingGrace)
	e.beat(lostPod, healthy, onWarm)
	res := d.RunCycle(context.Background())
	if !res.Swept || len(res.Reaped) != 5 {
		t.Fatalf("cycle %+v", res)
	}
	for a, label := range map[sdk.Attempt]string{lostPod: sdk.LabelPodLost, onWarm: sdk.LabelWarmWorkerLost,
		lostDispatch: sdk.LabelDispatchLost} {
		if !decided(res, a, label) {
			t.Fatalf("%s: no applied %s in %+v", a, label, res.Decisions)
		}
	}
	if got := labels(res.Decisions, healthy); got != "" {
		t.Fatalf("the healthy attempt was judged: %s", got)
	}
	e.wantProvisional(lostPod, sdk.LabelPodLost)
	e.wantProvisional(lostDispatch, sdk.LabelDispatchLost)
	e.wantProvisional(onWarm, sdk.LabelWarmWorkerLost) // no reaper confirms its own mark
	e.wantState(healthy, sdk.StateRunning)

	// The next sweep finds no pod of either attempt, nor the warm worker in
	// its live list of the pool, and confirms them.
	e.clk.Advance(e.ladder.MaintenanceInterval)
	e.beat(healthy)
	res = d.RunCycle(context.Background())
	for _, a := range []sdk.Attempt{lostPod, lostDispatch, onWarm} {
		if !decided(res, a, sdk.LabelReconcileInfraConfirmed) || e.row(a).InfraConfirmedAt.IsZero() {
			t.Fatalf("%s not confirmed: %+v", a, res.Decisions)
		}
	}
	e.wantState(healthy, sdk.StateRunning)
}

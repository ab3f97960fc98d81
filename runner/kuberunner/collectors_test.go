package kuberunner_test

import (
	"context"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/host/metrics"
	"github.com/dexaflow/reaper/runner/kuberunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/eventually"
)

// tick meters one cycle's result the way reaperd does for the runner
// (host/daemon: the runner meters every cycle through Metrics.RunnerCycle,
// which calls RunnerTick).
func tick(m *metrics.Metrics, res kuberunner.Result) {
	m.RunnerTick(res.Took, len(res.RunsStarted), res.RunsWaiting, res.DispatchLatencies, res.FinalizeLatencies)
}

// gathered reads the runner's collectors from the registry: each
// histogram's sample count, each counter's and gauge's value.
func gathered(t *testing.T, m *metrics.Metrics) map[string]float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		for _, s := range f.GetMetric() {
			switch {
			case s.GetHistogram() != nil:
				out[f.GetName()] += float64(s.GetHistogram().GetSampleCount())
			case s.GetCounter() != nil:
				out[f.GetName()] += s.GetCounter().GetValue()
			case s.GetGauge() != nil:
				out[f.GetName()] += s.GetGauge().GetValue()
			}
		}
	}
	return out
}

// TestTheKubeRunnerWritesTheDispatchCollectors: the kube runner measures
// what the Lite runner measures, so the collectors are not left empty on
// kube (the specification's #1186): after a task pod's dispatch and a warm
// worker's bind have each reported running, the dispatch latency histogram
// holds one observation for each; every cycle is a loop duration
// observation; the run started under the start cap is counted; both runs'
// finalizations are observed. The pods run the real agent (the kubelet
// player) and report through the attempt API. The same holds with the
// task pod created by a dispatch worker (a dispatch buffer) as on the tick.
func TestTheKubeRunnerWritesTheDispatchCollectors(t *testing.T) {
	for _, m := range dispatchModes {
		t.Run(m.name, func(t *testing.T) { dispatchCollectors(t, m) })
	}
}

func dispatchCollectors(t *testing.T, mode dispatchMode) {
	e := newWarmEnv(t)
	ctx := context.Background()
	r := e.runner(t, mode.on(e.warmConfig(1)))
	e.refill(t, r)
	e.workersRunning(t, 1)
	if err := e.w.CreateRun(ctx, lifecycle.NewRun{RunID: "run-kube", DagID: "dag", State: sdk.RunQueued,
		Tasks: []lifecycle.NewTask{{TaskID: "k", Executor: sdk.ExecutorKube, Command: "echo kube hello"}}}, e.clk.Now()); err != nil {
		t.Fatal(err)
	}
	e.mkWarmRun(t, "run-warm", lifecycle.NewTask{TaskID: "w", Command: "echo warm hello"})

	m := metrics.New()
	if got := gathered(t, m); got["dexaflow_scheduler_dispatch_latency_seconds"] != 0 || got["dexaflow_scheduler_loop_duration_seconds"] != 0 {
		t.Fatalf("collectors before any cycle: %v", got)
	}
	var (
		cycles, dispatched, bound, handed int
		latencies                         []time.Duration
	)
	finished := func(run string) bool {
		rn, err := e.w.Run(ctx, run)
		if err != nil {
			t.Fatal(err)
		}
		return rn.State != sdk.RunRunning && rn.State != sdk.RunQueued
	}
	eventually.True(t, clusterWait, "both runs to finish", func() bool {
		e.clk.Advance(time.Second)
		res := cycle(t, r, e.clk.Now())
		tick(m, res)
		cycles++
		dispatched += res.Dispatched
		handed += res.Handed
		bound += res.WarmBound
		latencies = append(latencies, res.DispatchLatencies...)
		return finished("run-kube") && finished("run-warm")
	}, eventually.Every(clusterPoll))
	if dispatched != 1 || bound != 1 || len(latencies) != 2 || handed != min(mode.buffer, 1) {
		t.Fatalf("dispatched %d (handed to the workers %d), bound %d, latencies %v: want a pod, a bind and the latency of each",
			dispatched, handed, bound, latencies)
	}
	for _, l := range latencies {
		if l < 0 || l > time.Duration(cycles)*time.Second {
			t.Errorf("dispatch latency %s outside the %d fake seconds the test ran", l, cycles)
		}
	}
	for run, want := range map[string]string{"run-kube": sdk.RunSuccess, "run-warm": sdk.RunSuccess} {
		if rn, _ := e.w.Run(ctx, run); rn.State != want {
			t.Fatalf("run %s is %s, want %s", run, rn.State, want)
		}
	}
	got := gathered(t, m)
	for name, want := range map[string]float64{
		"dexaflow_scheduler_dispatch_latency_seconds":     2,
		"dexaflow_scheduler_loop_duration_seconds":        float64(cycles),
		"dexaflow_scheduler_runs_started_total":           1,
		"dexaflow_scheduler_runs_waiting_start_cap":       0,
		"dexaflow_scheduler_run_finalize_latency_seconds": 2,
	} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v", name, got[name], want)
		}
	}
	t.Logf("%d cycles; dispatch latencies (fake clock) %v", cycles, latencies)
}

package metrics_test

import (
	"testing"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/host/metrics"
	"github.com/dexaflow/reaper/runner/cyclemeter"
	"github.com/dexaflow/reaper/runner/kuberunner"
	"github.com/dexaflow/reaper/runner/literunner"
)

// Both runners meter through the host's metrics.
var (
	_ literunner.Meter = (*metrics.Metrics)(nil)
	_ kuberunner.Meter = (*metrics.Metrics)(nil)
)

// TestRunnerCycle: a runner's cycle is metered as its tick (duration,
// runs started and waiting, latencies) and, with pools, as the pools'
// gauges, the recovery budget's counts among them; a cycle of a runner
// with no pools that read none leaves the pools' series alone.
func TestRunnerCycle(t *testing.T) {
	m := metrics.New()
	m.RunnerCycle(cyclemeter.Cycle{Took: time.Second, RunsStarted: 2, RunsWaiting: 3,
		DispatchLatencies: []time.Duration{time.Second}, FinalizeLatencies: []time.Duration{time.Second, time.Second}})
	got := gather(t, m)
	for k, v := range map[string]float64{"dexaflow_scheduler_runs_started_total": 2, "dexaflow_scheduler_runs_waiting_start_cap": 3} {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if n, ok := got["dexaflow_pool_waiting_tasks series"]; ok {
		t.Errorf("a cycle without pools set %v pool series", n)
	}
	m.RunnerCycle(cyclemeter.Cycle{Slots: map[string]int{"db": 4},
		Pools:    []lifecycle.PoolUse{{Pool: "db", Queued: 1, Running: 1}},
		Recovery: map[string]*lifecycle.RecoveryCount{"db": {Admitted: 2, Deferred: 5}}})
	got = gather(t, m)
	for k, v := range map[string]float64{"dexaflow_pool_slots": 4 + 1 + 1 + 2, "dexaflow_recovery_dispatches_total": 7} {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

// gather sums each counter's and gauge's series, and counts each
// family's series under its name.
func gather(t *testing.T, m *metrics.Metrics) map[string]float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			out[mf.GetName()] += s.GetGauge().GetValue() + s.GetCounter().GetValue()
			out[mf.GetName()+" series"]++
		}
	}
	return out
}

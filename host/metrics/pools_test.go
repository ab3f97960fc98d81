package metrics_test

import (
	"strings"
	"testing"

	"github.com/dexaflow/reaper/host/metrics"
)

// TestPoolsGauges: the configured pools and the default pool get their
// series; any pool a task names that no block does is summed under
// "(unconfigured)", so made-up names open no series of their own.
func TestPoolsGauges(t *testing.T) {
	m := metrics.New()
	use := []metrics.PoolUse{{Pool: "db", Queued: 1, Running: 2, Silent: 1, Waiting: 3}}
	for i := range 50 {
		use = append(use, metrics.PoolUse{Pool: "made-up-" + strings.Repeat("x", i), Running: 1, Waiting: 1})
	}
	m.Pools(map[string]int{"db": 4}, "default_pool", use)
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "dexaflow_pool_") {
			continue
		}
		for _, s := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range s.GetLabel() {
				key += " " + l.GetName() + "=" + l.GetValue()
			}
			got[key] = s.GetGauge().GetValue()
		}
	}
	want := map[string]float64{
		"dexaflow_pool_waiting_tasks pool=(unconfigured)": 50, "dexaflow_pool_waiting_tasks pool=db": 3,
		"dexaflow_pool_waiting_tasks pool=default_pool": 0,
		"dexaflow_pool_slots pool=db state=total":       4, "dexaflow_pool_slots pool=db state=open": 1,
		"dexaflow_pool_slots pool=db state=queued": 1, "dexaflow_pool_slots pool=db state=running": 2,
		"dexaflow_pool_slots pool=db state=silent":              1,
		"dexaflow_pool_slots pool=(unconfigured) state=running": 50,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if len(got) != 3+3+3*3+2 {
		t.Errorf("%d pool series, want 17 (waiting, recovery waiting and queued, running, silent for three pools; total and open for db): %v",
			len(got), got)
	}
}

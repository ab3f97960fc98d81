package reapers_test

import (
	"strings"
	"testing"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// TestFenceRefusalStepsTheReplicaDown: the board comes to name another
// replica under the very term this one leads (a failover to a standby that
// missed the write that gave the term out, and a successor given the same
// number). This replica's elector still trusts its lease, so its next cycle
// judges and marks; the fence refuses every mark for the holder, nothing is
// written, the refusal is metered and logged once, and the replica stops
// leading at once instead of at its next renewal.
func TestFenceRefusalStepsTheReplicaDown(t *testing.T) {
	const runID = "fenced"
	w, crash, as := crashWorld(t, runID)
	l := ladder.Defaults()
	w.runCycle() // the settling gate's first cycle
	w.advance(max(crash.Add(l.DispatchLost).Sub(w.now()), l.SettlingGrace) + l.MaintenanceInterval)
	if _, err := w.pool.Exec(w.ctx, `UPDATE leader SET holder = 'another-replica'`); err != nil {
		t.Fatal(err)
	}

	res := w.host.RunCycle(w.ctx)
	if !res.Leading {
		t.Fatalf("the cycle did not run as the leader (its lease is still trusted): %+v", res)
	}
	for _, a := range as {
		if got := w.ti(a); got.State != sdk.StateQueued {
			t.Errorf("%s is %s after a cycle whose marks the fence refused, want queued", a, got.State)
		}
	}
	if again := w.host.RunCycle(w.ctx); again.Leading {
		t.Errorf("the replica still leads after the fence refused its term")
	}
	if st := w.host.Campaign(w.ctx); st.Leading {
		t.Errorf("the replica took the lease back from the holder the board names: %+v", st)
	}
	if n := fenceRefused(t, w, "mark"); n < 1 {
		t.Errorf("reaper_fence_refused_total{write=mark} = %v, want at least 1", n)
	}
	if n := strings.Count(w.logs.String(), "stepping down"); n != 1 {
		t.Errorf("the step down was logged %d times, want once:\n%s", n, w.logs.String())
	}
}

// fenceRefused reads reaper_fence_refused_total for write.
func fenceRefused(t *testing.T, w *world, write string) float64 {
	t.Helper()
	mfs, err := w.host.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "reaper_fence_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "write" && lp.GetValue() == write {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

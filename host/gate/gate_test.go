package gate_test

import (
	"testing"
	"time"

	"github.com/dexaflow/reaper/host/gate"
	"github.com/dexaflow/reaper/sdk"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

const grace = 180 * time.Second

func TestGate(t *testing.T) {
	t.Run("HoldsForGraceAndSkipsEachCycle", func(t *testing.T) {
		g := gate.New(grace)
		g.Lead(1, t0)
		g.Swept(1)
		for at := time.Duration(0); at < grace; at += 30 * time.Second {
			v := g.Check(t0.Add(at), true)
			if v.Open || v.Label != sdk.LabelSettlingSkip {
				t.Fatalf("at %v: %+v, want closed with a skip", at, v)
			}
		}
	})
	t.Run("OpensWhenAllThreeHold", func(t *testing.T) {
		g := gate.New(grace)
		g.Lead(1, t0)
		if v := g.Check(t0.Add(grace), false); v.Open {
			t.Fatalf("opened unsynced: %+v", v)
		}
		if v := g.Check(t0.Add(grace), true); v.Open || len(v.Waiting) != 1 || v.Waiting[0] != "sweep" {
			t.Fatalf("opened without a sweep: %+v", v)
		}
		g.Swept(1)
		if v := g.Check(t0.Add(grace), true); !v.Open || v.Valve || v.Label != "" {
			t.Fatalf("did not settle: %+v", v)
		}
	})
	t.Run("SweepOfAnotherTermDoesNotCount", func(t *testing.T) {
		g := gate.New(grace)
		g.Lead(2, t0)
		g.Swept(1)
		if v := g.Check(t0.Add(grace), true); v.Open {
			t.Fatalf("a stale term's sweep opened the gate: %+v", v)
		}
	})
	t.Run("ValveOpensAtTwiceGraceAndIsRecordedEachCycle", func(t *testing.T) {
		g := gate.New(grace)
		g.Lead(1, t0)
		g.Swept(1)
		if v := g.Check(t0.Add(2*grace-time.Second), false); v.Open {
			t.Fatalf("valve opened early: %+v", v)
		}
		for i := 0; i < 3; i++ {
			v := g.Check(t0.Add(2*grace+time.Duration(i)*30*time.Second), false)
			if !v.Open || !v.Valve || v.Label != sdk.LabelSettlingValveOpen {
				t.Fatalf("cycle %d: %+v, want the valve open and recorded", i, v)
			}
		}
		// Once the substrate syncs, the gate settles and stops recording.
		if v := g.Check(t0.Add(3*grace), true); !v.Open || v.Valve || v.Label != "" {
			t.Fatalf("did not settle after sync: %+v", v)
		}
	})
	t.Run("ReelectionResetsTheGate", func(t *testing.T) {
		g := gate.New(grace)
		g.Lead(1, t0)
		g.Swept(1)
		if v := g.Check(t0.Add(grace), true); !v.Open {
			t.Fatalf("term 1 did not settle: %+v", v)
		}
		later := t0.Add(10 * time.Minute)
		g.Lead(2, later)
		if v := g.Check(later.Add(time.Minute), true); v.Open || v.Label != sdk.LabelSettlingSkip {
			t.Fatalf("new term inherited the old settling: %+v", v)
		}
	})
}

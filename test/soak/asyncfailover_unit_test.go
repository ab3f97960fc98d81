package soak

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/history"
)

// The failover's mode is its pick's parity, the asynchronous window drawn
// from the rest of the pick within its bounds; the seed replays both, and
// the schedule of every other fault is the one drawn without the mode.
func TestFailoverModeFromThePick(t *testing.T) {
	var windows []time.Duration
	rng := rand.New(rand.NewPCG(1, 2))
	for range 4000 {
		pick := rng.Uint64()
		async, w := failoverMode(pick)
		if async != (pick%2 == 1) {
			t.Fatalf("pick %d: async %t", pick, async)
		}
		if async && (w < lostMin || w >= lostMax) {
			t.Fatalf("pick %d: window %s outside [%s, %s)", pick, w, lostMin, lostMax)
		}
		if !async && w != 0 {
			t.Fatalf("pick %d: a synchronous failover with a window %s", pick, w)
		}
		if async {
			windows = append(windows, w)
		}
	}
	short, long := false, false
	for _, w := range windows {
		short, long = short || w < lease+time.Second, long || w > lease+grace
	}
	if !short || !long {
		t.Errorf("windows drawn short %t, past the lease and grace %t; want both", short, long)
	}
	// Both editions' draws (the kube player's and the real node's too)
	// throw both modes.
	for name, ws := range map[string][]faultWeight{"lite": faultWeights, "player": kubeFaultWeights, "real": realFaultWeights} {
		modes := map[bool]int{}
		for seed := range uint64(40) {
			in := newInjector(&soak{seed: seed}, ws)
			for range 2000 {
				if st := in.next(); st.kind == FaultFailover {
					async, _ := failoverMode(st.pick)
					modes[async]++
					break
				}
			}
		}
		if modes[true] == 0 || modes[false] == 0 {
			t.Errorf("%s: 40 seeds drew the failover asynchronous %d times, synchronous %d; want both", name, modes[true], modes[false])
		}
	}
}

// On kube, a pod stop that tore down an execution the lost window took
// from the board is excused, and counted, on the same terms as an agent
// told should_terminate; nothing else is.
func TestLostPodStopIsNarrow(t *testing.T) {
	a := attempt("a", 1, 0)
	fo := Fault{Kind: FaultFailoverAsync, At: at(10), Ended: at(21), LostFrom: at(10), LostTo: at(20)}
	running := Execution{Attempt: a, AgentPID: 10, PGID: 11, Start: at(15), LastSeenAlive: at(23), End: at(23),
		EndReason: agent.ReasonAgentStopped}
	stop := PodStop{At: at(22), Attempt: a, Pod: "p-a", How: "deleted", Phase: "Running"}
	check := func(h History) []Violation {
		h.Now = at(60)
		return CheckNoLivePodTornDown(h)
	}
	t.Run("StartedInTheWindowTornDownByThePromotedBoard_Excused", func(t *testing.T) {
		h := History{Faults: []Fault{fo}, Executions: []Execution{running}, PodStops: []PodStop{stop}}
		expect(t, check(h), 0, "")
		if ex := ExcusedByLostWindow(h); len(ex) != 1 || !strings.Contains(ex[0], "pod p-a") {
			t.Errorf("excused %v, want the one pod stop", ex)
		}
	})
	for _, tc := range []struct {
		name string
		h    History
	}{
		{"NoLostWindow", History{Faults: []Fault{{Kind: FaultFailover, At: at(10), Ended: at(21)}},
			Executions: []Execution{running}, PodStops: []PodStop{stop}}},
		{"StartedBeforeTheWindow", History{Faults: []Fault{fo}, Executions: []Execution{func() Execution {
			e := running
			e.Start = at(9)
			return e
		}()}, PodStops: []PodStop{stop}}},
		{"TornDownBeforeThePrimaryDied", History{Faults: []Fault{fo}, Executions: []Execution{running},
			PodStops: []PodStop{func() PodStop {
				ps := stop
				ps.At = at(19)
				return ps
			}()}}},
		{"ThePromotedBoardHadItRunning", History{Faults: []Fault{fo}, Executions: []Execution{running}, PodStops: []PodStop{stop},
			Transitions: []Transition{{At: at(21.5), From: a, To: a, OldState: sdk.StateQueued, NewState: sdk.StateRunning}}}},
	} {
		t.Run(tc.name+"_Violates", func(t *testing.T) {
			expect(t, check(tc.h), 1, "while its task ran")
			if ex := ExcusedByLostWindow(tc.h); len(ex) != 0 {
				t.Errorf("excused %v", ex)
			}
		})
	}
}

// An agent told should_terminate because the promoted board lost its
// attempt's running is excused, and counted; nothing else is.
func TestLostRunningIsNarrow(t *testing.T) {
	a := attempt("a", 1, 0)
	// Lost from 10 to 20 (the primary killed), promoted at 21.
	fo := Fault{Kind: FaultFailoverAsync, At: at(10), Ended: at(21), LostFrom: at(10), LostTo: at(20)}
	stopped := Execution{Attempt: a, AgentPID: 10, PGID: 11, Start: at(15), End: at(22), EndReason: agent.ReasonTerminated}
	running := Transition{At: at(21.5), From: a, To: a, OldState: sdk.StateQueued, NewState: sdk.StateRunning}
	check := func(h History) []Violation {
		h.Now = at(60)
		return CheckNoReapOfALiveAttempt(h)
	}
	t.Run("StartedInTheWindowAndStoppedByThePromotedBoard_Excused", func(t *testing.T) {
		h := History{Faults: []Fault{fo}, Executions: []Execution{stopped}}
		expect(t, check(h), 0, "")
		if ex := ExcusedByLostWindow(h); len(ex) != 1 || !strings.Contains(ex[0], "never had it running") {
			t.Errorf("excused %v, want the one execution", ex)
		}
	})
	t.Run("StillFailingOver_Excused", func(t *testing.T) {
		under := fo
		under.Ended = time.Time{}
		expect(t, check(History{Faults: []Fault{under}, Executions: []Execution{stopped}}), 0, "")
	})
	for _, tc := range []struct {
		name string
		h    History
	}{
		{"NoLostWindow", History{Faults: []Fault{{Kind: FaultFailover, At: at(10), Ended: at(21)}}, Executions: []Execution{stopped}}},
		{"StartedBeforeTheWindow", History{Faults: []Fault{fo}, Executions: []Execution{func() Execution {
			e := stopped
			e.Start = at(9)
			return e
		}()}}},
		{"StartedAfterThePromotion", History{Faults: []Fault{fo}, Executions: []Execution{func() Execution {
			e := stopped
			e.Start, e.End = at(21.2), at(23)
			return e
		}()}}},
		{"StoppedBeforeThePrimaryDied", History{Faults: []Fault{fo}, Executions: []Execution{func() Execution {
			e := stopped
			e.End = at(19)
			return e
		}()}}},
		{"ThePromotedBoardHadItRunning", History{Faults: []Fault{fo}, Executions: []Execution{func() Execution {
			e := stopped
			e.End = at(23)
			return e
		}()}, Transitions: []Transition{running}}},
	} {
		t.Run(tc.name+"_Violates", func(t *testing.T) {
			expect(t, check(tc.h), 1, "should_terminate")
			if ex := ExcusedByLostWindow(tc.h); len(ex) != 0 {
				t.Errorf("excused %v", ex)
			}
		})
	}
	t.Run("AMarkWhileTheAgentLived_Violates", func(t *testing.T) {
		mark := Transition{At: at(22), From: a, To: a, OldState: sdk.StateRunning, NewState: sdk.StateFailed,
			FailureReason: sdk.LabelAgentLost, Term: 3}
		alive := Execution{Attempt: a, AgentPID: 10, PGID: 11, Start: at(15), LastSeenAlive: at(25), Gone: true}
		expect(t, check(History{Faults: []Fault{fo}, Executions: []Execution{alive}, Transitions: []Transition{mark}}), 1, "marked")
	})
	t.Run("KilledByASignalNobodySent_Violates", func(t *testing.T) {
		e := stopped
		e.EndReason = agent.ReasonSignal
		expect(t, check(History{Faults: []Fault{fo}, Executions: []Execution{e}}), 1, "signal")
	})
}

// The history carries the lost window as a fault event at the primary's
// kill; the checker then excuses a run the promoted board never had.
func TestRecordCarriesTheLostWindow(t *testing.T) {
	lostRun := sdk.Attempt{RunID: "r2", TaskID: "l", Try: 1}
	h := History{
		Faults: []Fault{{Kind: FaultFailoverAsync, At: at(10), Ended: at(21), LostFrom: at(10), LostTo: at(20)}},
		Executions: []Execution{{Attempt: lostRun, AgentPID: 10, PGID: 11, LeaderStart: 5, Start: at(15), End: at(22),
			EndState: sdk.StateFailed, EndReason: agent.ReasonTerminated}},
	}
	events := Record(h, nil)
	n := 0
	for _, e := range events {
		if e.Kind == history.KindFault && !e.LostFrom.IsZero() {
			n++
			if !e.LostFrom.Equal(at(10)) || !e.Time.Equal(at(20)) {
				t.Errorf("the lost window's event: %+v", e)
			}
		}
	}
	if n != 1 {
		t.Fatalf("%d lost windows among the events, want 1", n)
	}
	if v := history.Check(events); !v.OK() || v.ExcusedByLostWindow != 1 {
		t.Errorf("excused %d:\n%s", v.ExcusedByLostWindow, v)
	}
	// Without the window, the run with no final row is a violation.
	h.Faults[0].LostFrom, h.Faults[0].LostTo = time.Time{}, time.Time{}
	if v := history.Check(Record(h, nil)); v.OK() {
		t.Errorf("no window, yet no violation:\n%s", v)
	}
}

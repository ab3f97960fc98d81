package boardtest

import (
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// agentLost is the mark a reaper makes at T0 of a running attempt silent
// past 90s.
func agentLost(f Fixture, a sdk.Attempt) sdk.Mark {
	return sdk.Mark{Attempt: a, FromStates: []string{sdk.StateRunning}, HeartbeatBefore: at(-90 * time.Second),
		Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost, Message: "agent_lost: silent", Term: f.Term(), At: at(0)}
}

func markOne(t *testing.T, f Fixture, m sdk.Mark) sdk.MarkResult {
	t.Helper()
	res, err := f.Board().Mark(t.Context(), []sdk.Mark{m})
	return one(t, m.Attempt, res, err)
}

// silent seeds the running attempt an agent_lost mark is made of.
func silent(f Fixture) sdk.Attempt {
	return running(f, "run", "task", at(-20*time.Minute), at(-10*time.Minute))
}

// markNoop asserts that m is a no-op for reason and wrote nothing.
func markNoop(t *testing.T, f Fixture, m sdk.Mark, reason string) {
	t.Helper()
	before, _ := f.Row(m.RunID, m.TaskID)
	noop(t, markOne(t, f, m), reason)
	if after, ok := f.Row(m.RunID, m.TaskID); ok && !sameRow(before, after) {
		t.Fatalf("a no-op mark wrote the row:\nbefore %+v\nafter  %+v", before, after)
	}
}

func markCases() map[string]func(t *testing.T, f Fixture) {
	return map[string]func(t *testing.T, f Fixture){
		"InfraMarkFailsTheAttemptProvisionally": func(t *testing.T, f Fixture) {
			a := silent(f)
			m := agentLost(f, a)
			applied(t, markOne(t, f, m))
			r := row(t, f, a)
			if r.State != sdk.StateFailed || r.LastFailureKind != sdk.FailureInfra || r.FailureReason != sdk.LabelAgentLost ||
				r.ErrorMessage != m.Message || r.Held || !r.InfraConfirmedAt.IsZero() {
				t.Fatalf("row after an infra mark: %+v", r)
			}
			sameTime(t, "infra_marked_at", r.InfraMarkedAt, at(0))
			sameTime(t, "ended_at", r.EndedAt, at(0))
		},
		"ConfirmedAndHeldMarkStampsBoth": func(t *testing.T, f Fixture) {
			a := silent(f)
			m := agentLost(f, a)
			m.Confirm, m.Hold = true, true
			applied(t, markOne(t, f, m))
			r := row(t, f, a)
			sameTime(t, "infra_confirmed_at", r.InfraConfirmedAt, at(0))
			if !r.Held {
				t.Fatalf("a held mark did not hold: %+v", r)
			}
		},
		"TaskMarkIsNoInfraMark": func(t *testing.T, f Fixture) {
			a := silent(f)
			m := agentLost(f, a)
			m.Kind, m.Reason, m.Confirm = sdk.MarkTask, sdk.LabelCredentialCeiling, true
			applied(t, markOne(t, f, m))
			r := row(t, f, a)
			if r.LastFailureKind != sdk.FailureTask || !r.InfraMarkedAt.IsZero() || !r.InfraConfirmedAt.IsZero() {
				t.Fatalf("row after a task mark: %+v", r)
			}
		},
		"AnotherTryIsMovedOn": func(t *testing.T, f Fixture) {
			m := agentLost(f, silent(f))
			m.Try++
			markNoop(t, f, m, sdk.NoopMovedOn)
		},
		"AnotherEpochIsMovedOn": func(t *testing.T, f Fixture) {
			m := agentLost(f, silent(f))
			m.Epoch++
			markNoop(t, f, m, sdk.NoopMovedOn)
		},
		"AnotherStateIsMovedOn": func(t *testing.T, f Fixture) {
			m := agentLost(f, silent(f))
			m.FromStates = []string{sdk.StateQueued}
			markNoop(t, f, m, sdk.NoopMovedOn)
		},
		"HeartbeatSinceTheThresholdHolds": func(t *testing.T, f Fixture) {
			m := agentLost(f, running(f, "run", "task", at(-20*time.Minute), at(-90*time.Second)))
			markNoop(t, f, m, sdk.NoopHeartbeated) // exactly at the threshold is not before it
		},
		"AnyHeartbeatHoldsANeverHeartbeatedMark": func(t *testing.T, f Fixture) {
			m := agentLost(f, silent(f))
			m.HeartbeatBefore, m.RequireNoHeartbeat = time.Time{}, true
			markNoop(t, f, m, sdk.NoopHeartbeated)
		},
		"NeverHeartbeatedMarkApplies": func(t *testing.T, f Fixture) {
			m := agentLost(f, running(f, "run", "task", at(-20*time.Minute), time.Time{}))
			m.HeartbeatBefore, m.RequireNoHeartbeat = time.Time{}, true
			applied(t, markOne(t, f, m))
		},
		"DeposedTermIsANoop": func(t *testing.T, f Fixture) {
			m := agentLost(f, silent(f))
			f.Depose()
			markNoop(t, f, m, sdk.NoopDeposed)
		},
		"ExpiredLeaseIsDeposed": func(t *testing.T, f Fixture) {
			m := agentLost(f, silent(f))
			f.ExpireLease(m.At) // expired at the very time of the mark
			markNoop(t, f, m, sdk.NoopDeposed)
		},
		"MissingRowIsNotFound": func(t *testing.T, f Fixture) {
			silent(f)
			markNoop(t, f, agentLost(f, attempt("run", "ghost")), sdk.NoopNotFound)
		},
		// The board, not the plugin, decides where a mark may come from:
		// a mark that asks to move an attempt out of a terminal state is
		// refused whole, whatever the row holds, and nothing is written.
		"MarkFromATerminalStateIsRefused": func(t *testing.T, f Fixture) {
			for _, st := range []string{sdk.StateSuccess, sdk.StateFailed, sdk.StateSkipped, sdk.StateUpstreamFailed} {
				for _, kind := range []sdk.MarkKind{sdk.MarkInfra, sdk.MarkTask} {
					a := attempt("run", st+"-"+string(kind))
					f.Put(Row{Attempt: a, State: st, RunningAt: at(-20 * time.Minute), EndedAt: at(-time.Minute)})
					m := agentLost(f, a)
					m.Kind, m.FromStates, m.Confirm = kind, []string{sdk.StateRunning, st}, kind == sdk.MarkInfra
					markNoop(t, f, m, sdk.NoopSourceRefused)
				}
			}
		},
		// A successful attempt cannot be turned into a confirmed infra
		// failure by a plugin that names its state.
		"SuccessCannotBeMarkedAConfirmedInfraFailure": func(t *testing.T, f Fixture) {
			a := attempt("run", "done")
			f.Put(Row{Attempt: a, State: sdk.StateSuccess, RunningAt: at(-20 * time.Minute), EndedAt: at(-time.Minute)})
			m := agentLost(f, a)
			m.FromStates, m.Confirm, m.HeartbeatBefore = []string{sdk.StateSuccess}, true, time.Time{}
			markNoop(t, f, m, sdk.NoopSourceRefused)
			if r := row(t, f, a); r.State != sdk.StateSuccess || r.LastFailureKind != "" {
				t.Fatalf("a success after a refused mark: %+v", r)
			}
		},
		"SourceStatesAreTheBoardsPerKind": func(t *testing.T, f Fixture) {
			// A task mark may not come from queued (no code of the task ran);
			// an infra mark may. None and scheduled are nobody's.
			q := attempt("run", "queued")
			f.Put(Row{Attempt: q, State: sdk.StateQueued, QueuedAt: at(-10 * time.Minute)})
			m := agentLost(f, q)
			m.Kind, m.FromStates, m.HeartbeatBefore = sdk.MarkTask, []string{sdk.StateQueued}, time.Time{}
			markNoop(t, f, m, sdk.NoopSourceRefused)
			for _, st := range []string{sdk.StateNone, sdk.StateScheduled} {
				a := attempt("run", st)
				f.Put(Row{Attempt: a, State: st})
				m := agentLost(f, a)
				m.FromStates, m.HeartbeatBefore = []string{st}, time.Time{}
				markNoop(t, f, m, sdk.NoopSourceRefused)
			}
			m = agentLost(f, q)
			m.FromStates, m.HeartbeatBefore, m.Reason = []string{sdk.StateQueued}, time.Time{}, sdk.LabelDispatchLost
			applied(t, markOne(t, f, m))
		},
		"MarkOnAFinishedRunIsRefused": func(t *testing.T, f Fixture) {
			for _, st := range []string{sdk.RunSuccess, sdk.RunFailed} {
				a := running(f, "run-"+st, "task", at(-20*time.Minute), at(-10*time.Minute))
				f.PutRun(RunRow{RunID: a.RunID, State: st, StartedAt: at(-24 * time.Hour)})
				markNoop(t, f, agentLost(f, a), sdk.NoopRunFinished)
			}
		},
		"ParkedStatesCanBeMarked": func(t *testing.T, f Fixture) {
			for _, st := range []string{sdk.StateUpForReschedule, sdk.StateDeferred} {
				a := attempt("run", st)
				f.Put(Row{Attempt: a, State: st, EndedAt: at(-48 * time.Hour)})
				applied(t, markOne(t, f, sdk.Mark{Attempt: a, FromStates: []string{sdk.StateUpForReschedule, sdk.StateDeferred},
					Kind: sdk.MarkTask, Reason: "parked_past_ttl", Message: "parked_past_ttl: 48h", Term: f.Term(), At: at(0)}))
				if r := row(t, f, a); r.State != sdk.StateFailed || r.LastFailureKind != sdk.FailureTask {
					t.Fatalf("%s after its mark: %+v", st, r)
				}
			}
		},
		"BatchAnswersEachMarkInOrder": func(t *testing.T, f Fixture) {
			ok := silent(f)
			moved := running(f, "run", "moved", at(-20*time.Minute), at(-10*time.Minute))
			live := running(f, "run", "live", at(-20*time.Minute), at(-time.Second))
			stale := agentLost(f, moved)
			stale.Epoch++
			marks := []sdk.Mark{agentLost(f, live), stale, agentLost(f, ok), agentLost(f, attempt("run", "ghost"))}
			res, err := f.Board().Mark(t.Context(), marks)
			if err != nil || len(res) != len(marks) {
				t.Fatalf("results %+v err %v", res, err)
			}
			want := []string{sdk.NoopHeartbeated, sdk.NoopMovedOn, "", sdk.NoopNotFound}
			for i, r := range res {
				if r.Attempt != marks[i].Attempt || r.NoopReason != want[i] || r.Applied != (want[i] == "") {
					t.Fatalf("result %d = %+v, want %q", i, r, want[i])
				}
			}
		},
		"TaskNamedTwiceInABatchIsAnError": func(t *testing.T, f Fixture) {
			m := agentLost(f, silent(f))
			again := m
			again.Epoch++
			if _, err := f.Board().Mark(t.Context(), []sdk.Mark{m, again}); err == nil {
				t.Fatal("a batch naming a task twice was accepted")
			}
			if r := row(t, f, m.Attempt); r.State != sdk.StateRunning {
				t.Fatalf("a refused batch wrote: %+v", r)
			}
		},
		"UnguardedMarkIsAnError": func(t *testing.T, f Fixture) {
			m := agentLost(f, silent(f))
			for name, bad := range map[string]func(*sdk.Mark){
				"NoStates": func(m *sdk.Mark) { m.FromStates = nil },
				"NoKind":   func(m *sdk.Mark) { m.Kind = "" },
				"NoTerm":   func(m *sdk.Mark) { m.Term = 0 },
				"NoTime":   func(m *sdk.Mark) { m.At = time.Time{} },
			} {
				mm := m
				bad(&mm)
				if _, err := f.Board().Mark(t.Context(), []sdk.Mark{mm}); err == nil {
					t.Errorf("%s: accepted", name)
				}
			}
		},
	}
}

package sdktest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

func TestBoardMark(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t0 := T0()

	type bundle struct {
		b *Board
		a sdk.Attempt
		m sdk.Mark
	}
	setup := func() bundle {
		b := NewBoard()
		a := b.PutRunning("r1", "t1", t0.Add(-10*time.Minute), t0.Add(-2*time.Minute))
		m := sdk.Mark{Attempt: a, FromStates: []string{sdk.StateRunning}, HeartbeatBefore: t0.Add(-90 * time.Second),
			Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost, Message: "agent_lost: silent", Term: 1, At: t0}
		return bundle{b, a, m}
	}
	markOne := func(t *testing.T, b *Board, m sdk.Mark) sdk.MarkResult {
		t.Helper()
		res, err := b.Mark(ctx, []sdk.Mark{m})
		if err != nil {
			t.Fatalf("mark: %v", err)
		}
		return res[0]
	}

	t.Run("GuardedMarkApplies", func(t *testing.T) {
		t.Parallel()
		s := setup()
		s.m.Confirm, s.m.Hold = true, true
		if res := markOne(t, s.b, s.m); !res.Applied {
			t.Fatalf("not applied: %+v", res)
		}
		row := s.b.Row(s.a)
		if row.State != sdk.StateFailed || row.LastFailureKind != sdk.FailureInfra || !row.InfraMarkedAt.Equal(t0) ||
			!row.InfraConfirmedAt.Equal(t0) || !row.Held || row.ErrorMessage != "agent_lost: silent" {
			t.Fatalf("row after mark: %+v", row)
		}
	})
	t.Run("ProvisionalInfraMarkLeavesConfirmationEmpty", func(t *testing.T) {
		t.Parallel()
		s := setup()
		markOne(t, s.b, s.m)
		if row := s.b.Row(s.a); !row.InfraConfirmedAt.IsZero() || !row.Live() {
			t.Fatalf("provisional mark: %+v live=%v", row, row.Live())
		}
	})
	t.Run("TaskMarkIsNotInfra", func(t *testing.T) {
		t.Parallel()
		s := setup()
		s.m.Kind = sdk.MarkTask
		markOne(t, s.b, s.m)
		if row := s.b.Row(s.a); row.LastFailureKind != sdk.FailureTask || !row.InfraMarkedAt.IsZero() || row.Live() {
			t.Fatalf("task mark: %+v", row)
		}
	})

	noops := []struct {
		name   string
		modify func(s *bundle)
		want   string
	}{
		{"OtherTry_MovedOn", func(s *bundle) { s.m.Try = 2 }, sdk.NoopMovedOn},
		{"OtherEpoch_MovedOn", func(s *bundle) { s.b.Replace("r1", "t1", false, sdk.StateRunning, t0) }, sdk.NoopMovedOn},
		{"StateNotInFromStates_MovedOn", func(s *bundle) { s.m.FromStates = []string{sdk.StateQueued} }, sdk.NoopMovedOn},
		{"FreshHeartbeat_Heartbeated", func(s *bundle) { s.b.Heartbeat("r1", "t1", t0.Add(-5*time.Second)) }, sdk.NoopHeartbeated},
		{"HeartbeatAtGuardInstant_Heartbeated", func(s *bundle) { s.b.Heartbeat("r1", "t1", s.m.HeartbeatBefore) }, sdk.NoopHeartbeated},
		{"RequireNoHeartbeatButHeartbeated_Heartbeated", func(s *bundle) { s.m.HeartbeatBefore, s.m.RequireNoHeartbeat = time.Time{}, true }, sdk.NoopHeartbeated},
		{"OldTerm_Deposed", func(s *bundle) { s.b.SetTerm(2) }, sdk.NoopDeposed},
		{"NoSuchRow_NotFound", func(s *bundle) { s.m.TaskID = "nope" }, sdk.NoopNotFound},
	}
	for _, tc := range noops {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := setup()
			tc.modify(&s)
			res := markOne(t, s.b, s.m)
			if res.Applied || res.NoopReason != tc.want {
				t.Fatalf("got %+v, want noop %q", res, tc.want)
			}
			if row := s.b.Row(s.a); row.State != sdk.StateRunning {
				t.Fatalf("row changed: %+v", row)
			}
		})
	}

	t.Run("MoveBetweenListAndMark_HookNoop", func(t *testing.T) {
		t.Parallel()
		s := setup()
		s.b.OnMark(func(m sdk.Mark) { s.b.Heartbeat(m.RunID, m.TaskID, t0) })
		if res := markOne(t, s.b, s.m); res.NoopReason != sdk.NoopHeartbeated {
			t.Fatalf("got %+v", res)
		}
	})
	t.Run("UnguardedMarkRefused", func(t *testing.T) {
		t.Parallel()
		s := setup()
		for _, bad := range []func(m *sdk.Mark){
			func(m *sdk.Mark) { m.FromStates = nil },
			func(m *sdk.Mark) { m.Kind = "" },
			func(m *sdk.Mark) { m.At = time.Time{} },
			func(m *sdk.Mark) { m.RunID = "" },
			func(m *sdk.Mark) { m.Reason = "" },
		} {
			m := s.m
			bad(&m)
			if _, err := s.b.Mark(ctx, []sdk.Mark{m}); err == nil {
				t.Fatalf("mark %+v accepted", m)
			}
		}
		if s.b.Writes() != 0 {
			t.Fatalf("refused marks counted as writes")
		}
	})
	t.Run("InjectedError", func(t *testing.T) {
		t.Parallel()
		s := setup()
		s.b.Fail(OpMark, errors.New("boom"))
		if _, err := s.b.Mark(ctx, []sdk.Mark{s.m}); err == nil {
			t.Fatal("no error")
		}
	})
}

func TestBoardListCandidates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t0 := T0()
	running := sdk.CandidateQuery{States: []string{sdk.StateRunning}, OrderBy: sdk.FieldHeartbeatAt,
		OlderThan: t0.Add(-90 * time.Second), Heartbeat: sdk.HeartbeatSeen}

	t.Run("ThresholdBeforeLimit", func(t *testing.T) {
		t.Parallel()
		b := NewBoard()
		for i := range 150 { // fresh rows, older in running time but heartbeating
			b.PutRunning("fresh", fmt.Sprintf("t%03d", i), t0.Add(-time.Hour), t0.Add(-time.Second))
		}
		stale := b.PutRunning("stale", "t", t0.Add(-time.Minute), t0.Add(-2*time.Minute))
		page, err := b.ListCandidates(ctx, running)
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Candidates) != 1 || page.Candidates[0].Attempt != stale || page.Next != nil {
			t.Fatalf("page: %+v", page)
		}
	})
	t.Run("NullTimestampNeverListed", func(t *testing.T) {
		t.Parallel()
		b := NewBoard()
		b.PutQueued("r", "noqueuedat", time.Time{})
		page, err := b.ListCandidates(ctx, sdk.CandidateQuery{States: []string{sdk.StateQueued}, OrderBy: sdk.FieldQueuedAt, OlderThan: t0})
		if err != nil || len(page.Candidates) != 0 {
			t.Fatalf("page %+v err %v", page, err)
		}
	})
	t.Run("OldestFirstKeysetPaging", func(t *testing.T) {
		t.Parallel()
		b := NewBoard()
		for i := range 250 {
			// Same timestamp for pairs, so the run/task tiebreak is exercised.
			b.PutRunning(fmt.Sprintf("r%03d", 249-i), "t", t0.Add(-time.Hour), t0.Add(-time.Duration(10+i/2)*time.Minute))
		}
		var seen []sdk.Candidate
		q := running
		for pages := 0; ; pages++ {
			page, err := b.ListCandidates(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			seen = append(seen, page.Candidates...)
			if page.Next == nil {
				if pages != 2 || len(page.Candidates) != 50 {
					t.Fatalf("short page at %d with %d rows", pages, len(page.Candidates))
				}
				break
			}
			if len(page.Candidates) != 100 {
				t.Fatalf("full page with %d rows", len(page.Candidates))
			}
			q.After = page.Next
		}
		if len(seen) != 250 {
			t.Fatalf("saw %d rows", len(seen))
		}
		for i := 1; i < len(seen); i++ {
			p, c := seen[i-1], seen[i]
			if compareKey(p.LastHeartbeatAt, p.RunID, p.TaskID, c.LastHeartbeatAt, c.RunID, c.TaskID) >= 0 {
				t.Fatalf("not oldest first at %d: %v then %v", i, p.Attempt, c.Attempt)
			}
		}
	})
	t.Run("ExactlyFullLastPageThenEmptyShortPage", func(t *testing.T) {
		t.Parallel()
		b := NewBoard()
		for i := range 100 {
			b.PutRunning(fmt.Sprintf("r%03d", i), "t", t0.Add(-time.Hour), t0.Add(-time.Hour))
		}
		page, _ := b.ListCandidates(ctx, running)
		if page.Next == nil {
			t.Fatal("a full page must carry a cursor")
		}
		q := running
		q.After = page.Next
		page, _ = b.ListCandidates(ctx, q)
		if len(page.Candidates) != 0 || page.Next != nil {
			t.Fatalf("page after the last: %+v", page)
		}
	})
	t.Run("HeartbeatAndExecutorFilters", func(t *testing.T) {
		t.Parallel()
		b := NewBoard()
		never := b.PutRunning("r", "never", t0.Add(-time.Hour), time.Time{})
		b.PutRunning("r", "seen", t0.Add(-time.Hour), t0.Add(-time.Hour))
		b.Put(TaskInstance{RunID: "r", TaskID: "kube", State: sdk.StateRunning, Executor: sdk.ExecutorKube, RunningAt: t0.Add(-time.Hour)})
		page, err := b.ListCandidates(ctx, sdk.CandidateQuery{States: []string{sdk.StateRunning}, Executors: []string{sdk.ExecutorLite},
			OrderBy: sdk.FieldRunningAt, OlderThan: t0, Heartbeat: sdk.HeartbeatNever})
		if err != nil || len(page.Candidates) != 1 || page.Candidates[0].Attempt != never {
			t.Fatalf("page %+v err %v", page, err)
		}
	})
	t.Run("PageOverLimitIsOnePage", func(t *testing.T) {
		t.Parallel()
		// As on the real board: a limit above the page size asks for one
		// page (the conformance suite, boardtest, holds both to it).
		q := running
		q.Limit = 101
		if _, err := NewBoard().ListCandidates(ctx, q); err != nil {
			t.Fatal(err)
		}
	})
}

func TestBoardOrphanRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t0 := T0()
	threshold := t0.Add(-5 * time.Minute)
	old := t0.Add(-time.Hour)

	// Each case builds one run "r" whose rows are all older than the
	// threshold, except for what the case changes.
	cases := []struct {
		name   string
		rows   []TaskInstance
		orphan bool
	}{
		{"AllSettled_Orphan", []TaskInstance{{State: sdk.StateSuccess, EndedAt: old}, {State: sdk.StateNone}}, true},
		{"NoneDoesNotKeepRunAlive", []TaskInstance{{State: sdk.StateNone}}, true},
		{"RunningKeepsRunAlive", []TaskInstance{{State: sdk.StateRunning, RunningAt: old}}, false},
		{"ScheduledKeepsRunAlive", []TaskInstance{{State: sdk.StateScheduled}}, false},
		{"ParkedUpForRetry_KeepsRunAlive", []TaskInstance{{State: sdk.StateUpForRetry, EndedAt: old}}, false},
		{"ParkedUpForReschedule_KeepsRunAlive", []TaskInstance{{State: sdk.StateUpForReschedule}}, false},
		{"ParkedDeferred_KeepsRunAlive", []TaskInstance{{State: sdk.StateDeferred}}, false},
		{"ProvisionalInfraMark_KeepsRunAlive", []TaskInstance{{State: sdk.StateFailed, LastFailureKind: sdk.FailureInfra, InfraMarkedAt: old}}, false},
		{"ConfirmedInfraMark_Orphan", []TaskInstance{{State: sdk.StateFailed, LastFailureKind: sdk.FailureInfra, InfraMarkedAt: old, InfraConfirmedAt: old}}, true},
		{"ReleasedAtCountsAsActivity", []TaskInstance{{State: sdk.StateNone, ReleasedAt: t0.Add(-time.Minute)}}, false},
		{"RecentEndCountsAsActivity", []TaskInstance{{State: sdk.StateFailed, LastFailureKind: sdk.FailureTask, EndedAt: t0.Add(-time.Minute)}}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := NewBoard()
			b.PutRun(Run{RunID: "r", StartedAt: old})
			for i, row := range tc.rows {
				row.RunID, row.TaskID = "r", fmt.Sprintf("t%d", i)
				b.Put(row)
			}
			page, err := b.ListOrphanRuns(ctx, sdk.RunQuery{OlderThan: threshold})
			if err != nil {
				t.Fatal(err)
			}
			if got := len(page.Runs) == 1; got != tc.orphan {
				t.Fatalf("listed=%v want %v", got, tc.orphan)
			}
			res, err := b.ReapRun(ctx, sdk.RunReap{RunID: "r", OlderThan: threshold, Term: 1, At: t0})
			if err != nil {
				t.Fatal(err)
			}
			if res.Applied != tc.orphan || !tc.orphan && res.NoopReason != sdk.NoopActive {
				t.Fatalf("reap: %+v", res)
			}
		})
	}

	setup := func() *Board {
		b := NewBoard()
		b.PutRun(Run{RunID: "r", StartedAt: old})
		b.Put(TaskInstance{RunID: "r", TaskID: "done", State: sdk.StateFailed, LastFailureKind: sdk.FailureTask, RunningAt: old, EndedAt: old})
		return b
	}
	t.Run("MovedBetweenListAndReap_Noop", func(t *testing.T) {
		t.Parallel()
		b := setup()
		b.OnReapRun(func(sdk.RunReap) {
			b.Update("r", "done", func(ti *TaskInstance) { ti.State = sdk.StateUpForRetry })
		})
		res, err := b.ReapRun(ctx, sdk.RunReap{RunID: "r", OlderThan: threshold, Term: 1, At: t0})
		if err != nil || res.Applied || res.NoopReason != sdk.NoopActive {
			t.Fatalf("res %+v err %v", res, err)
		}
		if r, _ := b.Run("r"); r.State != sdk.RunRunning {
			t.Fatalf("run state %s", r.State)
		}
	})
	t.Run("LockedRows_Noop", func(t *testing.T) {
		t.Parallel()
		b := setup()
		b.LockRun("r", true)
		res, _ := b.ReapRun(ctx, sdk.RunReap{RunID: "r", OlderThan: threshold, Term: 1, At: t0})
		if res.NoopReason != sdk.NoopLocked {
			t.Fatalf("res %+v", res)
		}
	})
	t.Run("OldTerm_Deposed", func(t *testing.T) {
		t.Parallel()
		b := setup()
		b.SetTerm(3)
		res, _ := b.ReapRun(ctx, sdk.RunReap{RunID: "r", OlderThan: threshold, Term: 2, At: t0})
		if res.NoopReason != sdk.NoopDeposed {
			t.Fatalf("res %+v", res)
		}
	})
	t.Run("AppliedListsAttachedAttempts", func(t *testing.T) {
		t.Parallel()
		b := setup()
		res, _ := b.ReapRun(ctx, sdk.RunReap{RunID: "r", OlderThan: threshold, Term: 1, At: t0, Message: "orphan_run"})
		if !res.Applied || len(res.Attached) != 1 || res.Attached[0].TaskID != "done" {
			t.Fatalf("res %+v", res)
		}
		if r, _ := b.Run("r"); r.State != sdk.RunFailed || !r.EndedAt.Equal(t0) {
			t.Fatalf("run %+v", r)
		}
	})
	t.Run("KeysetPaging", func(t *testing.T) {
		t.Parallel()
		b := NewBoard()
		for i := range 120 {
			b.PutRun(Run{RunID: fmt.Sprintf("r%03d", i), StartedAt: old.Add(time.Duration(i) * time.Second)})
		}
		page, _ := b.ListOrphanRuns(ctx, sdk.RunQuery{OlderThan: threshold})
		if len(page.Runs) != 100 || page.Next == nil || page.Runs[0].RunID != "r000" {
			t.Fatalf("first page: %d runs next=%v", len(page.Runs), page.Next)
		}
		page, _ = b.ListOrphanRuns(ctx, sdk.RunQuery{OlderThan: threshold, After: page.Next})
		if len(page.Runs) != 20 || page.Next != nil || page.Runs[0].RunID != "r100" {
			t.Fatalf("second page: %d runs next=%v", len(page.Runs), page.Next)
		}
	})
}

func TestBoardAppendLog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := NewBoard()
	a := b.PutRunning("r", "t", T0(), T0())
	if err := b.AppendLog(ctx, 1, []sdk.LogLine{{Attempt: a, At: T0(), Line: "one"}}); err != nil {
		t.Fatal(err)
	}
	b.SetTerm(2)
	if err := b.AppendLog(ctx, 1, []sdk.LogLine{{Attempt: a, At: T0(), Line: "deposed"}}); err != nil {
		t.Fatal(err)
	}
	if got := b.Log(a); len(got) != 1 || got[0] != "one" {
		t.Fatalf("log %q", got)
	}
}

func TestExecutions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}
	b := sdk.Attempt{RunID: "r", TaskID: "u", Try: 1}

	t.Run("UnscriptedReadsDefault", func(t *testing.T) {
		t.Parallel()
		e := NewExecutions()
		e.Alive(b)
		got, err := e.Liveness(ctx, sdk.LivenessRequest{Attempts: []sdk.Attempt{a, b}})
		if err != nil || got[0].State != sdk.Dead || got[1].State != sdk.Alive || got[0].Attempt != a {
			t.Fatalf("got %+v err %v", got, err)
		}
		e.SetDefault(sdk.Unknown)
		got, _ = e.Liveness(ctx, sdk.LivenessRequest{Attempts: []sdk.Attempt{a}})
		if got[0].State != sdk.Unknown || len(e.LivenessCalls()) != 2 {
			t.Fatalf("got %+v", got)
		}
	})
	t.Run("StoppedOrphanReadsDead", func(t *testing.T) {
		t.Parallel()
		e := NewExecutions()
		e.Orphaned(a)
		if res, err := e.StopOrphan(ctx, sdk.StopRequest{Attempt: a, Reason: sdk.StopOrphan}); err != nil || !res.Stopped {
			t.Fatalf("stop %+v %v", res, err)
		}
		got, _ := e.Liveness(ctx, sdk.LivenessRequest{Attempts: []sdk.Attempt{a}})
		if got[0].State != sdk.Dead || len(e.Stops()) != 1 {
			t.Fatalf("after stop: %+v", got)
		}
	})
	t.Run("ScriptedFailures", func(t *testing.T) {
		t.Parallel()
		e := NewExecutions()
		e.ScriptStop(a, sdk.StopResult{}, errors.New("EPERM"))
		e.ScriptTeardown(a, nil, errors.New("apiserver down"))
		e.FailLiveness(errors.New("probe failed"))
		if _, err := e.StopOrphan(ctx, sdk.StopRequest{Attempt: a}); err == nil {
			t.Fatal("stop did not fail")
		}
		if _, err := e.Teardown(ctx, sdk.TeardownRequest{Attempt: &a}); err == nil {
			t.Fatal("teardown did not fail")
		}
		if _, err := e.Liveness(ctx, sdk.LivenessRequest{Attempts: []sdk.Attempt{a}}); err == nil {
			t.Fatal("liveness did not fail")
		}
		out, err := e.Teardown(ctx, sdk.TeardownRequest{RunID: "r"})
		if err != nil || len(out) != 1 || out[0].Action != sdk.TeardownDeleted || e.Actions() != 3 {
			t.Fatalf("default run teardown %+v %v", out, err)
		}
	})
}

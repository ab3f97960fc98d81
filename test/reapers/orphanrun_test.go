package reapers_test

import (
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/plugins/orphanrun"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// TestOrphanRunOnLite drives the real orphanrun plugin through the host: a
// running run with nothing live and no activity for orphan_run is failed
// (the run only: its task instances keep what they hold, and the old
// attempts still attached to it are told to terminate); a run with a live,
// parked or held task instance, or with a recent release, is left alone;
// and a run whose rows another transaction is writing is re-checked, found
// busy and left for a later cycle.
func TestOrphanRunOnLite(t *testing.T) {
	w := newWorld(t, `reaper "orphanrun" {}`)
	l := ladder.Defaults()
	t0 := w.t0
	open := t0.Add(l.SettlingGrace)
	started := t0.Add(-time.Hour)
	runs := []string{"finished", "lost", "busy", "parked", "released", "held", "locked"}
	a := map[string]sdk.Attempt{}
	for _, run := range runs {
		w.createRun(run, started, "task")
		a[run] = first(run, "task")
	}

	// finished: a real agent ran its task to success; the scheduler never
	// finalized the run.
	w.queue(a["finished"], t0)
	done := w.spawnCommand(a["finished"], w.api, "true")
	select {
	case <-done.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("the agent of a task that exits at once did not finish")
	}
	if ti := w.ti(a["finished"]); ti.State != sdk.StateSuccess {
		t.Fatalf("finished: the agent left the attempt %s, want success", ti.State)
	}
	w.stamp(a["finished"], stamps{queued: at(t0.Add(-12 * time.Minute)), running: at(t0.Add(-11 * time.Minute)),
		ended: at(t0.Add(-10 * time.Minute))})

	// lost: a real agent and its group were killed -9, and agentlost failed
	// the attempt on the infra rail (confirmed, as on Lite); its infra
	// budget is spent, so nothing will re-place it.
	w.queue(a["lost"], t0)
	lost := w.spawn(a["lost"], w.api)
	w.awaitTask(lost)
	w.killAgent(lost)
	w.killGroup(lost)
	w.stamp(a["lost"], stamps{queued: at(t0.Add(-22 * time.Minute)), running: at(t0.Add(-21 * time.Minute)),
		heartbeat: at(t0.Add(-20 * time.Minute))})
	w.markAgentLost(a["lost"], t0.Add(-15*time.Minute), false)
	w.spendInfraBudget("lost")

	// busy: a real agent is running its task and heartbeating.
	w.queue(a["busy"], t0)
	busy := w.spawn(a["busy"], w.api)
	w.awaitTask(busy)
	w.stamp(a["busy"], stamps{queued: at(t0.Add(-31 * time.Minute)), running: at(t0.Add(-30 * time.Minute)),
		heartbeat: at(t0.Add(-5 * time.Second))})

	// parked: the task failed with a retry left and waits in up_for_retry,
	// which stamps no fresh activity.
	w.drive(a["parked"], t0.Add(-50*time.Minute), lifecycle.TerminalReport{State: sdk.StateUpForRetry, Reason: "exit_code",
		Message: "exit_code: task exited with code 1"})

	// released: the task failed long ago and is retried between two cycles
	// (below): its release is fresh activity.
	w.drive(a["released"], t0.Add(-50*time.Minute), lifecycle.TerminalReport{State: sdk.StateFailed, Reason: "exit_code",
		Message: "exit_code: task exited with code 1"})

	// held: a reaper failed the attempt and held it for an operator.
	w.drive(a["held"], t0.Add(-50*time.Minute), lifecycle.TerminalReport{})
	w.markAgentLost(a["held"], t0.Add(-40*time.Minute), true)

	// locked: settled long ago, but another transaction is writing its
	// task instance when the reaper comes.
	w.drive(a["locked"], t0.Add(-20*time.Minute), lifecycle.TerminalReport{State: sdk.StateSuccess})

	before := map[string]board.TaskInstance{}
	for _, run := range []string{"finished", "lost", "parked", "held", "locked"} {
		before[run] = w.ti(a[run])
	}

	c1 := w.runCycle()
	w.advance(100 * time.Second)
	if rel, err := w.w.Retry(w.ctx, a["released"], w.now()); err != nil || !rel.Applied {
		t.Fatalf("retry: %+v %v", rel, err)
	}
	a["released"] = sdk.Attempt{RunID: "released", TaskID: "task", Try: 2}
	before["released"] = w.ti(a["released"])
	w.advance(l.SettlingGrace - 100*time.Second)
	if w.beat(a["busy"], w.now().Add(-5*time.Second)) {
		t.Fatal("busy: a live attempt's heartbeat was answered should_terminate")
	}
	tx, err := w.pool.Begin(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(w.ctx, "SELECT 1 FROM task_instances WHERE run_id = 'locked' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	c2 := w.runCycle()
	if err := tx.Rollback(w.ctx); err != nil {
		t.Fatal(err)
	}
	w.advance(l.MaintenanceInterval)
	if w.beat(a["busy"], w.now().Add(-5*time.Second)) {
		t.Fatal("busy: a live attempt's heartbeat was answered should_terminate")
	}
	c3 := w.runCycle()

	const r = orphanrun.Name
	t.Run("SettlingGrace_HoldsTheFirstCycle", func(t *testing.T) { w.expectGateOpened(t, c1, c2, open) })

	t.Run("QuietRunsReaped_BusyOneReCheckedAndLeft", func(t *testing.T) {
		w.expectCycle(t, "second cycle", c2,
			verdict{r, sdk.LabelOrphanRun, "finished", true},
			verdict{r, sdk.LabelOrphanRun, "lost", true},
			verdict{r, sdk.LabelOrphanReapNoop, "locked", false},
		)
		if got := decisionOf(t, c2, sdk.LabelOrphanReapNoop, "locked").Evidence[evNoopReason]; got != sdk.NoopLocked {
			t.Errorf("no-op reason %q, want %q", got, sdk.NoopLocked)
		}
		w.expectCycle(t, "third cycle", c3, verdict{r, sdk.LabelOrphanRun, "locked", true})
	})

	t.Run("DecisionsMetered", func(t *testing.T) {
		expectCounts(t, w.metered(t), map[string]int{
			sdk.LabelSettlingSkip:   1,
			sdk.LabelOrphanRun:      3,
			sdk.LabelOrphanReapNoop: 1,
		})
	})

	t.Run("NothingLiveAndQuiet_RunFailedTaskInstancesKept", func(t *testing.T) {
		for run, when := range map[string]time.Time{"finished": open, "lost": open, "locked": open.Add(l.MaintenanceInterval)} {
			got := w.run(run)
			if got.State != sdk.RunFailed || !got.EndedAt.Equal(when) || !strings.HasPrefix(got.ErrorMessage, sdk.LabelOrphanRun+": ") {
				t.Errorf("run %s: %s ended %s %q; want failed at %s as orphan_run", run, got.State, got.EndedAt, got.ErrorMessage, when)
			}
			w.expectUntouched(t, before[run])
		}
		if got := decisionOf(t, c2, sdk.LabelOrphanRun, "lost").Evidence[evAttached]; got != "1" {
			t.Errorf("lost: %s attempts attached, want 1", got)
		}
		if got := decisionOf(t, c2, sdk.LabelOrphanRun, "finished").Evidence[evAttached]; got != "0" {
			t.Errorf("finished: %s attempts attached, want 0", got)
		}
	})

	t.Run("LiveParkedHeldOrRecentlyReleased_RunLeftAlone", func(t *testing.T) {
		for _, run := range []string{"busy", "parked", "released", "held"} {
			if got := w.run(run); got.State != sdk.RunRunning {
				t.Errorf("run %s: %s, want running", run, got.State)
			}
		}
		for _, run := range []string{"parked", "released", "held"} {
			w.expectUntouched(t, before[run])
		}
		if ti := w.ti(a["busy"]); ti.State != sdk.StateRunning || !busy.alive() || !busy.groupRunning(t) || w.stopSignalled(busy) {
			t.Errorf("busy: attempt %s, agent alive %v: a live attempt was touched", ti.State, busy.alive())
		}
		if w.beat(a["busy"], w.now()) {
			t.Error("busy: a live attempt was told to terminate")
		}
	})

	t.Run("AttachedAttempts_AnsweredShouldTerminateChangeNothing", func(t *testing.T) {
		for _, run := range []string{"finished", "lost"} {
			w.expectStaleReportsRefused(t, a[run])
		}
	})
}

// drive takes a fresh attempt through queued and running to the outcome,
// all at chosen times: queued at from, running a minute later, and the
// outcome (if any) a minute after that. A zero outcome leaves it running.
func (w *world) drive(a sdk.Attempt, from time.Time, o lifecycle.TerminalReport) {
	w.t.Helper()
	w.queue(a, from)
	if stop, err := w.w.Running(w.ctx, a, from.Add(time.Minute)); err != nil || stop {
		w.t.Fatalf("running %s: stop=%v err=%v", a, stop, err)
	}
	if o.State == "" {
		return
	}
	if stop, err := w.w.Report(w.ctx, a, o, from.Add(2*time.Minute)); err != nil || stop {
		w.t.Fatalf("report %s: stop=%v err=%v", a, stop, err)
	}
}

// markAgentLost fails a running attempt the way agentlost does on Lite,
// through the board's guarded mark under the test's term.
func (w *world) markAgentLost(a sdk.Attempt, when time.Time, hold bool) {
	w.t.Helper()
	res, err := w.store.Mark(w.ctx, []sdk.Mark{{
		Attempt: a, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
		Reason: sdk.LabelAgentLost, Message: "agent_lost: agent and task group gone",
		Confirm: true, Hold: hold, Term: w.term, At: when,
	}})
	if err != nil || len(res) != 1 || !res[0].Applied {
		w.t.Fatalf("mark %s: %+v %v", a, res, err)
	}
	// agentlost audits what it marks; a mark with no decision would be
	// audited by the host when the next term's gate opens (a leader lost
	// between its mark and its audit), which is not this test's story.
	if err := w.store.RecordDecisions(w.ctx, w.term, when, []sdk.Decision{{Reaper: "agentlost", Label: sdk.LabelAgentLost,
		Attempt: a, Applied: true, Detail: "agent and task group gone"}}); err != nil {
		w.t.Fatalf("audit the mark of %s: %v", a, err)
	}
}

// spendInfraBudget leaves the run's task instances no infra re-place: an
// infra failure of theirs is final, so it no longer keeps the run alive.
func (w *world) spendInfraBudget(runID string) {
	w.t.Helper()
	if _, err := w.pool.Exec(w.ctx, "UPDATE task_instances SET infra_used = infra_budget WHERE run_id = $1", runID); err != nil {
		w.t.Fatalf("spend the infra budget of %s: %v", runID, err)
	}
}

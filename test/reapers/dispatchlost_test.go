package reapers_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/plugins/dispatchlost"
	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// TestDispatchLostOnLite drives the real dispatchlost plugin, configured to
// hold what it fails, through the host over real agents: a queued attempt
// overdue past dispatch_lost is failed only when nothing of it runs (an
// orphaned task group is stopped first); an agent still alive defers; an
// attempt queued recently, or with no queued_at at all, is never judged.
func TestDispatchLostOnLite(t *testing.T) {
	w := newWorld(t, `reaper "dispatchlost" {
  policy = "hold"
}`)
	l := ladder.Defaults()
	t0 := w.t0
	open := t0.Add(l.SettlingGrace)
	overdue := t0.Add(-10 * time.Minute)

	const runID = "dispatchlost"
	tasks := []string{"killed_before_running", "alive_unreported", "orphaned", "never_spawned",
		"queued_recently", "no_queued_at"}
	w.createRun(runID, t0.Add(-time.Hour), tasks...)
	a := map[string]sdk.Attempt{}
	for _, task := range tasks {
		a[task] = first(runID, task)
	}
	for _, task := range []string{"killed_before_running", "alive_unreported", "orphaned", "never_spawned", "no_queued_at"} {
		w.queue(a[task], overdue)
	}
	// A row without queued_at is too poorly observed to judge.
	w.stamp(a["no_queued_at"], stamps{})

	// Two agents that cannot reach the board keep retrying their RUNNING
	// report, so their attempts stay queued: one is then killed -9, the
	// other stays alive.
	p := map[string]*agentProc{}
	p["killed_before_running"] = w.spawn(a["killed_before_running"], unreachable(t))
	p["alive_unreported"] = w.spawn(a["alive_unreported"], unreachable(t))
	w.killAgent(p["killed_before_running"])

	// An agent whose RUNNING report landed on another board (standing in
	// for a report this board never got) starts its task there; this board
	// still shows the attempt queued. Its agent is then killed -9 and its
	// task group runs on, orphaned.
	stale := staleBoard(t, runID, "orphaned")
	p["orphaned"] = w.spawn(a["orphaned"], stale)
	w.awaitTask(p["orphaned"])
	w.killAgent(p["orphaned"])

	before := map[string]board.TaskInstance{}
	for _, task := range []string{"alive_unreported", "no_queued_at"} {
		before[task] = w.ti(a[task])
	}

	c1 := w.runCycle()
	// A dispatch made between the cycles, a minute before the gate opens.
	w.advance(l.SettlingGrace - time.Minute)
	w.queue(a["queued_recently"], w.now())
	before["queued_recently"] = w.ti(a["queued_recently"])
	w.advance(time.Minute)
	orphanWatch := w.watchMark(p["orphaned"], sdk.StateQueued)
	c2 := w.runCycle()
	orphanWatch.stop()
	w.advance(l.MaintenanceInterval)
	c3 := w.runCycle()

	const r = dispatchlost.Name
	t.Run("SettlingGrace_HoldsTheFirstCycle", func(t *testing.T) { w.expectGateOpened(t, c1, c2, open) })

	t.Run("OverdueAttemptsJudged_ReturnedAndAudited", func(t *testing.T) {
		w.expectCycle(t, "second cycle", c2,
			verdict{r, sdk.LabelDispatchLost, "killed_before_running", true},
			verdict{r, sdk.LabelDispatchLostProcessAlive, "alive_unreported", false},
			verdict{r, sdk.LabelDispatchLostOrphanStopped, "orphaned", true},
			verdict{r, sdk.LabelDispatchLost, "never_spawned", true},
		)
		w.expectCycle(t, "third cycle", c3,
			verdict{r, sdk.LabelDispatchLostProcessAlive, "alive_unreported", false},
		)
	})

	t.Run("DecisionsMetered", func(t *testing.T) {
		expectCounts(t, w.metered(t), map[string]int{
			sdk.LabelSettlingSkip:              1,
			sdk.LabelDispatchLost:              2,
			sdk.LabelDispatchLostProcessAlive:  2,
			sdk.LabelDispatchLostOrphanStopped: 1,
		})
	})

	t.Run("AgentKilledBeforeRunning_MarkedHeld", func(t *testing.T) {
		w.expectSettled(t, a["killed_before_running"], infraMark(sdk.LabelDispatchLost, open, true))
		d := decisionOf(t, c2, sdk.LabelDispatchLost, "killed_before_running")
		if d.Evidence[evLiveness] != string(sdk.Dead) || d.Evidence[evPolicy] != "hold" {
			t.Errorf("evidence %v; want liveness dead under the hold policy", d.Evidence)
		}
	})

	t.Run("NoAgentRecord_ReadsDeadMarkedHeld", func(t *testing.T) {
		w.expectSettled(t, a["never_spawned"], infraMark(sdk.LabelDispatchLost, open, true))
	})

	t.Run("HeldAttempt_NotReplacedUntilReleased", func(t *testing.T) {
		rel, err := w.w.Replace(w.ctx, a["never_spawned"], w.now())
		if err != nil {
			t.Fatal(err)
		}
		if rel.Applied || rel.Reason != lifecycle.ReasonHeld {
			t.Errorf("re-place of a held attempt: %+v; want refused as held", rel)
		}
	})

	t.Run("OrphanedGroup_StoppedBeforeTheMark", func(t *testing.T) {
		w.expectSettled(t, a["orphaned"], infraMark(sdk.LabelDispatchLost, open, true))
		if orphanWatch.watchErr != nil || !orphanWatch.sawMark {
			t.Fatalf("the mark was not observed (err %v)", orphanWatch.watchErr)
		}
		if orphanWatch.groupAtMark {
			t.Error("the orphaned group still ran when the attempt was marked")
		}
		if !w.stopSignalled(p["orphaned"]) || p["orphaned"].groupRunning(t) {
			t.Error("the orphaned group was not stopped with SIGTERM, or runs on")
		}
		d := decisionOf(t, c2, sdk.LabelDispatchLostOrphanStopped, "orphaned")
		if !strings.HasPrefix(d.Evidence[evStop], "stopped: ") {
			t.Errorf("stop evidence %q; want stopped", d.Evidence[evStop])
		}
	})

	t.Run("AgentAlive_DefersAndIsUntouched", func(t *testing.T) {
		w.expectUntouched(t, before["alive_unreported"])
		if !p["alive_unreported"].alive() {
			t.Error("the live agent was stopped")
		}
	})

	t.Run("QueuedWithinTheThreshold_NeverJudged", func(t *testing.T) {
		w.expectUntouched(t, before["queued_recently"])
	})

	t.Run("NoQueuedAt_NeverJudged", func(t *testing.T) {
		w.expectUntouched(t, before["no_queued_at"])
	})

	t.Run("StaleAgentReports_AnsweredShouldTerminateChangeNothing", func(t *testing.T) {
		for _, task := range []string{"killed_before_running", "orphaned", "never_spawned"} {
			w.expectStaleReportsRefused(t, a[task])
		}
	})
}

// staleBoard makes a second board holding the named tasks of the run,
// queued, with an attempt API of its own, and returns what mints for that
// API: an agent reporting there starts its task while the board the host
// reads never hears of it.
func staleBoard(t *testing.T, runID string, taskIDs ...string) attempttoken.Issuer {
	t.Helper()
	dsn := pgtest.NewDSN(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	wr := lifecycle.New(pool, lifecycle.Options{})
	now := time.Now()
	createRunOn(t, wr, runID, now, taskIDs...)
	for _, id := range taskIDs {
		queueOn(t, wr, first(runID, id), now)
	}
	return attemptapitest.Start(t, wr, attemptapitest.Options{}).Issuer
}

// An agent that could never reach the attempt API gives up once its
// pre-start retry has run out (shortened to a second here; the agent's own
// tests prove the 2 minutes on a fake clock), runs nothing and reports
// nothing, so its attempt stays queued. On Lite that is the dispatch-lost
// reaper's: once the agent is gone it marks the attempt dispatch_lost on
// the infra rail, confirmed as it is made, with the task's retries
// untouched, and the infra re-place rail starts the task over on a new
// epoch.
func TestAgentThatNeverReachedTheAttemptAPI_DispatchLostSettlesItOnTheInfraRailAndItIsReplaced(t *testing.T) {
	w := newWorld(t, `reaper "dispatchlost" {}`)
	l := ladder.Defaults()
	const runID = "unreached"
	w.createRun(runID, w.t0.Add(-time.Hour), "task")
	a := first(runID, "task")
	w.queue(a, w.t0.Add(-10*time.Minute))

	p := w.spawnWith(a, unreachable(t), `touch "$WORK/ran"`, time.Second)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not give up on the unreachable attempt API")
	}
	if _, err := os.Stat(filepath.Join(w.work, "ran")); err == nil {
		t.Fatal("the task ran although its agent never reported RUNNING")
	}
	if ti := w.ti(a); ti.State != sdk.StateQueued {
		t.Fatalf("the unreported attempt is %s, want still queued", ti.State)
	}

	w.runCycle() // the settling gate holds the first cycle
	w.advance(l.SettlingGrace)
	open := w.now()
	res := w.runCycle()
	w.expectCycle(t, "the cycle after the gate", res, verdict{dispatchlost.Name, sdk.LabelDispatchLost, "task", true})
	w.expectSettled(t, a, infraMark(sdk.LabelDispatchLost, open, false))
	ti := w.ti(a)
	if !strings.HasPrefix(ti.ErrorMessage, sdk.LabelDispatchLost+": ") || ti.Retries != 1 {
		t.Fatalf("row %q with %d retries; want a dispatch_lost message and the retry unspent", ti.ErrorMessage, ti.Retries)
	}

	rel, err := w.w.Replace(w.ctx, a, w.now())
	if err != nil {
		t.Fatal(err)
	}
	if want := (sdk.Attempt{RunID: runID, TaskID: "task", Try: 1, Epoch: 1}); !rel.Applied || rel.Attempt != want {
		t.Fatalf("the re-place: %+v; want the task started over as %s", rel, want)
	}
	if ti := w.ti(rel.Attempt); ti.State != sdk.StateNone || ti.Retries != 1 || ti.InfraUsed != 1 {
		t.Fatalf("the re-placed row: %s, %d retries, %d infra used; want none, 1, 1", ti.State, ti.Retries, ti.InfraUsed)
	}
}

package reapers_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/internal/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/internal/attempttoken"
	"github.com/dexaflow/reaper/internal/pgtest"
	"github.com/dexaflow/reaper/plugins/dispatchlost"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
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
	t.Run("SettlingGrace_HoldsTheFirstCycle", func(t *testing.T) {
		w.expectCycle(t, "first cycle", c1, verdict{"gate", sdk.LabelSettlingSkip, "", false})
		if !c2.Started.Equal(open) || !c2.Gate.Open {
			t.Errorf("second cycle at %s: gate %+v; want open at %s", c2.Started, c2.Gate, open)
		}
	})

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

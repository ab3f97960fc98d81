package reapers_test

import (
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/plugins/agentlost"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// TestAgentLostOnLite drives the real agentlost plugin through the host
// over real agents: it fails a running attempt only once its agent and task
// group are provably gone (stopping an orphaned group first), waits for
// anything alive, ends an attempt that outlived the credential ceiling, and
// leaves every live attempt alone.
func TestAgentLostOnLite(t *testing.T) {
	w := newWorld(t, `reaper "agentlost" {}`)
	l := ladder.Defaults()
	t0 := w.t0
	open := t0.Add(l.SettlingGrace) // the first cycle the settling gate lets through

	const runID = "agentlost"
	tasks := []string{
		"dead", "orphaned", "alive_silent", "alive_fresh", "never_heartbeated_dead",
		"never_heartbeated_orphaned", "ceiling_alive", "silent_past_ceiling", "silent_before_ceiling",
	}
	w.createRun(runID, t0.Add(-3*time.Hour), tasks...)
	a := map[string]sdk.Attempt{}
	p := map[string]*agentProc{}
	for _, task := range tasks {
		a[task] = first(runID, task)
		w.queue(a[task], t0.Add(-3*time.Hour))
		p[task] = w.spawn(a[task], w.api)
	}
	for _, task := range tasks {
		w.awaitTask(p[task]) // RUNNING reported, task group recorded
	}

	// kill -9: the agent alone (its group runs on, orphaned), or the agent
	// and then its group (nothing left). The agent goes first so that it
	// cannot report its task's death.
	for _, task := range []string{"dead", "never_heartbeated_dead", "silent_past_ceiling", "silent_before_ceiling"} {
		w.killAgent(p[task])
		w.killGroup(p[task])
	}
	for _, task := range []string{"orphaned", "never_heartbeated_orphaned"} {
		w.killAgent(p[task])
	}

	// Place every attempt relative to the fake clock. Silent ones last
	// heartbeated five minutes before the first cycle; the ceiling ones
	// entered running two hours before it.
	longAgo := t0.Add(-10 * time.Minute)
	silentSince := t0.Add(-5 * time.Minute)
	ceilingRun := t0.Add(-2 * time.Hour)
	for task, s := range map[string]stamps{
		"dead":                       {running: at(longAgo), heartbeat: at(silentSince)},
		"orphaned":                   {running: at(longAgo), heartbeat: at(silentSince)},
		"alive_silent":               {running: at(longAgo), heartbeat: at(silentSince)},
		"alive_fresh":                {running: at(longAgo)},
		"never_heartbeated_dead":     {running: at(longAgo)},
		"never_heartbeated_orphaned": {running: at(longAgo)},
		"ceiling_alive":              {running: at(ceilingRun)},
		// Its last heartbeat came 59m45s into running: past the ceiling
		// less two heartbeat intervals, so its silence is the ceiling's.
		"silent_past_ceiling": {running: at(ceilingRun), heartbeat: at(ceilingRun.Add(l.CredentialCeiling - 15*time.Second))},
		// It went silent half an hour into running: a lost agent, however
		// late the reaper gets to it.
		"silent_before_ceiling": {running: at(ceilingRun), heartbeat: at(ceilingRun.Add(30 * time.Minute))},
	} {
		s.queued = at(s.running.Add(-time.Minute))
		w.stamp(a[task], s)
	}
	// The live agents' heartbeats arrive just before each cycle (the agents
	// are told to beat hourly, so every heartbeat the reaper sees is one
	// the scenario placed).
	heartbeats := func(tasks ...string) {
		for _, task := range tasks {
			if w.beat(a[task], w.now().Add(-5*time.Second)) {
				t.Fatalf("%s: a live attempt's heartbeat was answered should_terminate", task)
			}
		}
	}
	untouched := map[string]bool{"alive_silent": true, "never_heartbeated_orphaned": true}
	before := map[string]board.TaskInstance{}
	for task := range untouched {
		before[task] = w.ti(a[task])
	}

	heartbeats("alive_fresh", "ceiling_alive")
	c1 := w.runCycle()
	w.advance(l.SettlingGrace)
	heartbeats("alive_fresh", "ceiling_alive")
	orphanWatch := w.watchMark(p["orphaned"], sdk.StateRunning)
	c2 := w.runCycle()
	orphanWatch.stop()
	w.advance(l.MaintenanceInterval)
	heartbeats("alive_fresh")
	c3 := w.runCycle()

	const r = agentlost.Name
	t.Run("SettlingGrace_HoldsTheFirstCycle", func(t *testing.T) {
		if c1.Gate.Open || len(c1.Reaped) != 0 {
			t.Errorf("first cycle: gate open=%v, reapers run %v; want held, none", c1.Gate.Open, c1.Reaped)
		}
		w.expectCycle(t, "first cycle", c1, verdict{"gate", sdk.LabelSettlingSkip, "", false})
		if !c2.Gate.Open || c2.Gate.Valve || !c2.Started.Equal(open) {
			t.Errorf("second cycle at %s: gate %+v; want settled and open at %s", c2.Started, c2.Gate, open)
		}
	})

	t.Run("EachAttemptJudgedOnce_ReturnedAndAudited", func(t *testing.T) {
		w.expectCycle(t, "second cycle", c2,
			verdict{r, sdk.LabelAgentLost, "dead", true},
			verdict{r, sdk.LabelAgentLostOrphanStopped, "orphaned", true},
			verdict{r, sdk.LabelAgentLostProcessAlive, "alive_silent", false},
			verdict{r, sdk.LabelAgentLostNeverHeartbeated, "never_heartbeated_dead", true},
			verdict{r, sdk.LabelAgentLostNeverHeartbeatedProcessAlive, "never_heartbeated_orphaned", false},
			verdict{r, sdk.LabelCredentialCeiling, "ceiling_alive", true},
			verdict{r, sdk.LabelCredentialCeiling, "silent_past_ceiling", true},
			verdict{r, sdk.LabelAgentLost, "silent_before_ceiling", true},
		)
		// Once reaped, an attempt is no longer a candidate; what lives is
		// judged again, and deferred again.
		w.expectCycle(t, "third cycle", c3,
			verdict{r, sdk.LabelAgentLostProcessAlive, "alive_silent", false},
			verdict{r, sdk.LabelAgentLostNeverHeartbeatedProcessAlive, "never_heartbeated_orphaned", false},
		)
	})

	t.Run("DecisionsMetered", func(t *testing.T) {
		want := map[string]int{
			sdk.LabelSettlingSkip:                          1,
			sdk.LabelAgentLost:                             2,
			sdk.LabelAgentLostOrphanStopped:                1,
			sdk.LabelAgentLostProcessAlive:                 2,
			sdk.LabelAgentLostNeverHeartbeated:             1,
			sdk.LabelAgentLostNeverHeartbeatedProcessAlive: 2,
			sdk.LabelCredentialCeiling:                     2,
		}
		expectCounts(t, w.metered(t), want)
	})

	t.Run("AgentAndGroupDead_MarkedAgentLostAndConfirmed", func(t *testing.T) {
		w.expectSettled(t, a["dead"], infraMark(sdk.LabelAgentLost, open, false))
		d := decisionOf(t, c2, sdk.LabelAgentLost, "dead")
		if d.Evidence[evLiveness] != string(sdk.Dead) || d.Evidence[evSignal] != "positive" {
			t.Errorf("evidence %v; want liveness dead, a positive signal", d.Evidence)
		}
	})

	t.Run("OrphanedGroup_StoppedBeforeTheMark", func(t *testing.T) {
		w.expectSettled(t, a["orphaned"], infraMark(sdk.LabelAgentLost, open, false))
		if orphanWatch.watchErr != nil || !orphanWatch.sawMark {
			t.Fatalf("the mark was not observed (err %v)", orphanWatch.watchErr)
		}
		if orphanWatch.groupAtMark {
			t.Error("the orphaned group still ran when the attempt was marked")
		}
		if !w.stopSignalled(p["orphaned"]) || p["orphaned"].groupRunning(t) {
			t.Error("the orphaned group was not stopped with SIGTERM, or runs on")
		}
		d := decisionOf(t, c2, sdk.LabelAgentLostOrphanStopped, "orphaned")
		if !strings.HasPrefix(d.Evidence[evStop], "stopped: ") || d.Evidence[evOrphan] != "true" {
			t.Errorf("evidence %v; want an orphan, stopped", d.Evidence)
		}
	})

	t.Run("AliveButSilent_DefersAndIsUntouched", func(t *testing.T) {
		w.expectUntouched(t, before["alive_silent"])
		if !p["alive_silent"].alive() || !p["alive_silent"].groupRunning(t) || w.stopSignalled(p["alive_silent"]) {
			t.Error("the live agent or its task was stopped")
		}
	})

	t.Run("FreshHeartbeat_NeverJudged", func(t *testing.T) {
		got := w.ti(a["alive_fresh"])
		if got.State != sdk.StateRunning || got.LastFailureKind != "" || !got.LastHeartbeatAt.Equal(c3.Started.Add(-5*time.Second)) {
			t.Errorf("alive_fresh: %+v; want running with the heartbeat of the last cycle", settledOf(got))
		}
		if !p["alive_fresh"].alive() || !p["alive_fresh"].groupRunning(t) || w.stopSignalled(p["alive_fresh"]) {
			t.Error("the live agent or its task was stopped")
		}
	})

	t.Run("NeverHeartbeatedAndDead_MarkedNeverHeartbeated", func(t *testing.T) {
		w.expectSettled(t, a["never_heartbeated_dead"], infraMark(sdk.LabelAgentLost, open, false))
	})

	t.Run("NeverHeartbeatedOrphan_WaitedForNeverStopped", func(t *testing.T) {
		w.expectUntouched(t, before["never_heartbeated_orphaned"])
		if !p["never_heartbeated_orphaned"].groupRunning(t) || w.stopSignalled(p["never_heartbeated_orphaned"]) {
			t.Error("the orphaned group of an attempt that never heartbeated was stopped")
		}
	})

	t.Run("AlivePastTheCeiling_MarkedThenStoppedKillLoggedLast", func(t *testing.T) {
		ap := p["ceiling_alive"]
		select {
		case <-ap.exited:
		case <-time.After(15 * time.Second):
			t.Fatal("the agent of the attempt ended at the ceiling did not exit")
		}
		// The agent's own report of its task's end came after the mark and
		// changed nothing.
		w.expectSettled(t, a["ceiling_alive"], taskFailure(sdk.LabelCredentialCeiling, open))
		if !w.stopSignalled(ap) || ap.groupRunning(t) {
			t.Error("the task group was not stopped with SIGTERM, or runs on")
		}
		lines, err := w.store.AttemptLog(w.ctx, runID, "ceiling_alive")
		if err != nil {
			t.Fatal(err)
		}
		if len(lines) == 0 || lines[len(lines)-1].Line != agentlost.KilledLine {
			t.Errorf("try log %+v; want %q as its last line", lines, agentlost.KilledLine)
		}
		d := decisionOf(t, c2, sdk.LabelCredentialCeiling, "ceiling_alive")
		if !strings.Contains(d.Evidence[evStop], "agent exited") {
			t.Errorf("stop evidence %q; want the agent seen exiting", d.Evidence[evStop])
		}
	})

	t.Run("SilentPastTheCeiling_TaskFailureNotInfra", func(t *testing.T) {
		w.expectSettled(t, a["silent_past_ceiling"], taskFailure(sdk.LabelCredentialCeiling, open))
	})

	t.Run("SilentBeforeTheCeiling_StillAgentLost", func(t *testing.T) {
		w.expectSettled(t, a["silent_before_ceiling"], infraMark(sdk.LabelAgentLost, open, false))
	})

	t.Run("StaleAgentReports_AnsweredShouldTerminateChangeNothing", func(t *testing.T) {
		for _, task := range []string{"dead", "orphaned", "never_heartbeated_dead", "ceiling_alive",
			"silent_past_ceiling", "silent_before_ceiling"} {
			w.expectStaleReportsRefused(t, a[task])
		}
	})
}

// expectCounts fails t unless the counted decision types are exactly want.
func expectCounts(t *testing.T, got, want map[string]int) {
	t.Helper()
	for k, n := range want {
		if got[k] != n {
			t.Errorf("dexaflow_scheduler_decisions_total{decision_type=%q} = %d, want %d", k, got[k], n)
		}
	}
	for k, n := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("dexaflow_scheduler_decisions_total{decision_type=%q} = %d, want none", k, n)
		}
	}
}

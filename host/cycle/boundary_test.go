package cycle_test

import (
	"context"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	hostaudit "github.com/dexaflow/reaper/host/audit"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/eventually"
)

// The board is the boundary, not the plugin: a plugin (here a real one,
// over go-plugin, written to misbehave) asks the host's board for writes no
// plugin may make; the board refuses them, nothing is written, and the
// host audits each refusal under its own label, whatever the plugin
// records (these plugins record nothing).
func TestBoardRefusesWhatNoPluginMayWrite(t *testing.T) {
	t.Parallel()

	t.Run("SuccessCannotBeTurnedIntoAConfirmedInfraFailure", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t, "forge_success", nil)
		if stop, err := w.lw.Report(context.Background(), w.attempt, lifecycle.Outcome{State: sdk.StateSuccess},
			t0.Add(-time.Minute)); err != nil || stop {
			t.Fatalf("report success: stop=%v err=%v", stop, err)
		}
		w.loop.RunOnce(context.Background())
		w.state(t, sdk.StateSuccess)
		w.refusal(t, sdk.LabelBoardRefusedSourceState, "mark attempts", sdk.NoopSourceRefused)
	})

	t.Run("MarkOnAFinishedRunIsRefusedAndAudited", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t, "normal", nil)
		if ok, err := w.lw.FinishRun(context.Background(), "run", sdk.RunFailed, "failed elsewhere", t0.Add(-time.Minute)); err != nil || !ok {
			t.Fatalf("finish the run: ok=%v err=%v", ok, err)
		}
		w.loop.RunOnce(context.Background())
		w.state(t, sdk.StateRunning)
		w.refusal(t, sdk.LabelBoardRefusedRunFinished, "mark attempts", sdk.NoopRunFinished)
	})

	t.Run("AppendLogAndMarkAfterThePassClosedAreRefusedAndAudited", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t, "late_write", nil)
		if res := w.loop.RunOnce(context.Background()); len(res.Reaped) != 1 {
			t.Fatalf("the pass did not complete: %+v", res)
		}
		// The plugin writes on after its pass returned: a real process,
		// waited for with a bound.
		if !eventually.Until(20*time.Second, func() bool {
			return w.hasRefusal(t, sdk.LabelBoardRefusedPassClosed, "mark attempts")
		}, eventually.Every(20*time.Millisecond)) {
			t.Fatal("the late mark was never refused and audited")
		}
		w.refusal(t, sdk.LabelBoardRefusedPassClosed, "append try log lines", sdk.NoopPassClosed)
		w.refusal(t, sdk.LabelBoardRefusedPassClosed, "mark attempts", sdk.NoopPassClosed)
		w.state(t, sdk.StateRunning)
	})
}

// A reply larger than the host takes (the world's loader keeps the default
// cap; the plugin answers with more) is refused unread: the cycle records
// plugin_reply_too_large and goes on, and so does the next one.
func TestOversizedReplyIsADecisionAndTheLoopGoesOn(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "big_reply", nil)
	for cycle := range 2 {
		res := w.loop.RunOnce(context.Background())
		found := false
		for _, d := range res.Decisions {
			found = found || (d.Label == sdk.LabelPluginReplyTooLarge && d.Reaper == "agentlost")
		}
		if !found {
			t.Fatalf("cycle %d: no %s decision: %+v", cycle, sdk.LabelPluginReplyTooLarge, res.Decisions)
		}
	}
	w.state(t, sdk.StateRunning)
}

// state asserts the attempt's state on the board.
func (w *world) state(t *testing.T, want string) {
	t.Helper()
	ti, err := w.store.TaskInstance(context.Background(), "run", "task")
	if err != nil {
		t.Fatal(err)
	}
	if ti.State != want || ti.LastFailureKind != "" {
		t.Fatalf("the attempt is %s (failure kind %q), want %s untouched", ti.State, ti.LastFailureKind, want)
	}
}

func (w *world) hasRefusal(t *testing.T, label, write string) bool {
	t.Helper()
	recs, err := w.store.DecisionsFor(context.Background(), "run", "task", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Label == label && r.Evidence[hostaudit.EvWrite] == write {
			return true
		}
	}
	return false
}

// refusal asserts the audit holds the host's refusal of the plugin's
// write: its label, not applied, the plugin's name, the reason.
func (w *world) refusal(t *testing.T, label, write, reason string) {
	t.Helper()
	recs, err := w.store.DecisionsFor(context.Background(), "run", "task", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Label != label || r.Evidence[hostaudit.EvWrite] != write {
			continue
		}
		if r.Applied || r.Reaper != "agentlost" || r.Evidence[hostaudit.EvRefusal] != reason {
			t.Fatalf("refusal audited as %+v, want not applied, by agentlost, for %q", r, reason)
		}
		return
	}
	t.Fatalf("no %s decision for %q in the audit: %+v", label, write, recs)
}

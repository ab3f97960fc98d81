package cycle_test

import (
	"context"
	"strings"
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

	t.Run("SuccessCannotBeTurnedIntoAnInfraFailure", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t, "forge_success", nil)
		if stop, err := w.lw.Report(context.Background(), w.attempt, lifecycle.TerminalReport{State: sdk.StateSuccess},
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

	// The host fences a write at its own clock: a mark the plugin dates an
	// hour before its pass (past the confirmation valve, as if the attempt
	// had long been marked) is refused whole.
	t.Run("ABackdatedMarkIsRefusedAndAudited", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t, "backdate", nil)
		w.overreach(t, sdk.LabelBoardRefusedFenceTime)
		w.refusal(t, sdk.LabelBoardRefusedFenceTime, "mark attempts", sdk.NoopTimeRefused)
		if ev := w.decisionOf(t, sdk.LabelBoardRefusedFenceTime).Evidence; ev[hostaudit.EvAt] != t0.Add(-time.Hour).Format(time.RFC3339Nano) {
			t.Fatalf("the refusal's evidence %v does not name the asked time", ev)
		}
	})

	// Confirmation is the sweep's word: a reaper's mark that asks to be
	// confirmed as it is made is refused whole.
	t.Run("AMarkThatConfirmsItselfIsRefusedAndAudited", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t, "confirm", nil)
		w.overreach(t, sdk.LabelBoardRefusedConfirm)
		w.refusal(t, sdk.LabelBoardRefusedConfirm, "mark attempts", sdk.NoopConfirmRefused)
	})

	// The host names the reaper a decision is audited under: one filed
	// under another reaper's name is not audited under it.
	t.Run("ADecisionUnderAnotherReapersNameIsRefusedAndAudited", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t, "foreign_name", nil)
		w.overreach(t, sdk.LabelBoardRefusedForeignReaper)
		d := w.decisionOf(t, sdk.LabelBoardRefusedForeignReaper)
		if d.Evidence[hostaudit.EvAskedReaper] != "podlost" || d.Evidence[hostaudit.EvAskedLabel] != sdk.LabelAgentLostProcessAlive {
			t.Fatalf("the refusal's evidence %v does not say what was asked", d.Evidence)
		}
		if n := w.metered(t, sdk.LabelAgentLostProcessAlive); n != 0 {
			t.Fatalf("the refused decision was metered under its own label %d times", n)
		}
		w.noAuditRow(t, func(d sdk.Decision) bool { return d.Reaper != "agentlost" || d.Label == sdk.LabelAgentLostProcessAlive })
	})

	// The host meters and audits a plugin's decisions only under the
	// labels it declared when it was launched: a made-up label opens no
	// series and reaches no audit row.
	t.Run("ADecisionUnderAnUndeclaredLabelIsRefusedAndAudited", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t, "undeclared_label", nil)
		w.overreach(t, sdk.LabelBoardRefusedUndeclaredLabel)
		d := w.decisionOf(t, sdk.LabelBoardRefusedUndeclaredLabel)
		if !strings.HasPrefix(d.Evidence[hostaudit.EvAskedLabel], "made_up_") {
			t.Fatalf("the refusal's evidence %v does not say what was asked", d.Evidence)
		}
		for _, l := range w.meteredLabels(t) {
			if strings.HasPrefix(l, "made_up_") {
				t.Fatalf("the undeclared label %q was metered", l)
			}
		}
		w.noAuditRow(t, func(d sdk.Decision) bool { return strings.HasPrefix(d.Label, "made_up_") })
	})
}

// An honest plugin asks for none of it, and its pass is what it was: on
// Lite its infra mark is confirmed as it is made, by the host, on the
// substrate's word read at the write (here: dead), and fenced at the
// host's clock; nothing is refused.
func TestAnHonestLiteMarkIsConfirmedByTheHostOnTheSubstratesWord(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "normal", nil)
	if res := w.loop.RunOnce(context.Background()); len(res.Reaped) != 1 {
		t.Fatalf("the pass did not complete: %+v", res)
	}
	ti, err := w.store.TaskInstance(context.Background(), "run", "task")
	if err != nil {
		t.Fatal(err)
	}
	if ti.State != sdk.StateFailed || ti.LastFailureKind != sdk.FailureInfra || !ti.InfraMarkedAt.Equal(t0) ||
		!ti.InfraConfirmedAt.Equal(t0) {
		t.Fatalf("the attempt is %s/%s marked %v confirmed %v, want an infra mark confirmed at the host's %v",
			ti.State, ti.LastFailureKind, ti.InfraMarkedAt, ti.InfraConfirmedAt, t0)
	}
	w.noAuditRow(t, func(d sdk.Decision) bool { return strings.HasPrefix(d.Label, "board_refused_") })
	w.audited(t, "")
}

// overreach runs a cycle of a plugin that asks for what the host decides:
// the pass completes, nothing is written to the board, and the refusal is
// audited, not applied, under the reaper's configured name, and metered
// under its fixed label.
func (w *world) overreach(t *testing.T, label string) {
	t.Helper()
	res := w.loop.RunOnce(context.Background())
	if len(res.Reaped) != 1 {
		t.Fatalf("the pass did not complete: %+v", res)
	}
	w.state(t, sdk.StateRunning)
	d := w.decisionOf(t, label)
	if d.Applied || d.Reaper != "agentlost" || d.Attempt != w.attempt {
		t.Fatalf("refusal audited as %+v, want not applied, by agentlost, about %s", d, w.attempt)
	}
	if n := w.metered(t, label); n != 1 {
		t.Fatalf("%s metered %d times, want 1", label, n)
	}
}

// decisionOf returns the audit's decision of label about the attempt.
func (w *world) decisionOf(t *testing.T, label string) sdk.Decision {
	t.Helper()
	recs, err := w.store.DecisionsFor(context.Background(), "run", "task", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Label == label {
			return r.Decision
		}
	}
	t.Fatalf("no %s decision in the audit: %+v", label, recs)
	return sdk.Decision{}
}

// noAuditRow asserts that no audit row about the attempt is one of bad's.
func (w *world) noAuditRow(t *testing.T, bad func(sdk.Decision) bool) {
	t.Helper()
	recs, err := w.store.DecisionsFor(context.Background(), "run", "task", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if bad(r.Decision) {
			t.Fatalf("the audit holds what the plugin asked: %+v", r.Decision)
		}
	}
}

// metered reads dexaflow_scheduler_decisions_total for label.
func (w *world) metered(t *testing.T, label string) int {
	t.Helper()
	n := 0.0
	w.eachDecisionSeries(t, func(l string, v float64) {
		if l == label {
			n += v
		}
	})
	return int(n)
}

// meteredLabels lists the decision_type of every series of
// dexaflow_scheduler_decisions_total.
func (w *world) meteredLabels(t *testing.T) []string {
	t.Helper()
	var out []string
	w.eachDecisionSeries(t, func(l string, _ float64) { out = append(out, l) })
	return out
}

func (w *world) eachDecisionSeries(t *testing.T, fn func(label string, v float64)) {
	t.Helper()
	fams, err := w.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "dexaflow_scheduler_decisions_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "decision_type" {
					fn(lp.GetValue(), m.GetCounter().GetValue())
				}
			}
		}
	}
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

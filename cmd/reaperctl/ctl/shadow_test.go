package ctl

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/host/audit"
	"github.com/dexaflow/reaper/sdk"
)

// shadowBoard holds a day of a dry-run agentlost beside a live podlost, on
// run r: agentlost decided comesback, lost and open lost; comesback then
// heartbeated, podlost marked lost (and missed, which agentlost never
// flagged), and open stayed silent. The leader's scorer has scored it all
// at base.
func shadowBoard(t *testing.T) *bundle {
	t.Helper()
	ctx := context.Background()
	b := setup(t, "")
	day := 24 * time.Hour
	b.createRun(t, "r", base.Add(-31*time.Hour), "comesback", "lost", "open", "missed")
	for _, task := range []string{"comesback", "lost", "open", "missed"} {
		b.running(t, first("r", task), base.Add(-30*time.Hour), base.Add(-30*time.Hour), base.Add(-26*time.Hour))
	}
	dry := func(task string) sdk.Decision {
		return sdk.Decision{Reaper: "agentlost", Label: sdk.LabelAgentLost, Attempt: first("r", task), DryRun: true,
			Detail: "silent past agent_lost (dry run: not marked)", Evidence: map[string]string{"edition": "lite"}}
	}
	b.decide(t, base.Add(-day-time.Hour), dry("comesback"), dry("lost"), dry("open"))
	if stop, err := b.w.Heartbeat(ctx, first("r", "comesback"), base.Add(-day)); err != nil || stop {
		t.Fatalf("heartbeat: %v %v", stop, err)
	}
	for _, task := range []string{"lost", "missed"} {
		b.mark(t, first("r", task), false, base.Add(-day))
		b.decide(t, base.Add(-day), sdk.Decision{Reaper: "podlost", Label: sdk.LabelPodLost, Attempt: first("r", task),
			Applied: true, Evidence: map[string]string{"edition": "kube", "policy": "replace"}})
	}
	res, err := audit.NewScorer(b.store, audit.ScorerConfig{}).ScorePage(ctx, b.term, base)
	if err != nil || len(res.Written) != 5 {
		t.Fatalf("scored %+v, %v", res, err)
	}
	return b
}

func TestShadow(t *testing.T) {
	t.Parallel()

	t.Run("PrecisionAndRecallFromTheVerdicts", func(t *testing.T) {
		t.Parallel()
		b := shadowBoard(t)
		var doc shadowJSON
		b.ctl(t, "shadow", "-o", "json").ok(t).decode(t, &doc)
		if len(doc.Reapers) != 2 || doc.Reapers[0].Reaper != "agentlost" || doc.Reapers[1].Reaper != "podlost" {
			t.Fatalf("reapers %+v", doc.Reapers)
		}
		al := doc.Reapers[0]
		l := al.Labels[0]
		if len(al.Labels) != 1 || l.Label != sdk.LabelAgentLost || l.Decisions[sdk.VerdictWouldHaveKilledLiveWork] != 1 ||
			l.Decisions[sdk.VerdictRight] != 1 || l.Decisions[sdk.VerdictUnresolved] != 1 || l.Decisions[unscored] != 0 {
			t.Fatalf("agentlost counts %+v", al.Labels)
		}
		if l.Precision == nil || *l.Precision != 0.5 || al.Precision == nil || *al.Precision != 0.5 {
			t.Fatalf("agentlost precision %v / %v, want 0.5", l.Precision, al.Precision)
		}
		// lost was right; missed was settled by podlost's mark unflagged.
		if al.RightAttempts != 1 || al.MissedAttempts != 1 || al.Recall == nil || *al.Recall != 0.5 {
			t.Fatalf("agentlost recall %v (%d right, %d missed), want 0.5", al.Recall, al.RightAttempts, al.MissedAttempts)
		}
		pl := doc.Reapers[1]
		if pl.Labels[0].Decisions[sdk.VerdictRight] != 2 || *pl.Precision != 1 || pl.MissedAttempts != 0 || *pl.Recall != 1 {
			t.Fatalf("podlost %+v", pl)
		}
		if doc.WindowSeconds != ShadowWindowDefault.Seconds() || !doc.Since.Equal(base.Add(-ShadowWindowDefault)) {
			t.Fatalf("window %v since %v", doc.WindowSeconds, doc.Since)
		}
		if l.Behind != nil || al.Missed != nil {
			t.Fatalf("attempts listed without -v: %+v", doc)
		}
	})

	t.Run("VerboseNamesTheDecisionsBehindEachNumber", func(t *testing.T) {
		t.Parallel()
		b := shadowBoard(t)
		var doc shadowJSON
		b.ctl(t, "shadow", "-json", "-v", "-reaper", "agentlost").ok(t).decode(t, &doc)
		if len(doc.Reapers) != 1 {
			t.Fatalf("reapers %+v", doc.Reapers)
		}
		al := doc.Reapers[0]
		wrong := al.Labels[0].Behind[sdk.VerdictWouldHaveKilledLiveWork]
		if len(wrong) != 1 || wrong[0].TaskID != "comesback" || wrong[0].Decisions != 1 || wrong[0].FirstID == 0 {
			t.Fatalf("behind would_have_killed_live_work: %+v", wrong)
		}
		if len(al.Missed) != 1 || al.Missed[0].TaskID != "missed" || al.Missed[0].Reaper != "podlost" {
			t.Fatalf("missed %+v", al.Missed)
		}

		out := b.ctl(t, "shadow", "-v").ok(t).stdout
		for _, want := range []string{
			"agentlost  agent_lost  1 (1)             1 (1)  1 (1)       0 (0)     50%        -",
			"agentlost  (all)",
			"50% (1 of 2)",
			"podlost    pod_lost    0 (0)             2 (2)",
			"agentlost agent_lost, would_have_killed_live_work:\n  r/comesback try 1 epoch 0: decision ",
			"agentlost agent_lost, unresolved:\n  r/open try 1 epoch 0: decision ",
			"agentlost missed (settled lost by another reaper's mark, never flagged):\n  r/missed try 1 epoch 0: decision ",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("no %q in:\n%s", want, out)
			}
		}
	})

	t.Run("ExplainShowsEachVerdict", func(t *testing.T) {
		t.Parallel()
		b := shadowBoard(t)
		out := b.ctl(t, "explain", "r", "comesback").ok(t).stdout
		if !strings.Contains(out, "    verdict: would_have_killed_live_work (by a heartbeat, 1h0m0s after the decision), scored 0s ago, term 1") {
			t.Fatalf("no verdict in:\n%s", out)
		}
		var doc explainJSON
		b.ctl(t, "explain", "-json", "r", "open").ok(t).decode(t, &doc)
		if len(doc.Decisions) != 1 || doc.Decisions[0].Verdict == nil || doc.Decisions[0].Verdict.Verdict != sdk.VerdictUnresolved ||
			doc.Decisions[0].Verdict.Evidence["by"] != "horizon" {
			t.Fatalf("decisions %+v", doc.Decisions)
		}
	})

	t.Run("EmptyWindow", func(t *testing.T) {
		t.Parallel()
		b := shadowBoard(t)
		out := b.ctl(t, "shadow", "-window", "1h").ok(t).stdout
		if !strings.Contains(out, "no shadow decisions in the window") {
			t.Fatalf("got:\n%s", out)
		}
	})

	t.Run("BadFlags_Usage", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		b.ctl(t, "shadow", "-o", "yaml").failed(t, exitUsage, `-o "yaml": want table or json`)
		b.ctl(t, "shadow", "-window", "0s").failed(t, exitUsage, "-window 0s: must be positive")
	})
}

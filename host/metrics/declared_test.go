package metrics_test

import (
	"strings"
	"testing"

	"github.com/dexaflow/reaper/host/metrics"
	"github.com/dexaflow/reaper/sdk"
)

// series lists the series of the named metric, each as its label values
// joined by spaces in the order the metric names them.
func series(t *testing.T, m *metrics.Metrics, name string) map[string]bool {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, s := range mf.GetMetric() {
			var vs []string
			for _, l := range s.GetLabel() {
				vs = append(vs, l.GetName()+"="+l.GetValue())
			}
			out[strings.Join(vs, " ")] = true
		}
	}
	return out
}

// TestDeclaredReaperGetsItsSeries: a reaper no list of the host or the sdk
// names gets, from its Info alone, the decision series of every label it
// declared and the verdict series of its kill labels only; a reaper the
// metrics never saw declared keeps the sdk's built-in kill labels.
func TestDeclaredReaperGetsItsSeries(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	m.DeclareReaper("tidy", sdk.Info{Name: "tidy", MarkReasons: []string{"tidy_expired"},
		DecisionLabels: []string{"tidy_process_alive"}, KillLabels: []string{"tidy_expired"},
		ProvisionalLabels: []string{"tidy_expired"}})
	m.DeclareReaper("refused", sdk.Info{Name: "refused", MarkReasons: []string{"refused_lost"},
		KillLabels: []string{"refused_other"}})
	m.ShadowReapers([]string{"tidy", "refused", "undeclared"})

	decisions := series(t, m, "dexaflow_scheduler_decisions_total")
	for _, l := range []string{"tidy_expired", "tidy_process_alive", sdk.LabelMarkNoop, sdk.LabelAgentLost} {
		if !decisions["decision_type="+l+" dry_run=false"] {
			t.Errorf("no decision series for %s", l)
		}
	}
	if decisions["decision_type=refused_lost dry_run=false"] {
		t.Error("a declaration the launch check refuses opened a series")
	}

	shadow := series(t, m, "reaper_shadow_verdicts_total")
	want := map[string]bool{"label=tidy_expired reaper=tidy verdict=" + sdk.VerdictWouldHaveKilledLiveWork: true}
	for _, l := range sdk.KillLabels() {
		want["label="+l+" reaper=undeclared verdict="+sdk.VerdictWouldHaveKilledLiveWork] = true
	}
	for s := range shadow {
		if !want[s] {
			t.Errorf("verdict series %q, not declared", s)
		}
	}
	for s := range want {
		if !shadow[s] {
			t.Errorf("no verdict series %q", s)
		}
	}
}

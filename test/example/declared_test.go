package example_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/host/loader"
	"github.com/dexaflow/reaper/host/metrics"
	"github.com/dexaflow/reaper/sdk"
)

// TestParkedIsKnownByItsInfoAlone: reaper-parked, built from its own
// module and launched by the host's loader as any reaper is, needs no line
// of the host: its declaration passes the launch check, the metrics open
// the series of every label it declared and the verdict series of its kill
// label from its Info, and the audit scores its kill decisions by it,
// while no source of the host, the board or the sdk names one of its
// labels.
func TestParkedIsKnownByItsInfoAlone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ld := &loader.Loader{Dir: binDir, Logger: hclog.NewNullLogger()}
	p, err := ld.Launch(ctx, loader.Spec{Kind: sdk.KindReaper, Name: "parked"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	info := p.Info
	if err := sdk.CheckDeclared(info); err != nil {
		t.Fatalf("the launch check refuses its declaration: %v", err)
	}
	labels := append(append([]string{}, info.MarkReasons...), info.DecisionLabels...)
	if kill, _ := sdk.DeclaredKillLabels(info); len(kill) != 1 || kill[0] != labelExpired {
		t.Fatalf("kill labels %v, want [%s]", kill, labelExpired)
	}

	m := metrics.New()
	m.DeclareReaper("parked", info)
	m.ShadowReapers([]string{"parked"})
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range s.GetLabel() {
				key += " " + l.GetName() + "=" + l.GetValue()
			}
			got[key] = true
		}
	}
	for _, l := range labels {
		if !got["dexaflow_scheduler_decisions_total decision_type="+l+" dry_run=false"] {
			t.Errorf("no decision series for its label %s", l)
		}
	}
	if !got["reaper_shadow_verdicts_total label="+labelExpired+" reaper=parked verdict="+sdk.VerdictWouldHaveKilledLiveWork] {
		t.Errorf("no verdict series for its kill label %s", labelExpired)
	}

	// The audit scores its dry-run kill decisions, and its applied
	// provisional ones on kube, by its declaration.
	sc := board.NewScoring(map[string]sdk.Info{"parked": info})
	a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}
	if !sc.Scored(sdk.Decision{Reaper: "parked", Label: labelExpired, Attempt: a, DryRun: true}) ||
		!sc.Scored(sdk.Decision{Reaper: "parked", Label: labelExpired, Attempt: a, Applied: true, Evidence: map[string]string{"edition": "kube"}}) {
		t.Errorf("its %s decisions are not scored", labelExpired)
	}
	if sc.Scored(sdk.Decision{Reaper: "parked", Label: labelAlive, Attempt: a, DryRun: true}) {
		t.Errorf("its %s decisions are scored, though no kill label", labelAlive)
	}

	// Nothing outside its module names it.
	for _, dir := range []string{"host", "board", "sdk"} {
		err := filepath.WalkDir(filepath.Join("..", "..", dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			for _, l := range labels {
				if strings.Contains(string(b), `"`+l+`"`) {
					t.Errorf("%s names the plugin's label %s", path, l)
				}
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

package board_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/migrations"
	"github.com/dexaflow/reaper/sdk"
)

// Which decisions are scored goes by what the reaper they are filed under
// declared: a plugin no list of the host or the sdk names gets its kill
// labels scored; one that declares none keeps the built-in ones among its
// labels; a decision under another name is not scored. The zero Scoring is
// the built-in lists, whatever the reaper.
func TestScoringGoesByTheDeclarations(t *testing.T) {
	t.Parallel()
	sc := board.NewScoring(map[string]sdk.Info{
		"parked": {Name: "parked", MarkReasons: []string{"parked_expired"}, DecisionLabels: []string{"parked_process_alive"},
			KillLabels: []string{"parked_expired"}, ProvisionalLabels: []string{"parked_expired"}},
		"legacy": {Name: "legacy", MarkReasons: []string{sdk.LabelAgentLost}},
	})
	a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}
	dry := func(reaper, label string) sdk.Decision {
		return sdk.Decision{Reaper: reaper, Label: label, Attempt: a, DryRun: true}
	}
	applied := func(reaper, label, edition string) sdk.Decision {
		return sdk.Decision{Reaper: reaper, Label: label, Attempt: a, Applied: true, Evidence: map[string]string{"edition": edition}}
	}
	for _, tc := range []struct {
		name string
		sc   board.Scoring
		d    sdk.Decision
		want bool
	}{
		{"DeclaredKillLabel_DryRun", sc, dry("parked", "parked_expired"), true},
		{"DeclaredProvisionalLabel_AppliedOnKube", sc, applied("parked", "parked_expired", "kube"), true},
		{"DeclaredProvisionalLabel_AppliedOnLite", sc, applied("parked", "parked_expired", "lite"), false},
		{"DeclaredOtherLabel", sc, dry("parked", "parked_process_alive"), false},
		{"ALabelItDidNotDeclareKill", sc, dry("parked", sdk.LabelAgentLost), false},
		{"NoneDeclared_TheBuiltInOnes", sc, dry("legacy", sdk.LabelAgentLost), true},
		{"AnotherName", sc, dry("host", sdk.LabelAgentLost), false},
		{"NotAboutATask", sc, sdk.Decision{Reaper: "parked", Label: "parked_expired", Attempt: sdk.Attempt{RunID: "r"}, DryRun: true}, false},
		{"Zero_BuiltIn", board.Scoring{}, dry("anyone", sdk.LabelAgentLost), true},
		{"Zero_BuiltInOnly", board.Scoring{}, dry("parked", "parked_expired"), false},
	} {
		if got := tc.sc.Scored(tc.d); got != tc.want {
			t.Errorf("%s: scored %v, want %v", tc.name, got, tc.want)
		}
		if strings.HasPrefix(tc.name, "Zero_") && board.Scored(tc.d) != tc.want {
			t.Errorf("%s: board.Scored differs from the zero Scoring", tc.name)
		}
	}
}

// A decision is a kill by the kill labels its reaper declared, applied or
// dry-run alike; the zero Scoring goes by the built-in list. Migration 022
// sets the rows written before it by that same list.
func TestKillGoesByTheDeclarations(t *testing.T) {
	t.Parallel()
	sc := board.NewScoring(map[string]sdk.Info{
		"parked": {Name: "parked", MarkReasons: []string{"parked_expired"}, DecisionLabels: []string{"parked_process_alive"},
			KillLabels: []string{"parked_expired"}, ProvisionalLabels: []string{"parked_expired"}},
	})
	d := func(reaper, label string) sdk.Decision {
		return sdk.Decision{Reaper: reaper, Label: label, Attempt: sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}, Applied: true}
	}
	for _, tc := range []struct {
		name string
		sc   board.Scoring
		d    sdk.Decision
		want bool
	}{
		{"Declared", sc, d("parked", "parked_expired"), true},
		{"DeclaredNotAKill", sc, d("parked", "parked_process_alive"), false},
		{"Undeclared", sc, d("gate", sdk.LabelAgentLost), false},
		{"Zero_BuiltIn", board.Scoring{}, d("anyone", sdk.LabelCredentialCeiling), true},
		{"Zero_BuiltInOnly", board.Scoring{}, d("parked", "parked_expired"), false},
	} {
		if got := tc.sc.Kill(tc.d); got != tc.want {
			t.Errorf("%s: Kill %v, want %v", tc.name, got, tc.want)
		}
	}

	sql, err := migrations.FS.ReadFile("022_decision_kill.sql")
	if err != nil {
		t.Fatal(err)
	}
	body := string(sql)
	in := body[strings.Index(body, "label IN (")+len("label IN ("):]
	in = in[:strings.Index(in, ")")]
	var got []string
	for _, l := range strings.Split(in, ",") {
		got = append(got, strings.Trim(strings.TrimSpace(l), "'"))
	}
	slices.Sort(got)
	if want := slices.Sorted(slices.Values(sdk.KillLabels())); !slices.Equal(got, want) {
		t.Errorf("migration 022 sets kill by %v, the built-in kill labels are %v", got, want)
	}
}

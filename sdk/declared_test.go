package sdk_test

import (
	"strings"
	"testing"

	"github.com/dexaflow/reaper/sdk"
)

// What a plugin declares bounds what the host takes from it: words only,
// never a host's label, at most MaxDeclaredLabels; what it takes is the
// declaration and the common labels, and for a plugin that declares
// nothing (one built before DecisionLabels) the common labels and its mark
// reasons only.
func TestDeclaredLabels(t *testing.T) {
	t.Parallel()
	many := make([]string, sdk.MaxDeclaredLabels+1)
	for i := range many {
		many[i] = "label_" + strings.Repeat("x", i%10) + string(rune('a'+i%26))
	}
	for _, tc := range []struct {
		name string
		info sdk.Info
		want string // "" when accepted
	}{
		{"AWordIsAccepted", sdk.Info{DecisionLabels: []string{"parked_process_alive"}, MarkReasons: []string{"parked_expired"}}, ""},
		{"NothingDeclaredIsAccepted", sdk.Info{}, ""},
		{"AHostsLabelIsRefused", sdk.Info{DecisionLabels: []string{sdk.LabelOperatorMark}}, "only the host records"},
		{"AHostsLabelAsAMarkReasonIsRefused", sdk.Info{MarkReasons: []string{sdk.LabelReconcileSettled}}, "only the host records"},
		{"UppercaseIsRefused", sdk.Info{DecisionLabels: []string{"Agent_Lost"}}, "no label"},
		{"ALongWordIsRefused", sdk.Info{DecisionLabels: []string{strings.Repeat("a", 65)}}, "no label"},
		{"AnEmptyWordIsRefused", sdk.Info{DecisionLabels: []string{""}}, "no label"},
		{"TooManyAreRefused", sdk.Info{DecisionLabels: many}, "more than"},
		{"KillLabelsAmongTheDeclaredAreAccepted", sdk.Info{MarkReasons: []string{"parked_expired"}, DecisionLabels: []string{"parked_orphan_stopped"},
			KillLabels: []string{"parked_expired", "parked_orphan_stopped"}, ProvisionalLabels: []string{"parked_expired"}}, ""},
		{"AnUndeclaredKillLabelIsRefused", sdk.Info{MarkReasons: []string{"parked_expired"}, KillLabels: []string{"parked_lost"}}, "none of its mark reasons"},
		{"AProvisionalLabelNoKillLabelIsRefused", sdk.Info{MarkReasons: []string{"parked_expired"}, ProvisionalLabels: []string{"parked_expired"}}, "none of its kill labels"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := sdk.CheckDeclared(tc.info)
			if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("CheckDeclared = %v, want %q", err, tc.want)
			}
			allowed := sdk.AllowedLabels(tc.info)
			for _, l := range sdk.CommonLabels() {
				if !allowed[l] {
					t.Fatalf("common label %s not allowed", l)
				}
			}
			declared := append(append([]string{}, tc.info.DecisionLabels...), tc.info.MarkReasons...)
			for _, l := range declared {
				if allowed[l] != (err == nil) {
					t.Fatalf("declared %q allowed=%v with the declaration's check %v", l, allowed[l], err)
				}
			}
			if len(allowed) != len(sdk.CommonLabels())+len(declared) && err == nil {
				t.Fatalf("allowed %v: more than the declaration and the common labels", allowed)
			}
		})
	}
}

// A plugin's kill labels are what it declared; one that declares none (built
// before the field) keeps the sdk's built-in ones among its labels, and a
// declaration the launch check refuses yields none.
func TestDeclaredKillLabels(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name              string
		info              sdk.Info
		kill, provisional string
	}{
		{"Declared", sdk.Info{MarkReasons: []string{"parked_expired"}, DecisionLabels: []string{sdk.LabelAgentLost},
			KillLabels: []string{"parked_expired"}}, "parked_expired", ""},
		{"NoneDeclared_TheBuiltInOnesAmongItsLabels", sdk.Info{MarkReasons: []string{sdk.LabelAgentLost, "parked_expired"},
			DecisionLabels: []string{sdk.LabelCredentialCeiling}},
			sdk.LabelAgentLost + "," + sdk.LabelCredentialCeiling, sdk.LabelAgentLost},
		{"Refused", sdk.Info{MarkReasons: []string{"parked_expired"}, KillLabels: []string{"parked_lost"}}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			kill, provisional := sdk.DeclaredKillLabels(tc.info)
			if got := strings.Join(kill, ","); got != tc.kill {
				t.Errorf("kill labels %q, want %q", got, tc.kill)
			}
			if got := strings.Join(provisional, ","); got != tc.provisional {
				t.Errorf("provisional labels %q, want %q", got, tc.provisional)
			}
		})
	}
}

package sdk_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/dexaflow/reaper/sdk"
)

// The specification's decision labels are its dashboards' and runbooks'
// vocabulary: each is written out here letter by letter, against the
// constant the code uses.
func TestLabelsSpelledAsTheSpecification(t *testing.T) {
	listed := sdk.Labels()
	check := func(t *testing.T, rows []struct{ got, want string }) {
		t.Helper()
		for _, r := range rows {
			t.Run(r.want, func(t *testing.T) {
				if r.got != r.want {
					t.Fatalf("constant is %q, the specification spells %q", r.got, r.want)
				}
				if !slices.Contains(listed, r.want) {
					t.Fatalf("%q is not in sdk.Labels()", r.want)
				}
			})
		}
	}
	t.Run("Verbatim", func(t *testing.T) {
		check(t, []struct{ got, want string }{
			{sdk.LabelSettlingSkip, "reap_settling_skip"},
			{sdk.LabelSettlingValveOpen, "reap_settling_valve_open"},
			{sdk.LabelAgentLost, "agent_lost"},
			{sdk.LabelAgentLostProcessAlive, "agent_lost_process_alive"},
			{sdk.LabelAgentLostOrphanStopped, "agent_lost_orphan_stopped"},
			{sdk.LabelAgentLostNeverHeartbeated, "agent_lost_never_heartbeated"},
			{sdk.LabelAgentLostNeverHeartbeatedProcessAlive, "agent_lost_never_heartbeated_process_alive"},
			{sdk.LabelAgentLostNeverHeartbeatedProcessQueryErr, "agent_lost_never_heartbeated_process_query_error"},
			{sdk.LabelCredentialCeiling, "credential_ceiling"},
			{sdk.LabelDispatchLost, "dispatch_lost"},
			{sdk.LabelDispatchLostProcessAlive, "dispatch_lost_process_alive"},
			{sdk.LabelDispatchLostPodQueryErr, "dispatch_lost_pod_query_error"},
			{sdk.LabelDispatchLostOrphanStopped, "dispatch_lost_orphan_stopped"},
			{sdk.LabelStartExpired, "start_expired"},
			{sdk.LabelPodLost, "pod_lost"},
			{sdk.LabelPodLostPodQueryErr, "pod_lost_pod_query_error"},
			{sdk.LabelOrphanReapNoop, "orphan_reap_noop"},
			{sdk.LabelTeardownDeleteFallback, "reap_teardown_delete_fallback"},
			{sdk.LabelInfraConfirmValveOpen, "infra_confirm_valve_open"},
			{sdk.LabelDispatchUnavailable, "dispatch_unavailable"},
			{sdk.LabelDispatchUnavailableSpent, "dispatch_unavailable_exhausted"},
			// Spelled as the failure a dispatch ends in once its re-offers
			// are spent.
			{sdk.LabelDispatchFailed, "dispatch_failed"},
		})
	})
	// The specification writes these once for both process-gated reapers,
	// as *_process_query_error and *_orphan_stop_error.
	t.Run("WildcardForBothReapers", func(t *testing.T) {
		check(t, []struct{ got, want string }{
			{sdk.LabelAgentLostProcessQueryErr, "agent_lost_process_query_error"},
			{sdk.LabelDispatchLostProcessQueryErr, "dispatch_lost_process_query_error"},
			{sdk.LabelAgentLostOrphanStopErr, "agent_lost_orphan_stop_error"},
			{sdk.LabelDispatchLostOrphanStopErr, "dispatch_lost_orphan_stop_error"},
		})
	})
	// The specification says a failed teardown is logged and metered
	// without naming the label; these are the project's names for it, in
	// the same pattern.
	t.Run("TeardownFailures", func(t *testing.T) {
		check(t, []struct{ got, want string }{
			{sdk.LabelAgentLostPodDeleteErr, "agent_lost_pod_delete_error"},
			{sdk.LabelDispatchLostPodDeleteErr, "dispatch_lost_pod_delete_error"},
			{sdk.LabelPodLostPodDeleteErr, "pod_lost_pod_delete_error"},
		})
	})
	// Not decision labels but the specification's words all the same: the
	// start of the error_message of a reconciler's infra settlement.
	t.Run("InfraReasons", func(t *testing.T) {
		for got, want := range map[string]string{
			sdk.ReasonPodDisrupted:            "pod_disrupted",
			sdk.ReasonControlPlaneUnavailable: "control_plane_unavailable",
		} {
			if got != want {
				t.Errorf("reason is %q, the specification spells %q", got, want)
			}
		}
	})
}

// labelConstants reads labels.go and returns the value of each constant
// whose name starts with "Label", by name: the list sdk.Labels() must
// match, however many labels are added later.
func labelConstants(t *testing.T) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "labels.go", nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("parsing labels.go: %v", err)
	}
	out := map[string]string{}
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, "Label") {
					continue
				}
				if i >= len(vs.Values) {
					t.Fatalf("labels.go: %s has no value of its own", name.Name)
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					t.Fatalf("labels.go: %s is not a string literal", name.Name)
				}
				v, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatalf("labels.go: %s: %v", name.Name, err)
				}
				out[name.Name] = v
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("labels.go: no Label constant found")
	}
	return out
}

// sdk.Labels() registers every label's metric ahead of its first decision
// and documents the set: every constant of labels.go exactly once, nothing
// else, and no two constants with the same value.
func TestLabelsListsEveryConstantOnce(t *testing.T) {
	consts := labelConstants(t)
	byValue := map[string]string{}
	for name, v := range consts {
		if other, ok := byValue[v]; ok {
			t.Errorf("%s and %s are both %q", name, other, v)
		}
		byValue[v] = name
	}
	seen := map[string]int{}
	for _, l := range sdk.Labels() {
		seen[l]++
	}
	for l, n := range seen {
		switch {
		case n > 1:
			t.Errorf("sdk.Labels() lists %q %d times", l, n)
		case byValue[l] == "":
			t.Errorf("sdk.Labels() lists %q, which no constant of labels.go holds", l)
		}
	}
	for name, v := range consts {
		if seen[v] == 0 {
			t.Errorf("sdk.Labels() leaves out %s (%q)", name, v)
		}
	}
	for _, l := range sdk.Labels() {
		if l == "" || strings.Trim(l, "abcdefghijklmnopqrstuvwxyz_") != "" {
			t.Errorf("label %q is not lower snake case", l)
		}
	}
}

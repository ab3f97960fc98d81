package sdk

import (
	"maps"
	"testing"
)

func TestEvidenceHoistingRoundTrips(t *testing.T) {
	in := []Decision{
		{Label: "a", Evidence: map[string]string{"term": "3", "edition": "lite", "age": "1s"}},
		{Label: "b", Evidence: map[string]string{"term": "3", "edition": "kube", "age": "2s"}},
		{Label: "c", Evidence: map[string]string{"term": "3", "age": "3s"}},
		{Label: "d"},
	}
	for _, n := range []int{0, 1, 3, 4} {
		wire := decisionsToPB(in[:n])
		common := hoistEvidence(wire)
		out := decisionsFromPB(wire)
		mergeEvidence(out, common)
		for i := range out {
			if !maps.Equal(out[i].Evidence, in[i].Evidence) && len(in[i].Evidence)+len(out[i].Evidence) > 0 {
				t.Fatalf("n=%d decision %d: evidence %v, want %v", n, i, out[i].Evidence, in[i].Evidence)
			}
		}
	}
	wire := decisionsToPB(in[:3])
	if common := hoistEvidence(wire); len(common) != 1 || common["term"] != "3" || len(wire[0].Evidence) != 2 {
		t.Fatalf("common %v, first %v", common, wire[0].Evidence)
	}
}

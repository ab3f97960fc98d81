package board

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/dexaflow/reaper/sdk"
)

// evidenceSample is a decision's evidence as agentlost writes it, with text
// that needs escaping in some values.
var evidenceSample = map[string]string{
	"term": "7", "edition": "lite", "state": "running", "executor": "lite", "threshold": "1m30s",
	"heartbeat_age": "10m0.999s", "running_age": "49m", "queued_age": "50m", "liveness_live": "false",
	"liveness": "dead", "agent": "dead", "group": "dead",
	"liveness_detail": "agent 4242 gone; group 4243 gone", "ceiling": "24h0m0s", "mark": "agent_lost",
	"signal": "positive", "quoted": `say "hi" \ back`, "control": "tab\there\nnew line\x01",
	"unicode": "café ☕", "invalid": "bad\xffbyte", "": "empty key",
}

// TestPackedEvidenceReadsBackByteForByte: packed evidence unpacks to the
// same keys and values, strings kept byte for byte (control characters and
// a key not in packedKeys included) but for invalid UTF-8, which is made
// safe as it is packed (U+FFFD), whatever the map's order; no evidence
// packs to the format byte alone and unpacks empty.
func TestPackedEvidenceReadsBackByteForByte(t *testing.T) {
	p := newEvidencePacker()
	buf := []byte("prefix")
	want := maps.Clone(evidenceSample)
	want["invalid"] = "bad\uFFFDbyte"
	for range 2 { // the map's order may differ from one encoding to the next
		got := p.appendPacked(buf, evidenceSample, nil)
		ev, err := unpackEvidence(got[len(buf):])
		if err != nil || !maps.Equal(ev, want) {
			t.Fatalf("packed %q reads back as %q (%v), want %q", got[len(buf):], ev, err, want)
		}
	}
	none := p.appendPacked(nil, nil, nil)
	if ev, err := unpackEvidence(none); string(none) != "\x01" || err != nil || ev == nil || len(ev) != 0 {
		t.Fatalf("no evidence packed as %q, reads back as %v, %v", none, ev, err)
	}
}

// TestPackedEvidenceRefusesWhatItDidNotWrite: a cut-short value, a length
// past the end, a key code past packedKeys and another format fail to
// read, never read as some other evidence.
func TestPackedEvidenceRefusesWhatItDidNotWrite(t *testing.T) {
	good := newEvidencePacker().appendPacked(nil, map[string]string{"term": "7", "own_key": "v"}, nil)
	for name, b := range map[string][]byte{
		"empty":         {},
		"other format":  append([]byte{2}, good[1:]...),
		"cut short":     good[:len(good)-1],
		"length past":   {1, 1, 9, 'x'},
		"unknown code":  {1, byte(len(packedKeys) + 1), 1, 'x'},
		"key cut short": {1, 0, 5, 'a'},
		"no value":      {1, 1},
	} {
		if ev, err := unpackEvidence(b); err == nil {
			t.Errorf("%s: %q read as %q", name, b, ev)
		}
	}
}

// TestPackedKeysAreOnlyAppended: a key's code is its place in packedKeys,
// part of the stored form; a key moved or removed would read old rows'
// evidence under another name.
func TestPackedKeysAreOnlyAppended(t *testing.T) {
	const pinned = "term edition state executor threshold heartbeat_age running_age queued_age " +
		"pod_uid activity_age liveness agent group orphan pending liveness_detail " +
		"liveness_live signal mark policy noop_reason stop teardown error attached " +
		"ceiling brake_judged brake_silence_only brake_allowed brake_share node " +
		"node_unreachable_since node_error confirm credential_lapse mark_from_states mark_kind " +
		"mark_reason message outcome parked_for warm_workers recovered refusal requests " +
		"run_age warm_worker write infra_mark hold why worker pod attempt"
	want := strings.Fields(pinned)
	if len(packedKeys) < len(want) || !slices.Equal(packedKeys[:len(want)], want) {
		t.Fatalf("packedKeys changed the codes of stored keys:\n%q\nwant a list that starts with\n%q", packedKeys, want)
	}
	seen := map[string]bool{}
	for _, k := range packedKeys {
		if seen[k] {
			t.Fatalf("packedKeys holds %q twice", k)
		}
		seen[k] = true
	}
}

func BenchmarkAppendPacked(b *testing.B) {
	ev := map[string]string{}
	for k, v := range evidenceSample {
		if k != "invalid" && k != "control" && k != "quoted" {
			ev[k] = v
		}
	}
	p := newEvidencePacker()
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf = p.appendPacked(buf[:0], ev, nil)
	}
}

// BenchmarkAuditRow encodes one agentlost decision's audit row, its text
// made safe as it is encoded: clean text allocates nothing.
func BenchmarkAuditRow(b *testing.B) {
	ev := map[string]string{}
	for k, v := range evidenceSample {
		if k != "invalid" && k != "control" && k != "quoted" {
			ev[k] = v
		}
	}
	d := sdk.Decision{Reaper: "agentlost", Label: sdk.LabelAgentLost, Applied: true,
		Attempt: sdk.Attempt{RunID: "run-0001", TaskID: "task-00042", Try: 1},
		Detail:  "no heartbeat for 10m0.999s (threshold 1m30s); agent and group dead", Evidence: ev}
	c := &auditCopy{packer: newEvidencePacker(), ev: make([]byte, 0, 512)}
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		buf = c.appendRow(buf[:0], &d)
	}
}

package board

import (
	"bytes"
	"encoding/json"
	"io"
	"slices"
	"testing"
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

// TestAppendEvidenceReadsBackAsEncodingJSONWritesIt: the object decodes
// to what encoding/json's encoding of the map decodes to (invalid UTF-8
// replaced alike), its keys in the same (sorted) order.
func TestAppendEvidenceReadsBackAsEncodingJSONWritesIt(t *testing.T) {
	std, err := json.Marshal(evidenceSample)
	if err != nil {
		t.Fatal(err)
	}
	want := decodeEvidence(t, std)
	var keys []string
	buf := []byte("prefix")
	for range 2 { // the second time with the keys' scratch space reused
		got, k, err := appendEvidence(buf, keys[:0], evidenceSample)
		if err != nil {
			t.Fatal(err)
		}
		if dec := decodeEvidence(t, got[len(buf):]); !slices.Equal(dec, want) {
			t.Fatalf("encoded\n%s\nreads back as\n%q\nwant\n%q", got[len(buf):], dec, want)
		}
		keys = k
	}
	if got, _, err := appendEvidence(nil, nil, nil); err != nil || string(got) != "{}" {
		t.Fatalf("no evidence encoded as %q, %v", got, err)
	}
}

// decodeEvidence decodes a JSON object of strings into its keys and values,
// in their order.
func decodeEvidence(t *testing.T, obj []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(obj))
	var out []string
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("decode %s: %v", obj, err)
		}
		if s, ok := tok.(string); ok {
			out = append(out, s)
		}
	}
}

func BenchmarkAppendEvidence(b *testing.B) {
	ev := map[string]string{}
	for k, v := range evidenceSample {
		if k != "invalid" && k != "control" && k != "quoted" {
			ev[k] = v
		}
	}
	var (
		buf  []byte
		keys []string
	)
	b.ReportAllocs()
	for b.Loop() {
		buf, keys, _ = appendEvidence(buf[:0], keys[:0], ev)
	}
}

package board

import (
	"bytes"
	"encoding/json"
	"io"
	"maps"
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
// to the same keys and values as encoding/json's encoding of the map
// (invalid UTF-8 replaced alike); their order is the map's (jsonb keeps
// its own).
func TestAppendEvidenceReadsBackAsEncodingJSONWritesIt(t *testing.T) {
	std, err := json.Marshal(evidenceSample)
	if err != nil {
		t.Fatal(err)
	}
	want := decodeEvidence(t, std)
	buf := []byte("prefix")
	for range 2 { // the map's order may differ from one encoding to the next
		got, err := appendEvidence(buf, evidenceSample)
		if err != nil {
			t.Fatal(err)
		}
		if dec := decodeEvidence(t, got[len(buf):]); !maps.Equal(dec, want) {
			t.Fatalf("encoded\n%s\nreads back as\n%q\nwant\n%q", got[len(buf):], dec, want)
		}
	}
	if got, err := appendEvidence(nil, nil); err != nil || string(got) != "{}" {
		t.Fatalf("no evidence encoded as %q, %v", got, err)
	}
}

// decodeEvidence decodes a JSON object of strings into a map, failing on a
// key seen twice.
func decodeEvidence(t *testing.T, obj []byte) map[string]string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(obj))
	out := map[string]string{}
	var key *string
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("decode %s: %v", obj, err)
		}
		s, ok := tok.(string)
		switch {
		case !ok:
		case key == nil:
			if _, dup := out[s]; dup {
				t.Fatalf("decode %s: key %q twice", obj, s)
			}
			key = &s
		default:
			out[*key] = s
			key = nil
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
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = appendEvidence(buf[:0], ev)
	}
}

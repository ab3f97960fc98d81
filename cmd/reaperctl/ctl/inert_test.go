package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// hostile is text an agent, a task or a plugin might write to take over an
// operator's terminal: a window title (OSC), a screen clear and colour (CSI),
// a bell, a carriage return that overprints the line (folded to a space
// like every line break of a one-line field), an 8-bit CSI (C1), a
// right-to-left override. (The board stores UTF-8 only; a stray byte is the
// writer test's.)
const hostile = "ok\x1b]0;pwned\x07\x1b[2J\x1b[31mred\rFAKE\u009b1m\u202eevil"

// controlBytes lists what must never reach the terminal raw.
func controlBytes(t *testing.T, out string) {
	t.Helper()
	for i := 0; i < len(out); i++ {
		if c := out[i]; c < 0x20 && c != '\n' && c != '\t' || c == 0x7f || c == 0xff {
			t.Fatalf("byte %#x at %d reached the output: %q", c, i, out)
		}
	}
	for _, r := range []string{"\u009b", "\u202e"} {
		if strings.Contains(out, r) {
			t.Fatalf("%q reached the output: %q", r, out)
		}
	}
}

// TestExplainPrintsAgentWrittenEscapesInert: a reason, an evidence value
// and a try log line holding terminal escape sequences are printed by
// reaperctl explain as visible escapes, never as the sequences; the JSON
// document stays valid and gives back the text exactly.
func TestExplainPrintsAgentWrittenEscapesInert(t *testing.T) {
	t.Parallel()
	b := setup(t, "")
	b.createRun(t, "x", base.Add(-time.Hour), "t")
	a := first("x", "t")
	b.running(t, a, base.Add(-30*time.Minute), base.Add(-29*time.Minute), base.Add(-28*time.Minute))
	b.decide(t, base.Add(-5*time.Minute), sdk.Decision{Reaper: "agentlost", Label: sdk.LabelAgentLostProcessAlive,
		Attempt: a, Detail: "reason " + hostile, Evidence: map[string]string{"liveness": hostile}})
	if err := b.w.AppendLog(context.Background(), []sdk.LogLine{{Attempt: a, At: base.Add(-4 * time.Minute),
		Line: "task said " + hostile}}); err != nil {
		t.Fatal(err)
	}

	out := b.ctl(t, "explain", "x", "t").ok(t).stdout
	controlBytes(t, out)
	for _, want := range []string{
		`reason ok\u001b]0;pwned\u0007\u001b[2J\u001b[31mred FAKE\u009b1m\u202eevil`,
		`saw liveness=ok\u001b]0;pwned`,
		`task said ok\u001b]0;pwned`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explain lacks %q:\n%s", want, out)
		}
	}

	raw := b.ctl(t, "explain", "-json", "x", "t").ok(t).stdout
	controlBytes(t, raw)
	var doc explainJSON
	if err := json.Unmarshal([]byte(raw), &doc); err != nil {
		t.Fatalf("the JSON document no longer parses: %v\n%s", err, raw)
	}
	back := hostile
	if len(doc.Decisions) != 1 || doc.Decisions[0].Detail != "reason "+back || doc.Decisions[0].Evidence["liveness"] != back {
		t.Errorf("JSON decisions %+v, want the text given back", doc.Decisions)
	}
	if len(doc.Log) != 1 || doc.Log[0].Line != "task said "+back {
		t.Errorf("JSON log %+v", doc.Log)
	}
}

// TestInertWriterHoldsARuneSplitAcrossWrites: a rune cut between two
// writes is judged whole (U+009B split is still escaped; é split is kept).
func TestInertWriterHoldsARuneSplitAcrossWrites(t *testing.T) {
	var buf bytes.Buffer
	w := newInertWriter(&buf)
	for _, p := range []string{"a\xc2", "\x9bb\xc3", "\xa9c\xe2\x80", "\xae"} {
		if _, err := w.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	_, _ = w.Write([]byte("\xe2"))
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if got, want := buf.String(), `a\u009bbéc\u202e\xe2`; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

package ctl

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// Much of what reaperctl prints was written by someone else: reasons,
// evidence and try log lines come from agents, tasks and plugins; run and
// task names from whoever submitted the work. A terminal obeys control
// characters in that text (ESC sequences move the cursor, rewrite the
// screen, set the window title or a clipboard; a carriage return overprints
// a line; a bidirectional override reorders it), so every byte reaperctl
// writes goes through inert: control characters come out as visible
// escapes, inert on any terminal.

// inert renders s for a terminal: newline and tab stay (reaperctl lays out
// its own lines and tables with them; oneLine and table cells fold those of
// written text), every other C0 control, DEL, every C1 control and the
// bidirectional formatting characters become \uXXXX, and a byte that is not
// UTF-8 becomes \xNN. The \u form keeps a JSON document valid: in JSON such
// runes can only stand inside strings, where \uXXXX is their escape.
func inert(s string) string {
	if !needsInert(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case controlRune(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// controlRune reports the runes inert escapes.
func controlRune(r rune) bool {
	switch {
	case r == '\n' || r == '\t':
		return false
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
		return true
	case r == 0x061c, r == 0x200e, r == 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true // bidirectional marks, embeddings, overrides and isolates
	}
	return false
}

func needsInert(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && c != '\n' && c != '\t' || c >= 0x7f {
			return true // a control byte, or the start of a rune to look at
		}
	}
	return false
}

// inertWriter passes everything written to it through inert. A rune split
// across two writes is held until its end arrives (or Flush).
type inertWriter struct {
	w    io.Writer
	tail []byte // an incomplete UTF-8 sequence the last write ended with
}

func newInertWriter(w io.Writer) *inertWriter { return &inertWriter{w: w} }

func (iw *inertWriter) Write(p []byte) (int, error) {
	buf := append(iw.tail, p...)
	iw.tail = nil
	// Hold back an incomplete rune at the end (at most 3 bytes).
	for k := 1; k <= 3 && k <= len(buf); k++ {
		start := len(buf) - k
		if utf8.RuneStart(buf[start]) {
			if !utf8.FullRune(buf[start:]) {
				iw.tail = append([]byte(nil), buf[start:]...)
				buf = buf[:start]
			}
			break
		}
	}
	if _, err := io.WriteString(iw.w, inert(string(buf))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes a held incomplete rune, escaped.
func (iw *inertWriter) Flush() error {
	if len(iw.tail) == 0 {
		return nil
	}
	t := iw.tail
	iw.tail = nil
	_, err := io.WriteString(iw.w, inert(string(t)))
	return err
}

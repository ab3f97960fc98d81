package sdk

import (
	"strings"
	"unicode/utf8"
)

// Tenants' text. A reason, an error message, a try log line, a decision's
// detail or evidence comes, in the end, from bytes a task, an agent, a pod
// or a plugin chose. PostgreSQL refuses a NUL in text and jsonb, and
// refuses invalid UTF-8, so one such string would fail a whole batch of
// other tenants' writes. Every board makes that text safe once, at its
// edge, with SafeText and the bounds below: the rule is written here, in
// the contract, so that the Postgres board and the in-memory one store the
// same bytes and one conformance suite holds both to them.
//
// What SafeText does:
//   - a NUL byte becomes U+FFFD (the replacement character), and so does
//     each byte of invalid UTF-8 (one U+FFFD per byte that does not start
//     a valid sequence, as utf8.DecodeRuneInString reads it). U+FFFD rather
//     than a visible escape such as \x00: an escape is ambiguous with the
//     same characters typed literally, and the operator's CLI already
//     prints control characters inert;
//   - text longer than its bound is cut on a rune boundary and ends with
//     TextCutMarker, the whole within the bound.
//
// Clean text within its bound is returned as it is, without allocating.

// TextCutMarker ends a text that was cut to its bound.
const TextCutMarker = "…[cut]"

// The bounds, in bytes, of the tenants' text a board stores.
const (
	// MaxReasonBytes bounds a failure reason (failure_reason): a label,
	// or an agent's or a record's short word for why.
	MaxReasonBytes = 256
	// MaxMessageBytes bounds an error message (error_message) and a run's
	// failure message: a termination message is at most 4 KiB too.
	MaxMessageBytes = 4096
	// MaxLogLineBytes bounds one try log line (attempt_log.line).
	MaxLogLineBytes = 4096
	// MaxDetailBytes bounds a decision's detail (reap_decisions.detail).
	MaxDetailBytes = 4096
	// MaxEvidenceKeyBytes and MaxEvidenceValueBytes bound each key and
	// each value of a decision's evidence.
	MaxEvidenceKeyBytes   = 128
	MaxEvidenceValueBytes = 1024
	// MaxNameBytes bounds a name the audit stores beside the text: the
	// reaper, the label, the run and task ids of a decision.
	MaxNameBytes = 256
)

// SafeText returns s with each NUL and each byte of invalid UTF-8 replaced
// by U+FFFD and, when the result is longer than bound bytes, cut on a rune
// boundary to end with TextCutMarker within bound bytes. A bound shorter than
// the marker cuts to the runes that fit, with no marker. s is returned as it
// is (no allocation) when it is already valid, NUL-free and within bound.
func SafeText(s string, bound int) string {
	if TextIsSafe(s, bound) {
		return s
	}
	return makeSafe(s, bound)
}

// TextIsSafe reports whether SafeText(s, bound) is s: valid UTF-8, no NUL,
// at most bound bytes. It allocates nothing.
func TextIsSafe(s string, bound int) bool {
	if len(s) > bound {
		return false
	}
	if len(s) < shortText {
		// Most of the board's text is short words and numbers (evidence
		// values): one pass, byte by byte, until a byte that is not ASCII.
		for i := 0; i < len(s); i++ {
			switch c := s[i]; {
			case c == 0:
				return false
			case c >= utf8.RuneSelf:
				return strings.IndexByte(s[i:], 0) < 0 && utf8.ValidString(s[i:])
			}
		}
		return true
	}
	// Two scans, each the standard library's fastest: IndexByte is
	// vectorised, ValidString checks eight ASCII bytes at a time.
	return strings.IndexByte(s, 0) < 0 && utf8.ValidString(s)
}

// shortText is the length below which TextIsSafe checks byte by byte: for
// short text the two library scans cost more in calls than in bytes (about
// twice the time on evidence-sized words).
const shortText = 32

// makeSafe is SafeText's slow path: s needs a replacement or a cut.
func makeSafe(s string, bound int) string {
	const repl = "\uFFFD"
	if bound < 0 {
		bound = 0
	}
	// The bound the runes must keep to so that the marker still fits, once
	// it is known that a cut is needed.
	keep := bound - len(TextCutMarker)
	if keep < 0 {
		keep = bound
	}
	out := make([]byte, 0, min(len(s)+8, bound))
	cut := -1 // len(out) when it first passed keep
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		piece := s[i : i+size]
		if r == 0 || (r == utf8.RuneError && size == 1) {
			piece = repl
		}
		if cut < 0 && len(out)+len(piece) > keep {
			cut = len(out)
		}
		if len(out)+len(piece) > bound {
			// Cut: back to the last rune that leaves room for the marker.
			out = out[:cut]
			if bound >= len(TextCutMarker) {
				out = append(out, TextCutMarker...)
			}
			return string(out)
		}
		out = append(out, piece...)
		i += size
	}
	return string(out)
}

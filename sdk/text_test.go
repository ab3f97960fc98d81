package sdk_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dexaflow/reaper/sdk"
)

func TestSafeText(t *testing.T) {
	cases := []struct {
		name, in string
		bound    int
		want     string
	}{
		{"CleanTextIsKept", "agent_lost: silent 95s", 64, "agent_lost: silent 95s"},
		{"CleanMultibyteTextIsKept", "échec — 失敗", 64, "échec — 失敗"},
		{"NULBecomesTheReplacementCharacter", "exit\x00code", 64, "exit\uFFFDcode"},
		{"EachInvalidByteBecomesOneReplacementCharacter", "a\xff\xfeb", 64, "a\uFFFD\uFFFDb"},
		{"ATruncatedSequenceIsReplaced", "a\xe2\x82", 64, "a\uFFFD\uFFFD"},
		{"AnEncodedSurrogateIsReplaced", "\xed\xa0\x80", 64, "\uFFFD\uFFFD\uFFFD"},
		{"OverlongTextIsCutWithTheMarker", strings.Repeat("x", 20), 16, strings.Repeat("x", 16-len(sdk.TextCutMarker)) + sdk.TextCutMarker},
		{"TextAtTheBoundIsKept", strings.Repeat("x", 16), 16, strings.Repeat("x", 16)},
		{"TheCutNeverSplitsARune", strings.Repeat("é", 10), 11, "é" + sdk.TextCutMarker},
		{"ABoundBelowTheMarkerKeepsWhatFits", "abcdef", 3, "abc"},
		{"ReplacementsCountTowardsTheBound", strings.Repeat("\x00", 10), 12, "\uFFFD" + sdk.TextCutMarker},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := sdk.SafeText(c.in, c.bound)
			if got != c.want {
				t.Fatalf("SafeText(%q, %d) = %q, want %q", c.in, c.bound, got, c.want)
			}
			if len(got) > c.bound || !utf8.ValidString(got) || strings.IndexByte(got, 0) >= 0 {
				t.Fatalf("SafeText(%q, %d) = %q: not safe", c.in, c.bound, got)
			}
		})
	}
}

// FuzzSafeText: whatever comes in, what goes out is valid UTF-8 with no
// NUL within its bound, and text that is already safe comes out byte for
// byte.
func FuzzSafeText(f *testing.F) {
	for _, s := range []string{"", "ok", "a\x00b", "\xff", "é\xe2\x82", strings.Repeat("日本", 50), "…[cut]"} {
		f.Add(s, 16)
	}
	f.Fuzz(func(t *testing.T, s string, bound int) {
		bound = bound % 5000
		if bound < 0 {
			bound = -bound
		}
		got := sdk.SafeText(s, bound)
		if !utf8.ValidString(got) {
			t.Fatalf("SafeText(%q, %d) = %q: invalid UTF-8", s, bound, got)
		}
		if strings.IndexByte(got, 0) >= 0 {
			t.Fatalf("SafeText(%q, %d) = %q: holds a NUL", s, bound, got)
		}
		if len(got) > bound {
			t.Fatalf("SafeText(%q, %d) = %q: %d bytes, over the bound", s, bound, got, len(got))
		}
		clean := utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
		if clean && len(s) <= bound && got != s {
			t.Fatalf("SafeText(%q, %d) = %q: clean text changed", s, bound, got)
		}
		if sdk.TextIsSafe(s, bound) != (clean && len(s) <= bound) {
			t.Fatalf("TextIsSafe(%q, %d) = %v", s, bound, !(clean && len(s) <= bound))
		}
		if again := sdk.SafeText(got, bound); again != got {
			t.Fatalf("SafeText is not idempotent: %q then %q", got, again)
		}
	})
}

// BenchmarkSafeText measures the check on clean text (the common case: it
// must allocate nothing) and the repair of a poisoned one.
func BenchmarkSafeText(b *testing.B) {
	clean := "agent_lost: no heartbeat for 95s (threshold 90s); agent pid 4242 dead, group 4242 dead — ok"
	b.Run("CleanASCII", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(clean)))
		for b.Loop() {
			if sdk.SafeText(clean, sdk.MaxMessageBytes) != clean {
				b.Fatal("changed")
			}
		}
	})
	line := strings.Repeat("données du journal ", 200) // 4 KiB with multibyte runes
	line = line[:4000]
	line = strings.ToValidUTF8(line, "")
	b.Run("Clean4KiBMultibyte", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(line)))
		for b.Loop() {
			if sdk.SafeText(line, sdk.MaxLogLineBytes) != line {
				b.Fatal("changed")
			}
		}
	})
	poisoned := "exit_code\x00 \xff" + clean
	b.Run("Poisoned", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = sdk.SafeText(poisoned, sdk.MaxMessageBytes)
		}
	})
}

func BenchmarkTextIsSafeShort(b *testing.B) {
	words := []string{"7", "lite", "running", "1m30s", "10m0.999s", "dead", "agent_lost", "positive", "24h0m0s", "café ☕"}
	b.ReportAllocs()
	for b.Loop() {
		for _, w := range words {
			if !sdk.TextIsSafe(w, 64) {
				b.Fatal(w)
			}
		}
	}
}

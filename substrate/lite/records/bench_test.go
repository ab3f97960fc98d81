package records

import "testing"

// BenchmarkParseGroup decodes a group record as a liveness probe does.
func BenchmarkParseGroup(b *testing.B) {
	g := sampleGroup()
	data := g.Marshal()
	for b.Loop() {
		if _, err := ParseGroup(data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseGroupExpected decodes it as a Reader does, expecting the
// attempt it asked for and the boot id of the record before.
func BenchmarkParseGroupExpected(b *testing.B) {
	g := sampleGroup()
	data := g.Marshal()
	like := likely{attempt: g.Attempt, boot: g.Boot}
	for b.Loop() {
		if _, err := parseGroup(data, like); err != nil {
			b.Fatal(err)
		}
	}
}

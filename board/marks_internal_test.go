package board

import (
	"strings"
	"testing"
)

// The source-state bits are numbered by markStates in Go and by an array
// literal in markSQL: the two must list the same states in the same order.
func TestMarkStatesMatchTheStatement(t *testing.T) {
	literal := "'{" + strings.Join(markStates, ",") + "}'"
	flat := strings.Join(strings.Fields(markSQL), "")
	if !strings.Contains(flat, literal) {
		t.Fatalf("markSQL does not number the states as markStates does: want %s in\n%s", literal, markSQL)
	}
	if len(markStates) != len(taskStates) {
		t.Fatalf("markStates lists %d states, the schema has %d", len(markStates), len(taskStates))
	}
	if flagFirstState != 4 {
		t.Fatal("markSQL shifts by 3 + array_position: the first state bit must be bit 4")
	}
}

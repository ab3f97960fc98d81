package helmrelease

import (
	"os/exec"
	"strings"
	"testing"
)

// The command lines a Release tells are the ones a user can paste: a
// shell splits them back into the arguments that ran.
func TestQuotedLinesSplitBackIntoTheArguments(t *testing.T) {
	args := []string{"submit", "-run", "r1", "-command", "echo hello; sleep 1", "it's", "$HOME", "", "a=b,c"}
	line := strings.Join(quoted(args), " ")
	split, err := exec.Command("sh", "-c", `eval "set -- $1"; for a in "$@"; do printf '[%s]' "$a"; done`, "sh", line).CombinedOutput()
	if err != nil {
		t.Fatalf("sh: %v: %s", err, split)
	}
	want := "[" + strings.Join(args, "][") + "]"
	if string(split) != want {
		t.Errorf("%s\nsplits into %s, want %s", line, split, want)
	}
	if got := strings.Join(quoted([]string{"install", "reaper", ChartDir, "--wait"}), " "); got != "install reaper "+ChartDir+" --wait" {
		t.Errorf("plain arguments quoted: %s", got)
	}
}

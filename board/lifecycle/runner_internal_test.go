package lifecycle

import (
	"strings"
	"testing"

	"github.com/dexaflow/reaper/sdk"
)

// The SQL list of terminal reasons and IsTerminalFailure must name the same
// reasons.
func TestTerminalSQLNamesTheTerminalReasons(t *testing.T) {
	reasons := []string{sdk.LabelDispatchFailed, sdk.LabelInfraBudgetSpent}
	for _, r := range reasons {
		if !IsTerminalFailure(r) || !strings.Contains(terminalSQL, "'"+r+"'") {
			t.Errorf("%q is not terminal in both IsTerminalFailure and terminalSQL (%s)", r, terminalSQL)
		}
	}
	if n := strings.Count(terminalSQL, "'") / 2; n != len(reasons) {
		t.Errorf("terminalSQL lists %d reasons, want %d", n, len(reasons))
	}
}

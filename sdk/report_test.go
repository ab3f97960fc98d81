package sdk

import (
	"context"
	"testing"
)

// Over the plugin protocol, Report is tested end to end by the host's
// loader tests (a real plugin binary reporting early, then failing).

func TestReportOutsideAPluginPassTakesNothing(t *testing.T) {
	if Report(context.Background(), []Decision{{Label: LabelAgentLost}}) {
		t.Fatal("Report took decisions with no pass stream to send them on")
	}
}

package metrics_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/host/metrics"
	"github.com/dexaflow/reaper/sdk"
)

// counter reads one series of a counter from the registry.
func counter(t *testing.T, m *metrics.Metrics, name, label, value string) float64 {
	t.Helper()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return s.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestBoardObserverMetersAndLogs: text the board made safe is counted by
// field; a row refused alone is counted by write and logged with the
// attempt and the error.
func TestBoardObserverMetersAndLogs(t *testing.T) {
	m := metrics.New()
	var log bytes.Buffer
	obs := m.BoardObserver(hclog.New(&hclog.LoggerOptions{Output: &log}))
	obs.TextMadeSafe(board.FieldReason)
	obs.TextMadeSafe(board.FieldReason)
	obs.RowRefused("settle", sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}, errors.New("timestamp out of range"))
	if got := counter(t, m, "reaper_board_text_made_safe_total", "field", "reason"); got != 2 {
		t.Fatalf("text made safe %v, want 2", got)
	}
	if got := counter(t, m, "reaper_board_rows_refused_total", "write", "settle"); got != 1 {
		t.Fatalf("rows refused %v, want 1", got)
	}
	if !strings.Contains(log.String(), "timestamp out of range") || !strings.Contains(log.String(), "write=settle") {
		t.Fatalf("log %q", log.String())
	}
	obs.Deposed("mark", 7)
	obs.Deposed("mark", 7)
	if got := counter(t, m, "reaper_fence_refused_total", "write", "mark"); got != 2 {
		t.Fatalf("fence refusals %v, want 2", got)
	}
}

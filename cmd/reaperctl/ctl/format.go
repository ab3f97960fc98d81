package ctl

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
)

// human renders a duration for people at the precision that matters for
// its size: "850µs", "350ms", "12.5s", "3m12s", "2h5m", "3d4h". Whole units
// drop their zero remainder ("5m", "1h").
func human(d time.Duration) string {
	if d < 0 {
		return "-" + human(-d)
	}
	const day = 24 * time.Hour
	switch {
	case d == 0:
		return "0s"
	case d < time.Millisecond:
		return d.String()
	case d < time.Second:
		if r := d.Round(time.Millisecond); r < time.Second {
			return fmt.Sprintf("%dms", r/time.Millisecond)
		}
		d = time.Second
	}
	if d < time.Minute {
		if r := d.Round(100 * time.Millisecond); r < time.Minute {
			if r%time.Second == 0 {
				return fmt.Sprintf("%ds", r/time.Second)
			}
			return fmt.Sprintf("%.1fs", r.Seconds())
		}
		d = time.Minute
	}
	if d < time.Hour {
		if r := d.Round(time.Second); r < time.Hour {
			return pair(r/time.Minute, "m", r%time.Minute/time.Second, "s")
		}
		d = time.Hour
	}
	if d < day {
		if r := d.Round(time.Minute); r < day {
			return pair(r/time.Hour, "h", r%time.Hour/time.Minute, "m")
		}
		d = day
	}
	r := d.Round(time.Hour)
	return pair(r/day, "d", r%day/time.Hour, "h")
}

func pair(major time.Duration, mu string, minor time.Duration, nu string) string {
	if minor == 0 {
		return fmt.Sprintf("%d%s", major, mu)
	}
	return fmt.Sprintf("%d%s%d%s", major, mu, minor, nu)
}

// age is how long before now t was, to the second; "-" when t is zero.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return human(now.Sub(t).Truncate(time.Second))
}

// stamp renders an absolute time, in UTC.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// oneLine folds a message onto one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// clip shortens s to at most n runes, marking the cut.
func clip(s string, n int) string {
	s = oneLine(s)
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// dash stands in for an empty cell.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// table writes aligned columns.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	t.row(header...)
	return t
}

// row writes one line of cells. A tab or a line break inside a cell (text
// someone else wrote) would shift the columns or start a line of its own:
// each becomes a space.
func (t *table) row(cells ...string) {
	for i, c := range cells {
		cells[i] = strings.Map(func(r rune) rune {
			if r == '\t' || r == '\n' || r == '\r' {
				return ' '
			}
			return r
		}, c)
	}
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

func (t *table) flush() error { return t.tw.Flush() }

// writeJSON prints v as one indented JSON document.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write JSON: %w", err)
	}
	return nil
}

// stateOrder is the order task states are counted in: live first.
var stateOrder = []string{
	sdk.StateRunning, sdk.StateQueued, sdk.StateScheduled, sdk.StateNone,
	sdk.StateUpForRetry, sdk.StateUpForReschedule, sdk.StateDeferred,
	sdk.StateSuccess, sdk.StateFailed, sdk.StateSkipped, sdk.StateUpstreamFailed,
}

// countsLine renders task counts by state: "running=1 success=3".
func countsLine(counts map[string]int) string {
	var parts []string
	seen := map[string]bool{}
	for _, st := range stateOrder {
		seen[st] = true
		if n := counts[st]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", st, n))
		}
	}
	var other []string
	for st, n := range counts {
		if !seen[st] && n > 0 {
			other = append(other, fmt.Sprintf("%s=%d", st, n))
		}
	}
	sort.Strings(other)
	parts = append(parts, other...)
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

func total(counts map[string]int) int {
	n := 0
	for _, c := range counts {
		n += c
	}
	return n
}

// failure renders a task instance's failure as kind:reason.
func failure(ti board.TaskInstance) string {
	switch {
	case ti.LastFailureKind == "" && ti.FailureReason == "":
		return "-"
	case ti.FailureReason == "":
		return ti.LastFailureKind
	case ti.LastFailureKind == "":
		return ti.FailureReason
	}
	return ti.LastFailureKind + ":" + ti.FailureReason
}

// stateSince is when the attempt entered its current state, as far as the
// row says.
func stateSince(ti board.TaskInstance) time.Time {
	var t time.Time
	switch ti.State {
	case sdk.StateRunning:
		t = ti.RunningAt
	case sdk.StateQueued:
		t = ti.QueuedAt
	case sdk.StateSuccess, sdk.StateFailed, sdk.StateSkipped, sdk.StateUpstreamFailed,
		sdk.StateUpForRetry, sdk.StateUpForReschedule:
		t = ti.EndedAt
	}
	if t.IsZero() {
		t = ti.UpdatedAt
	}
	return t
}

// attemptName names the attempt of a row: "run/task try 1 epoch 0".
func attemptName(a sdk.Attempt) string {
	return fmt.Sprintf("%s/%s try %d epoch %d", a.RunID, a.TaskID, a.Try, a.Epoch)
}

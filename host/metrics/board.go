package metrics

import (
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
)

// boardObserver meters (and, for a refused row, logs) what the board did
// to writes it did not refuse whole: the board.Observer reaperd gives its
// store and writers.
type boardObserver struct {
	log     hclog.Logger
	made    *prometheus.CounterVec
	refused *prometheus.CounterVec
	fenced  *prometheus.CounterVec
}

// BoardObserver returns the board's observer: tenants' text made safe is
// counted by field (reaper_board_text_made_safe_total), a batch's row
// refused alone is counted by write (reaper_board_rows_refused_total) and
// logged with the attempt and PostgreSQL's error, and a fenced write the
// fence refused is counted by write (reaper_fence_refused_total; the
// daemon logs it and steps down). Every call returns the same observer.
func (m *Metrics) BoardObserver(log hclog.Logger) board.Observer {
	return boardObserver{log: log, made: m.textMadeSafe, refused: m.rowsRefused, fenced: m.fenceRefused}
}

func (o boardObserver) Deposed(write string, _ int64) {
	o.fenced.WithLabelValues(write).Inc()
}

// RefusalUnrecorded logs a refusal of the fence that could not be kept in
// the board's fence_refusals (it is counted by Deposed all the same).
func (o boardObserver) RefusalUnrecorded(write string, term int64, err error) {
	o.log.Warn("the board's fence refused a write, and the refusal could not be recorded on the board",
		"write", write, "term", term, "error", err)
}

func newBoardCollectors(m *Metrics) {
	m.textMadeSafe = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "reaper_board_text_made_safe_total",
		Help: "Text written by a task, an agent, a pod or a plugin that held a NUL or invalid UTF-8, or ran past its field's bound, and was stored made safe, by field.",
	}, []string{"field"})
	m.rowsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "reaper_board_rows_refused_total",
		Help: "Requests of a batch write PostgreSQL refused for their own data when written alone, after their batch failed (the rest of the batch was applied), by write.",
	}, []string{"write"})
	m.fenceRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "reaper_fence_refused_total",
		Help: "Fenced writes the board refused because their leadership term no longer led it for this replica (another term, another holder, or the lease run out), by write. Each makes the replica stop leading that term.",
	}, []string{"write"})
	m.Registry.MustRegister(m.textMadeSafe, m.rowsRefused, m.fenceRefused)
}

func (o boardObserver) TextMadeSafe(field board.TextField) {
	o.made.WithLabelValues(string(field)).Inc()
}

func (o boardObserver) RowRefused(write string, a sdk.Attempt, err error) {
	o.refused.WithLabelValues(write).Inc()
	o.log.Warn("the board refused one row of a batch for its own data; the rest of the batch was applied",
		"write", write, "attempt", a.String(), "error", err)
}

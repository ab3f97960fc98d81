package history

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Kind says what an event records.
type Kind string

// The kinds of event.
const (
	KindWrite     Kind = "write"      // a guarded write, applied or refused
	KindExecStart Kind = "exec_start" // an execution began
	KindExecEnd   Kind = "exec_end"   // an execution ended (or was established ended)
	KindFinal     Kind = "final"      // a task's row after the run
	KindFault     Kind = "fault"      // a fault thrown or healed
)

// Outcomes of a write and of an execution the checker gives a meaning to.
// Any other outcome of a write is a refusal, named by the board's word.
const (
	OutcomeApplied = "applied" // the write took effect
	OutcomeDeposed = "deposed" // refused by the fence: the term (or its holder) no longer leads
	OutcomeKilled  = "killed"  // an execution ended without a report of its own
)

// Ops the checker gives a meaning to (see the package documentation).
// Any other op is recorded as the recorder names it.
const (
	OpOverride = "override" // failed (an infra mark) to success, on the same attempt
	OpVerdict  = "verdict"  // an operator's mark: failed to success or failed, on the same attempt
	OpConfirm  = "confirm"  // an infra mark confirmed: failed stays failed
	OpClear    = "clear"    // the operator's clear: may move a settled attempt on
)

// The states an attempt is settled in.
const (
	StateSuccess        = "success"
	StateFailed         = "failed"
	StateUpstreamFailed = "upstream_failed"
	StateSkipped        = "skipped"
)

// Terminal reports whether state settles an attempt.
func Terminal(state string) bool {
	switch state {
	case StateSuccess, StateFailed, StateUpstreamFailed, StateSkipped:
		return true
	}
	return false
}

// Attempt names one attempt of a task: the task (RunID, TaskID) and its
// try and epoch.
type Attempt struct {
	RunID  string `json:"run_id"`
	TaskID string `json:"task_id"`
	Try    int32  `json:"try"`
	Epoch  int32  `json:"epoch"`
}

func (a Attempt) String() string {
	return fmt.Sprintf("%s/%s try %d epoch %d", a.RunID, a.TaskID, a.Try, a.Epoch)
}

// task is the task an attempt belongs to.
func (a Attempt) task() task { return task{a.RunID, a.TaskID} }

// before reports whether a is an earlier attempt of its task than b.
func (a Attempt) before(b Attempt) bool {
	return a.Try < b.Try || (a.Try == b.Try && a.Epoch < b.Epoch)
}

type task struct{ runID, taskID string }

func (t task) String() string { return t.runID + "/" + t.taskID }

// Event is one line of a history. Which fields an event carries depends on
// its kind (see the package documentation); the others are left empty.
type Event struct {
	// Time is when the event happened: a write's answer came back, an
	// execution started or ended, a row was read, a fault was thrown.
	Time time.Time `json:"time"`
	Kind Kind      `json:"kind"`
	// Since is when a write was sent, if the recorder knows (write).
	Since time.Time `json:"since,omitzero"`
	// LostFrom says the board lost every write it had applied from
	// LostFrom to Time: a standby that had stopped receiving them was
	// promoted after its primary was killed at Time (fault).
	LostFrom time.Time `json:"lost_from,omitzero"`
	// Op names the write (write).
	Op string `json:"op,omitempty"`
	// Term is the leadership term the write was fenced by, 0 for a write
	// no term fences (write).
	Term int64 `json:"term,omitempty"`
	// Holder is who held Term by its own account (write with a term).
	Holder string `json:"holder,omitempty"`
	// Attempt is the attempt written (write), executed (exec_start,
	// exec_end) or found on the board (final).
	Attempt *Attempt `json:"attempt,omitempty"`
	// Next is the attempt a write that begins a new execution moved the
	// row to (write).
	Next *Attempt `json:"next,omitempty"`
	// Outcome is OutcomeApplied or the refusal's reason (write), or how
	// the execution ended (exec_end).
	Outcome string `json:"outcome,omitempty"`
	// State is the state the write set, or would have set (write), or the
	// row's state (final).
	State string `json:"state,omitempty"`
	// Exec identifies one execution: a pod's UID, a pid with its start
	// time (exec_start, exec_end).
	Exec string `json:"exec,omitempty"`
	// Note is free text: which fault, which replica (any kind).
	Note string `json:"note,omitempty"`
	// Fence is what the fence met when it refused the write (a write with
	// outcome deposed; refusals.go).
	Fence *Fence `json:"fence,omitempty"`
}

// Writer appends events to a history, one JSON line per event. It is safe
// for concurrent use.
type Writer struct {
	mu     sync.Mutex
	w      io.Writer
	closer io.Closer // the file Open opened, nil for NewWriter
	closed bool
}

// Open opens the history file at path for appending, creating it if need
// be. Each event is written with one write call to a file opened for
// appending, so several processes may record to one file without their
// lines interleaving.
func Open(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("history: open %s: %w", path, err)
	}
	return &Writer{w: f, closer: f}, nil
}

// NewWriter records events to w, one write call per event. Close does not
// close w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Record appends e. An event with no time or no kind is refused: the
// checker could not place it.
func (w *Writer) Record(e Event) error {
	if e.Time.IsZero() || e.Kind == "" {
		return fmt.Errorf("history: record %q event at %v: an event needs a time and a kind", e.Kind, e.Time)
	}
	line, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("history: encode %s event: %w", e.Kind, err)
	}
	line = append(line, '\n')
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return fmt.Errorf("history: record %s event: %w", e.Kind, os.ErrClosed)
	}
	if _, err := w.w.Write(line); err != nil {
		return fmt.Errorf("history: write %s event: %w", e.Kind, err)
	}
	return nil
}

// Close syncs and closes the file Open opened; later Records fail. It is
// safe to call more than once.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	if w.closer == nil {
		return nil
	}
	var err error
	if f, ok := w.closer.(*os.File); ok {
		err = f.Sync()
	}
	if cerr := w.closer.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("history: close: %w", err)
	}
	return nil
}

// maxLine bounds one line of a history.
const maxLine = 1 << 20

// Decode reads a history's events from r, in the order of its lines.
// Blank lines are skipped; a line that is not one event (not JSON, or a
// field the format does not have) is an error naming its line number.
// Whether the events make sense is Check's business.
func Decode(r io.Reader) ([]Event, error) {
	events, err := decode(r)
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	return events, nil
}

func decode(r io.Reader) ([]Event, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), maxLine)
	var events []Event
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var e Event
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if dec.More() {
			return nil, fmt.Errorf("line %d: more than one event", n)
		}
		events = append(events, e)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("a line longer than %d bytes: %w", maxLine, err)
		}
		return nil, fmt.Errorf("read: %w", err)
	}
	return events, nil
}

// Read reads the history file at path (Decode).
func Read(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("history: open %s: %w", path, err)
	}
	defer f.Close()
	events, err := decode(f)
	if err != nil {
		return nil, fmt.Errorf("history: read %s: %w", path, err)
	}
	return events, nil
}

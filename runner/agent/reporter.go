package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// Report events, the "event" field of a FileReporter line.
const (
	EventRunning   = "running"
	EventHeartbeat = "heartbeat"
	EventReport    = "report"
)

// ReportEvent is one line of a FileReporter's file.
type ReportEvent struct {
	Event   string    `json:"event"`
	RunID   string    `json:"run_id"`
	TaskID  string    `json:"task_id"`
	Try     int32     `json:"try"`
	Epoch   int32     `json:"epoch"`
	At      time.Time `json:"at"`
	Outcome *Outcome  `json:"outcome,omitempty"`
	// Terminate is what the reporter answered.
	Terminate bool `json:"should_terminate,omitempty"`
}

// Attempt is the attempt the event names.
func (e ReportEvent) Attempt() sdk.Attempt {
	return sdk.Attempt{RunID: e.RunID, TaskID: e.TaskID, Try: e.Try, Epoch: e.Epoch}
}

// FileReporter is a Reporter that appends one JSON line per call to a file
// and answers should_terminate once a terminate file exists. It is the
// reporter of tests and demos run without a database: the file is the
// attempt's report trail, and creating the terminate file plays the control
// plane telling the attempt to stop. Its failures are answers: none wraps
// ErrUnanswered, as no control plane is there to go unanswered.
type FileReporter struct {
	mu            sync.Mutex
	path          string
	terminateFile string
}

// NewFileReporter appends to path; terminateFile may be "".
func NewFileReporter(path, terminateFile string) *FileReporter {
	return &FileReporter{path: path, terminateFile: terminateFile}
}

// Running appends a running event.
func (f *FileReporter) Running(ctx context.Context, a sdk.Attempt, now time.Time) (bool, error) {
	return f.write(ctx, EventRunning, a, nil, now)
}

// Heartbeat appends a heartbeat event.
func (f *FileReporter) Heartbeat(ctx context.Context, a sdk.Attempt, now time.Time) (bool, error) {
	return f.write(ctx, EventHeartbeat, a, nil, now)
}

// Report appends the outcome.
func (f *FileReporter) Report(ctx context.Context, a sdk.Attempt, o Outcome, now time.Time) (bool, error) {
	return f.write(ctx, EventReport, a, &o, now)
}

func (f *FileReporter) write(ctx context.Context, event string, a sdk.Attempt, o *Outcome, now time.Time) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	term := false
	if f.terminateFile != "" {
		switch _, err := os.Stat(f.terminateFile); {
		case err == nil:
			term = true
		case !errors.Is(err, fs.ErrNotExist):
			return false, fmt.Errorf("reporting %s: reading %s: %w", event, f.terminateFile, err)
		}
	}
	line, err := json.Marshal(ReportEvent{Event: event, RunID: a.RunID, TaskID: a.TaskID, Try: a.Try, Epoch: a.Epoch,
		At: now.UTC(), Outcome: o, Terminate: term})
	if err != nil {
		return false, fmt.Errorf("reporting %s: %w", event, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	file, err := os.OpenFile(f.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return false, fmt.Errorf("reporting %s: %w", event, err)
	}
	_, werr := file.Write(append(line, '\n'))
	cerr := file.Close()
	if err := errors.Join(werr, cerr); err != nil {
		return false, fmt.Errorf("reporting %s to %s: %w", event, f.path, err)
	}
	return term, nil
}

// ReadReportFile reads a FileReporter's file.
func ReadReportFile(path string) ([]ReportEvent, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading report file: %w", err)
	}
	defer file.Close()
	var events []ReportEvent
	sc := bufio.NewScanner(file)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		var e ReportEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return events, fmt.Errorf("reading report file %s: %w", path, err)
		}
		events = append(events, e)
	}
	if err := sc.Err(); err != nil {
		return events, fmt.Errorf("reading report file %s: %w", path, err)
	}
	return events, nil
}

package agent

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/lite/records"
)

// JournalDirEnv names the environment variable that turns the agent's
// journal on: the directory each agent appends its own journal file to.
// Unset (the default), no journal is kept. It is an environment variable,
// not a flag, so that a test harness can turn it on for every agent a
// reaperd spawns without the spawner knowing about it; tasks never inherit
// it.
const JournalDirEnv = "REAPER_AGENT_JOURNAL_DIR"

// Journal events, the "event" field of a journal line.
const (
	JournalAgentStart = "agent_start" // the agent has its go-ahead and its record: it may act from now
	JournalTaskStart  = "task_start"  // the group is recorded; the command is about to be released
	JournalTaskEnd    = "task_end"    // the task's group is gone; the outcome is about to be reported
	JournalAgentExit  = "agent_exit"  // the agent is about to exit
)

// JournalEntry is one line of an agent's journal: the agent's own account
// of when its attempt's task ran, for judging a run of the whole system
// from the processes' side rather than the board's. Wall and Mono are read
// when the line is written: Mono is CLOCK_MONOTONIC, comparable between
// processes of one boot and immune to wall-clock steps.
type JournalEntry struct {
	Event  string `json:"event"`
	RunID  string `json:"run_id"`
	TaskID string `json:"task_id"`
	Try    int32  `json:"try"`
	Epoch  int32  `json:"epoch"`
	// PID is the agent's process id; AgentStart its start time
	// (proc.Info.Start, 0 when unreadable).
	PID        int    `json:"pid"`
	AgentStart uint64 `json:"agent_start,omitempty"`
	// PGID and LeaderStart name the task's group (task_start, task_end).
	PGID        int       `json:"pgid,omitempty"`
	LeaderStart uint64    `json:"leader_start,omitempty"`
	Wall        time.Time `json:"wall"`
	Mono        int64     `json:"mono_ns"`
	// State, Reason and ExitCode are the outcome (task_end) or, for
	// agent_exit, ExitCode is the agent's own exit code.
	State    string `json:"state,omitempty"`
	Reason   string `json:"reason,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
}

// Attempt is the attempt the entry names.
func (e JournalEntry) Attempt() sdk.Attempt {
	return sdk.Attempt{RunID: e.RunID, TaskID: e.TaskID, Try: e.Try, Epoch: e.Epoch}
}

// Journal is one agent's append-only journal file. A nil *Journal records
// nothing, so callers need not check whether the journal is on.
type Journal struct {
	mu   sync.Mutex
	f    *os.File
	a    sdk.Attempt
	pid  int
	path string
}

// OpenJournal opens (creating it) the journal of this agent process for
// attempt a in dir: <dir>/<records.Name(a)>.<pid>.journal, so that two
// agents of one attempt never share a file.
func OpenJournal(dir string, a sdk.Attempt) (*Journal, error) {
	pid := os.Getpid()
	path := filepath.Join(dir, records.Name(a)+"."+strconv.Itoa(pid)+".journal")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the agent journal: %w", err)
	}
	return &Journal{f: f, a: a, pid: pid, path: path}, nil
}

// Path is the journal's file.
func (j *Journal) Path() string {
	if j == nil {
		return ""
	}
	return j.path
}

// Record appends one entry, filling in the attempt, the agent's PID and
// the times. Each entry is one write of one line.
func (j *Journal) Record(e JournalEntry) error {
	if j == nil {
		return nil
	}
	e.RunID, e.TaskID, e.Try, e.Epoch = j.a.RunID, j.a.TaskID, j.a.Try, j.a.Epoch
	e.PID = j.pid
	e.Wall = time.Now().UTC()
	e.Mono = MonoNow()
	line, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("journal %s: %w", e.Event, err)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, err := j.f.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("journal %s: %w", e.Event, err)
	}
	return nil
}

// Close closes the journal file.
func (j *Journal) Close() error {
	if j == nil {
		return nil
	}
	return j.f.Close()
}

// MonoNow reads CLOCK_MONOTONIC in nanoseconds (0 when it cannot be read).
func MonoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Nano()
}

// ReadJournal reads a journal file. A last line cut short (the agent was
// killed while writing it) ends the entries without an error.
func ReadJournal(path string) ([]JournalEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading journal: %w", err)
	}
	defer f.Close()
	var out []JournalEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		var e JournalEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			var syn *json.SyntaxError
			if errors.As(err, &syn) {
				break
			}
			return out, fmt.Errorf("reading journal %s: %w", path, err)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("reading journal %s: %w", path, err)
	}
	return out, nil
}

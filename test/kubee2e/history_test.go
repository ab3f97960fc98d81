package kubee2e_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/lite/proc"
	"github.com/dexaflow/reaper/testkit/boardhistory"
	"github.com/dexaflow/reaper/testkit/history"
)

// Each scenario's fault history (package testkit/history): its database
// records every write with triggers (package testkit/boardhistory,
// installed before any replica starts); at the finish the writes, the
// executions its task logs record, the faults thrown and the board's final
// rows make the history, written to history.jsonl in the scenario's
// directory and judged by the checker. A violation fails the scenario.
//
// A task log's lines (besides execLog's "double") are
//
//	start <try> <epoch> <id> <unix time>
//	end <try> <epoch> <id> <unix time>
//	killed <try> <epoch> <id> <unix time>
//
// where id tells one execution of the attempt from another: on the
// player's tier the task shell's pid (the leader of its process group), on
// the real node the ledger's count of the task's starts. An execution
// killed writes no end line: "killed" is the harness's, written when it
// established the execution gone (the player's tier: the first scan of the
// process table that found its group gone, goneWatch; the real node: the
// moment the scenario tells the ledger the execution can never end,
// ledger.reopen).

// historyFile is the name of a scenario's history in its directory.
const historyFile = "history.jsonl"

// installHistory installs the history triggers in the scenario's board.
func (s *scenario) installHistory() {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*apiTimeout)
	defer cancel()
	if err := boardhistory.Install(ctx, s.pool); err != nil {
		s.t.Fatal(err)
	}
}

// judgeHistory builds the scenario's history once every replica has
// stopped and nothing marked runs, has the checker judge it, fails the
// scenario on each violation and returns the verdict.
func (s *scenario) judgeHistory() (history.Verdict, bool) {
	s.t.Helper()
	if s.gone != nil {
		s.gone.stop() // its last scan is done: what it found gone is written
	}
	faults := make([]boardhistory.Fault, 0, len(s.faults))
	for _, f := range s.faults {
		note := f.what
		if f.run {
			note += " (run " + runID + ")"
		} else if f.target != (sdk.Attempt{}) {
			note += " (" + f.target.String() + ")"
		}
		faults = append(faults, boardhistory.Fault{At: f.at, Note: note})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*apiTimeout)
	defer cancel()
	path := filepath.Join(s.dir, historyFile)
	v, err := boardhistory.JudgeBoard(ctx, s.pool, path, func(boardhistory.Board) ([]boardhistory.Execution, error) {
		var execs []boardhistory.Execution
		for _, ts := range s.tasks {
			xs, err := readExecutions(filepath.Join(s.taskDir, ts.id+".log"), ts.id)
			if err != nil {
				return nil, err
			}
			execs = append(execs, xs...)
		}
		return execs, nil
	}, faults, time.Now())
	if err != nil {
		s.t.Errorf("history: %v", err)
		return history.Verdict{}, false
	}
	s.t.Logf("%s (%s)", v.Summary(), path)
	for _, x := range v.Violations {
		s.t.Errorf("history: %s", x)
	}
	return v, true
}

// logLine is one start, end or killed line of a task log.
type logLine struct {
	kind       string
	try, epoch int32
	id         string
	at         time.Time
}

// parseLogLine reads a start, end or killed line; ok is false for any
// other line (a double, one being written).
func parseLogLine(line string) (logLine, bool) {
	f := strings.Fields(line)
	if len(f) != 5 || (f[0] != "start" && f[0] != "end" && f[0] != "killed") {
		return logLine{}, false
	}
	try, err1 := strconv.ParseInt(f[1], 10, 32)
	epoch, err2 := strconv.ParseInt(f[2], 10, 32)
	at, err3 := parseUnix(f[4])
	if err1 != nil || err2 != nil || err3 != nil {
		return logLine{}, false
	}
	return logLine{kind: f[0], try: int32(try), epoch: int32(epoch), id: f[3], at: at}, true
}

// readExecutions reads the executions of task from its log: each start,
// and its end line or the harness's killed line (none: still running).
func readExecutions(path, task string) ([]boardhistory.Execution, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil // it never ran
	}
	if err != nil {
		return nil, fmt.Errorf("read the executions of %s: %w", task, err)
	}
	defer f.Close()
	var out []boardhistory.Execution
	index := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l, ok := parseLogLine(sc.Text())
		if !ok {
			continue
		}
		key := fmt.Sprintf("%d/%d/%s", l.try, l.epoch, l.id)
		i, seen := index[key]
		switch {
		case l.kind == "start":
			index[key] = len(out)
			out = append(out, boardhistory.Execution{Start: l.at,
				Attempt: sdk.Attempt{RunID: runID, TaskID: task, Try: l.try, Epoch: l.epoch},
				ID:      fmt.Sprintf("%s try %d epoch %d #%s", task, l.try, l.epoch, l.id)})
		case !seen || !out[i].End.IsZero():
			return nil, fmt.Errorf("the log of %s: %q ends no open execution", task, sc.Text())
		case l.kind == "end":
			out[i].End, out[i].Outcome = l.at, "end line"
		default:
			out[i].End, out[i].Outcome, out[i].Note = l.at, history.OutcomeKilled, "no end line; the harness established it gone"
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read the executions of %s: %w", task, err)
	}
	return out, nil
}

// parseUnix parses date +%s.%N.
func parseUnix(s string) (time.Time, error) {
	sec, frac, _ := strings.Cut(s, ".")
	secs, err := strconv.ParseInt(sec, 10, 64)
	if err != nil {
		return time.Time{}, err
	}
	var nanos int64
	if frac != "" {
		frac = (frac + "000000000")[:9]
		if nanos, err = strconv.ParseInt(frac, 10, 64); err != nil {
			return time.Time{}, err
		}
	}
	return time.Unix(secs, nanos), nil
}

// unixStamp is t as date +%s.%N writes it.
func unixStamp(t time.Time) string { return fmt.Sprintf("%d.%09d", t.Unix(), t.Nanosecond()) }

// goneWatch establishes, on the player's tier, when an execution killed
// without its end line ended: every tick it scans the process table for
// the groups of the executions its task logs show open, and appends a
// killed line for each whose group is gone.
type goneWatch struct {
	dir    string
	cancel context.CancelFunc
	done   chan struct{}
}

// goneTick is how often goneWatch scans: an execution is established gone
// at most this long after it ended.
const goneTick = 100 * time.Millisecond

func startGoneWatch(t *testing.T, dir string) *goneWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &goneWatch{dir: dir, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tk := time.NewTicker(goneTick)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				w.scan() // a last look
				return
			case <-tk.C:
				w.scan()
			}
		}
	}()
	t.Cleanup(w.stop)
	return w
}

// stop ends the watch after a last scan; safe to call more than once.
func (w *goneWatch) stop() {
	w.cancel()
	<-w.done
}

// scan appends a killed line for each open execution whose group is gone.
func (w *goneWatch) scan() {
	files, _ := filepath.Glob(filepath.Join(w.dir, "*.log"))
	type logOpen struct {
		path string
		open []logLine
	}
	var all []logOpen
	for _, f := range files {
		if open := openExecutions(f); len(open) > 0 {
			all = append(all, logOpen{f, open})
		}
	}
	if len(all) == 0 {
		return
	}
	g, err := proc.ScanGroups()
	if err != nil {
		return // the next tick looks again
	}
	now := time.Now()
	for _, lo := range all {
		var gone []logLine
		for _, l := range lo.open {
			if pid, err := strconv.Atoi(l.id); err == nil && !g.Running(pid) {
				gone = append(gone, l)
			}
		}
		if len(gone) == 0 {
			continue
		}
		// Read again: an execution that wrote its end line and exited
		// between the read and the scan ended on its own.
		still := map[string]bool{}
		for _, l := range openExecutions(lo.path) {
			still[l.id] = true
		}
		var b strings.Builder
		for _, l := range gone {
			if still[l.id] {
				fmt.Fprintf(&b, "killed %d %d %s %s\n", l.try, l.epoch, l.id, unixStamp(now))
			}
		}
		appendLine(lo.path, b.String())
	}
}

// openExecutions are the starts of a task log with no end or killed line.
func openExecutions(path string) []logLine {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var starts []logLine
	ended := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l, ok := parseLogLine(sc.Text())
		if !ok {
			continue
		}
		key := fmt.Sprintf("%d/%d/%s", l.try, l.epoch, l.id)
		if l.kind == "start" {
			starts = append(starts, l)
			delete(ended, key)
		} else {
			ended[key] = true
		}
	}
	var open []logLine
	for _, l := range starts {
		if !ended[fmt.Sprintf("%d/%d/%s", l.try, l.epoch, l.id)] {
			open = append(open, l)
		}
	}
	return open
}

// appendLine appends text (whole lines) to a task log in one write.
func appendLine(path, text string) {
	if text == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = f.WriteString(text)
}

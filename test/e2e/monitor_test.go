package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dexaflow/reaper/substrate/lite/proc"
)

// Every task of the suite appends a line to its own file when an execution
// starts and when it ends normally:
//
//	start <epoch> <pid> <unix time>
//	end <epoch> <pid> <unix time>
//
// where pid is the task shell's, which leads the execution's process group.
// An execution that is killed writes no end line: the monitor watches its
// group in /proc and takes the last moment it saw a running member as its
// end (a lower bound, so that an overlap it reports is certain).

// execution is one execution of a task, as the monitor saw it.
type execution struct {
	Task  string
	Epoch int
	PID   int
	Start time.Time
	// End is the time of the end line; zero when none was written.
	End time.Time
	// LastSeen is the last scan that found a running member of the group;
	// GoneAt the first that found none.
	LastSeen, GoneAt time.Time
}

// ended reports whether the execution is over: it wrote its end line or its
// group is gone.
func (e execution) ended() bool { return !e.End.IsZero() || !e.GoneAt.IsZero() }

// until is when the execution certainly still ran.
func (e execution) until() time.Time {
	switch {
	case !e.End.IsZero():
		return e.End
	case !e.LastSeen.IsZero():
		return e.LastSeen
	}
	return e.Start
}

func (e execution) String() string {
	end := "running"
	switch {
	case !e.End.IsZero():
		end = "ended " + e.End.Format("15:04:05.000")
	case !e.GoneAt.IsZero():
		end = fmt.Sprintf("killed (seen until %s, gone by %s)", e.LastSeen.Format("15:04:05.000"), e.GoneAt.Format("15:04:05.000"))
	}
	return fmt.Sprintf("%s epoch %d pid %d started %s, %s", e.Task, e.Epoch, e.PID, e.Start.Format("15:04:05.000"), end)
}

// monitor polls the task files of every registered scenario and the
// process table, one scan per tick for all of them.
type monitor struct {
	tick time.Duration

	mu   sync.Mutex
	dirs map[string]map[string]*execution // task dir -> "task/epoch/pid" -> execution
}

func newMonitor(tick time.Duration) *monitor {
	return &monitor{tick: tick, dirs: map[string]map[string]*execution{}}
}

// run polls until ctx is done.
func (m *monitor) run(ctx context.Context) {
	tk := time.NewTicker(m.tick)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
			m.poll()
		}
	}
}

func (m *monitor) watch(dir string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dirs[dir] = map[string]*execution{}
}

func (m *monitor) forget(dir string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.dirs, dir)
}

// executions returns a copy of a dir's executions, by task then start.
func (m *monitor) executions(dir string) []execution {
	m.poll() // the freshest view
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []execution
	for _, e := range m.dirs[dir] {
		out = append(out, *e)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Task != out[j].Task {
			return out[i].Task < out[j].Task
		}
		return out[i].Start.Before(out[j].Start)
	})
	return out
}

func (m *monitor) poll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for dir, execs := range m.dirs {
		readTaskFiles(dir, execs)
	}
	var open []*execution
	for _, execs := range m.dirs {
		for _, e := range execs {
			if e.ended() {
				continue
			}
			open = append(open, e)
		}
	}
	if len(open) == 0 {
		return
	}
	g, err := proc.ScanGroups()
	if err != nil {
		return // the next tick looks again
	}
	now := time.Now()
	for _, e := range open {
		if g.Running(e.PID) {
			e.LastSeen = now
		} else {
			e.GoneAt = now
		}
	}
}

// readTaskFiles reads every <task>.log file of dir into execs.
func readTaskFiles(dir string, execs map[string]*execution) {
	files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, f := range files {
		task := strings.TrimSuffix(filepath.Base(f), ".log")
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range bytes.Split(b, []byte("\n")) {
			fields := strings.Fields(string(line))
			if len(fields) != 4 {
				continue // empty, or a line still being written
			}
			epoch, err1 := strconv.Atoi(fields[1])
			pid, err2 := strconv.Atoi(fields[2])
			at, err3 := parseUnix(fields[3])
			if err1 != nil || err2 != nil || err3 != nil {
				continue
			}
			key := fmt.Sprintf("%s/%d/%d", task, epoch, pid)
			e := execs[key]
			if e == nil {
				e = &execution{Task: task, Epoch: epoch, PID: pid}
				execs[key] = e
			}
			switch fields[0] {
			case "start":
				e.Start = at
			case "end":
				e.End = at
			}
		}
	}
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

// overlaps counts the pairs of executions of the same task that certainly
// ran at the same time.
func overlaps(execs []execution) (int, []string) {
	n := 0
	var what []string
	for i := range execs {
		for j := range execs {
			a, b := execs[i], execs[j]
			if i == j || a.Task != b.Task || b.Start.Before(a.Start) || (b.Start.Equal(a.Start) && j < i) {
				continue
			}
			if b.Start.Before(a.until()) {
				n++
				what = append(what, fmt.Sprintf("%s overlaps %s", b, a))
			}
		}
	}
	return n, what
}

// TestOverlaps checks the double-execution judgment itself on made-up
// executions, since the fault scenarios never produce an overlap.
func TestOverlaps(t *testing.T) {
	at := func(s float64) time.Time { return time.Unix(1000, 0).Add(time.Duration(s * float64(time.Second))) }
	cases := []struct {
		name  string
		execs []execution
		want  int
	}{
		{"one after the other", []execution{
			{Task: "a", Epoch: 0, PID: 10, Start: at(0), LastSeen: at(5), GoneAt: at(5.1)},
			{Task: "a", Epoch: 1, PID: 20, Start: at(6), End: at(7)},
		}, 0},
		{"killed one still seen after the next started", []execution{
			{Task: "a", Epoch: 0, PID: 10, Start: at(0), LastSeen: at(6.5), GoneAt: at(6.6)},
			{Task: "a", Epoch: 1, PID: 20, Start: at(6), End: at(7)},
		}, 1},
		{"ended one whose end line follows the next start", []execution{
			{Task: "a", Epoch: 0, PID: 10, Start: at(0), End: at(3)},
			{Task: "a", Epoch: 1, PID: 20, Start: at(2), End: at(4)},
		}, 1},
		{"still running under a later one", []execution{
			{Task: "a", Epoch: 0, PID: 10, Start: at(0), LastSeen: at(9)},
			{Task: "a", Epoch: 1, PID: 20, Start: at(6), End: at(7)},
			{Task: "a", Epoch: 2, PID: 30, Start: at(8), End: at(8.5)},
		}, 2},
		{"different tasks at once", []execution{
			{Task: "a", Epoch: 0, PID: 10, Start: at(0), End: at(5)},
			{Task: "b", Epoch: 0, PID: 20, Start: at(1), End: at(4)},
		}, 0},
	}
	for _, c := range cases {
		if got, what := overlaps(c.execs); got != c.want {
			t.Errorf("%s: %d overlaps %v, want %d", c.name, got, what, c.want)
		}
	}
	if ts, err := parseUnix("1700000000.123456789"); err != nil || ts.UnixNano() != 1700000000123456789 {
		t.Errorf("parseUnix = %v, %v", ts, err)
	}
}

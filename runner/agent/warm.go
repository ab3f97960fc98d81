package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
)

// Warm attempts apart. Attempts a warm worker runs one after another share
// its uid and its filesystem, so each gets what it may leave behind, and
// the worker takes it back at the attempt's end:
//   - a scratch directory of its own (0700, under the worker's temporary
//     directory), named by TMPDIR, TMP, TEMP and TEMPDIR in the task's
//     environment, removed once the attempt has ended;
//   - its processes: the worker is a child subreaper (prctl
//     PR_SET_CHILD_SUBREAPER; a restricted pod, non-root with no
//     capability, can make neither a cgroup nor a pid namespace, but may
//     do this), so a process that escapes its attempt's group (a double
//     fork and setsid) is reparented to the worker instead of init, and at
//     the attempt's end the worker stops, kills and reaps every descendant
//     it has outside the process trees of the attempts it still runs.
//
// With several slots the worker cannot tell whose an escaped process was
// (it left its attempt's tree): it is ended at the end of whichever
// attempt on the worker ends next.

// ReasonCommandTooLarge: the worker refused a claimed attempt whose command
// the control plane withheld, over the size a command may have.
const ReasonCommandTooLarge = "command_too_large"

// scratchEnv names the scratch directory in a warm task's environment.
var scratchEnv = []string{"TMPDIR", "TMP", "TEMP", "TEMPDIR"}

// newScratch makes an attempt's scratch directory under base ("": the
// worker's temporary directory) and the environment naming it.
func newScratch(base string, a sdk.Attempt) (string, []string, error) {
	if base == "" {
		base = os.TempDir()
	}
	dir, err := os.MkdirTemp(base, "reaper-attempt-")
	if err != nil {
		return "", nil, fmt.Errorf("the scratch directory of %s: %w", a, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, fmt.Errorf("the scratch directory of %s: %w", a, err)
	}
	env := make([]string, 0, len(scratchEnv))
	for _, k := range scratchEnv {
		env = append(env, k+"="+dir)
	}
	return dir, env, nil
}

// removeScratch removes dir and everything in it, the directories a task
// made unwritable included.
func removeScratch(dir string) error {
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(path, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}

// warmTree keeps what a sweep must spare: the task groups of the attempts
// the worker still runs.
type warmTree struct {
	// starting: an attempt between its Run's start and its task's
	// recording holds it shared (its leader is not known yet); a sweep
	// holds it alone.
	starting sync.RWMutex
	mu       sync.Mutex
	leaders  map[int]bool
	// enabled: the worker is a child subreaper; without it, escaped
	// processes go to init and a sweep would find nothing of theirs.
	enabled bool
}

// run runs one claimed attempt apart: in its own scratch directory, its
// leader spared by other attempts' sweeps while it runs, and its escaped
// processes swept once it has ended. A claim whose command was withheld is
// refused instead (failed, command_too_large).
func (w *warmTree) run(ctx context.Context, acfg Config, c Claimed, scratchBase string, log hclog.Logger) (Outcome, error) {
	if c.Refuse != "" {
		return refuseClaimed(ctx, acfg, c, log)
	}
	dir, env, err := newScratch(scratchBase, c.Attempt)
	if err != nil {
		return Outcome{}, err
	}
	acfg.Env = append(append([]string(nil), acfg.Env...), env...)
	var (
		once   sync.Once
		leader int
	)
	w.starting.RLock()
	started := func() { once.Do(w.starting.RUnlock) }
	prev := acfg.OnTaskStarted
	acfg.OnTaskStarted = func(pgid int) {
		w.mu.Lock()
		leader = pgid
		if w.leaders == nil {
			w.leaders = map[int]bool{}
		}
		w.leaders[pgid] = true
		w.mu.Unlock()
		started()
		if prev != nil {
			prev(pgid)
		}
	}
	out, err := Run(ctx, acfg, c.Reporter)
	started()
	w.mu.Lock()
	delete(w.leaders, leader)
	w.mu.Unlock()
	w.sweep(c.Attempt, log)
	if rerr := removeScratch(dir); rerr != nil {
		log.Error("could not remove the attempt's scratch directory", "attempt", c.Attempt.String(), "dir", dir, "error", rerr)
	}
	return out, err
}

// sweep ends every descendant of the worker outside the trees of the
// attempts it still runs (see sweepDescendants).
func (w *warmTree) sweep(a sdk.Attempt, log hclog.Logger) {
	if !w.enabled {
		return
	}
	w.starting.Lock()
	defer w.starting.Unlock()
	w.mu.Lock()
	spare := make(map[int]bool, len(w.leaders))
	for p := range w.leaders {
		spare[p] = true
	}
	w.mu.Unlock()
	n, err := sweepDescendants(spare)
	if n > 0 {
		log.Warn("processes that escaped their attempt's group were ended with it", "attempt", a.String(), "killed", n)
	}
	if err != nil {
		log.Error("could not end every escaped process", "attempt", a.String(), "error", err)
	}
}

// SubreaperForEscapes makes this process a child subreaper, so that a
// process that escapes the task's group (a double fork and setsid) is
// reparented to it; EndEscaped then ends it. It reports whether that took.
func SubreaperForEscapes(log hclog.Logger) bool {
	if err := becomeSubreaper(); err != nil {
		log.Warn("the agent cannot end its task's escaped processes", "error", err)
		return false
	}
	return true
}

// EndEscaped stops, kills and reaps every descendant this process still
// has: a Lite agent's, once its attempt has ended, are the processes its
// task left behind outside its group.
func EndEscaped(a sdk.Attempt, log hclog.Logger) {
	n, err := sweepDescendants(nil)
	if n > 0 {
		log.Warn("processes that escaped their attempt's group were ended with it", "attempt", a.String(), "killed", n)
	}
	if err != nil {
		log.Error("could not end every escaped process", "attempt", a.String(), "error", err)
	}
}

// refuseClaimed fails a claimed attempt the worker will not run: RUNNING
// (its guard lets one execution have it), then the failure.
func refuseClaimed(ctx context.Context, acfg Config, c Claimed, log hclog.Logger) (Outcome, error) {
	var clk clock.Clock = clock.Real{}
	if acfg.Clock != nil {
		clk = acfg.Clock
	}
	log.Error("claimed attempt refused: its command was withheld", "attempt", c.Attempt.String(), "why", c.Refuse)
	term, err := c.Reporter.Running(ctx, c.Attempt, clk.Now())
	switch {
	case err != nil:
		return Outcome{}, fmt.Errorf("refusing %s: reporting running: %w", c.Attempt, err)
	case term:
		return Outcome{}, ErrSuperseded
	}
	out := failed(ReasonCommandTooLarge, -1, c.Refuse)
	if _, err := c.Reporter.Report(ctx, c.Attempt, out, clk.Now()); err != nil {
		return out, fmt.Errorf("refusing %s: reporting the failure: %w", c.Attempt, err)
	}
	return out, nil
}

var errNoSubreaper = errors.New("this platform has no child subreaper")

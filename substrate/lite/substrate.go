// Package lite is the Lite substrate: attempts run as local processes, one
// reaper-agent per attempt, each running its task as the leader of its own
// process group. There are no pods, so the substrate's work is to tell
// whether an attempt's processes are provably gone, and to stop a task group
// only when it is provably the one that was recorded.
//
// What is on disk (package records): the Lite runner's spawner
// (runner/literunner) writes one .pid record per agent (its PID and start
// time) before the agent may start its task; the agent writes one .pgid
// record (group id, its own PID and start time, the leader's start time)
// before the task runs any of its command. The records
// are files, so a restarted server sees the agents it spawned before. A
// server whose record directory changed (another TMPDIR, a cleaned /tmp)
// sees none of them and reads their attempts dead: that can only matter for
// an attempt that is also silent past agent_lost or queued past
// dispatch_lost. Configure only checks the directory (refusing an unsafe
// one) and creates nothing, so that reaperd validate leaves no trace; the
// first read creates a missing directory, with a warning.
//
// Liveness of an attempt (see Substrate.Liveness), read from the .pgid
// record when there is one, else from the .pid record:
//
//   - the agent: alive while its PID exists, is not a zombie and (when the
//     record has the agent's start time) still has that start time; a
//     missing record or a gone PID is dead;
//   - the task group: alive while any process of the recorded group runs
//     (signal 0 to the group, EPERM counting as alive; members that are
//     only zombies run nothing and do not count, which matters on hosts
//     whose init does not reap orphans); a group whose leader PID now has
//     another start time names an unrelated group and is dead; a missing
//     .pgid record is dead;
//   - the attempt: alive if either is alive, else unknown if either is
//     unknown, else dead. Read errors are unknown; a garbled or truncated
//     record, or one naming a PID of 1 or less, is unknown, logged with
//     its path, and never signalled.
//   - Orphan is set only when the agent is dead and the group is alive and
//     verified: its leader is the very process recorded (same PID, same
//     start time, still leading the group).
//
// Records also carry the boot they were written in: a record from another
// boot names processes that cannot exist any more, and reads dead.
//
// What Lite does not cover: an agent alive but wedged (until the credential
// ceiling); PID reuse of an agent recorded without its start time (reads
// alive: a delay, never a false reap); a descendant that left the group with
// setsid (it neither keeps the attempt alive nor is stopped); hosts other
// than Linux and macOS, where groups read unknown and the reapers defer.
package lite

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/substrate/lite/proc"
	"github.com/dexaflow/reaper/substrate/lite/records"
)

// Name is the substrate's configuration label.
const Name = "lite"

// Version is the plugin's version.
const Version = "0.1.0"

// Configuration attributes.
const (
	AttrRecordDir = "record_dir"
	AttrStopGrace = "stop_grace"
	AttrKillWait  = "kill_wait"
)

// Substrate is the Lite substrate. It is safe for concurrent use.
type Substrate struct {
	log   hclog.Logger
	clock clock.Clock

	mu  sync.RWMutex
	cfg *settings // nil until Configure

	// Stops in flight, by attempt: a stop outlives the call that began it
	// when the caller cannot wait for its whole grace (see StopOrphan).
	stopsMu sync.Mutex
	stops   map[sdk.Attempt]*stopRun
	stopCtx context.Context // ends the stops in flight on Close
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

type settings struct {
	path      string       // the record directory, absolute
	dir       *records.Dir // nil until first used
	stopGrace time.Duration
	killWait  time.Duration
}

var _ sdk.Substrate = (*Substrate)(nil)

// New returns an unconfigured Lite substrate on the wall clock.
func New(logger hclog.Logger) *Substrate {
	return NewWithClock(logger, clock.Real{})
}

// NewWithClock returns an unconfigured Lite substrate whose stop deadlines
// come from clk.
func NewWithClock(logger hclog.Logger, clk clock.Clock) *Substrate {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Substrate{log: logger, clock: clk, stops: map[sdk.Attempt]*stopRun{}, stopCtx: ctx, cancel: cancel}
}

// Close abandons the stops in flight (a signal already sent stays sent)
// and waits for their goroutines. A plugin process is killed by its host
// instead; Close is for a substrate used in process.
func (s *Substrate) Close() {
	s.cancel()
	s.wg.Wait()
}

// Info describes the plugin.
func (s *Substrate) Info(context.Context) (sdk.Info, error) {
	return sdk.Info{
		Name:        Name,
		Kind:        sdk.KindSubstrate,
		Version:     Version,
		Editions:    []string{ladder.EditionLite},
		Description: "local processes: one reaper-agent per attempt, liveness from PID and process-group records",
	}, nil
}

// ConfigSchema declares the substrate "lite" block.
func (s *Substrate) ConfigSchema(context.Context) (sdk.Schema, error) {
	return sdk.Schema{Attributes: []sdk.Attribute{
		{
			Name: AttrRecordDir, Type: sdk.TypeString, Default: "",
			Description: "directory of the agents' .pid and .pgid records; empty: $TMPDIR/dexaflow-agent-pids-<uid>. " +
				"Refused if a symlink, owned by another user, or writable by group or others.",
		},
		{
			Name: AttrStopGrace, Type: sdk.TypeDuration, Default: ladder.OrphanStopGrace.String(),
			Description: "how long a stopped task group gets after SIGTERM before SIGKILL",
		},
		{
			Name: AttrKillWait, Type: sdk.TypeDuration, Default: ladder.OrphanKillWait.String(),
			Description: "how long to wait for a task group after SIGKILL",
		},
	}}, nil
}

// Configure checks the record directory when it exists (it is created at
// first use otherwise: configuring has no side effect) and takes the stop
// durations.
func (s *Substrate) Configure(ctx context.Context, req sdk.ConfigureRequest) error {
	if req.Edition != "" && req.Edition != ladder.EditionLite {
		return fmt.Errorf("configuring the lite substrate: edition %q: it serves only %q", req.Edition, ladder.EditionLite)
	}
	schema, _ := s.ConfigSchema(ctx)
	v := schema.WithDefaults(req.Values)
	grace, err := v.Duration(AttrStopGrace)
	if err != nil {
		return fmt.Errorf("configuring the lite substrate: %w", err)
	}
	killWait, err := v.Duration(AttrKillWait)
	if err != nil {
		return fmt.Errorf("configuring the lite substrate: %w", err)
	}
	if grace <= 0 || killWait <= 0 {
		return fmt.Errorf("configuring the lite substrate: %s (%s) and %s (%s) must be positive",
			AttrStopGrace, grace, AttrKillWait, killWait)
	}
	path, err := records.Resolve(v.String(AttrRecordDir))
	if err != nil {
		return fmt.Errorf("configuring the lite substrate: %w", err)
	}
	if _, err := os.Lstat(path); err == nil {
		if err := records.Check(path); err != nil {
			return fmt.Errorf("configuring the lite substrate: %w", err)
		}
	}
	s.mu.Lock()
	s.cfg = &settings{path: path, stopGrace: grace, killWait: killWait}
	s.mu.Unlock()
	s.log.Info("lite substrate configured", "record_dir", path, "stop_grace", grace, "kill_wait", killWait)
	return nil
}

// settings returns the configuration, opening the record directory on first
// use (and creating it when it is missing).
func (s *Substrate) settings() (*settings, error) {
	s.mu.RLock()
	st := s.cfg
	s.mu.RUnlock()
	if st == nil {
		return nil, fmt.Errorf("lite substrate: not configured")
	}
	if st.dir != nil {
		return st, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg.dir == nil {
		dir, err := records.Open(s.cfg.path)
		if err != nil {
			return nil, fmt.Errorf("lite substrate: %w", err)
		}
		if dir.Created {
			s.log.Warn("record directory is new: agents spawned earlier under another directory are invisible and read as gone",
				"record_dir", dir.Path())
		}
		next := *s.cfg
		next.dir = dir
		s.cfg = &next
	}
	return s.cfg, nil
}

// Records is the configured record directory (nil before Configure).
func (s *Substrate) Records() *records.Dir {
	st, err := s.settings()
	if err != nil {
		return nil
	}
	return st.dir
}

// Sweep is Lite's housekeeping: there are no pods whose outcome could be
// recovered, but the records of agents that died without cleaning up after
// themselves (kill -9, a crash, the OOM killer) are pruned (see Prune), so
// a host that runs for months does not collect one pair of files per lost
// agent. A dry run prunes nothing.
func (s *Substrate) Sweep(ctx context.Context, req sdk.SweepRequest, _ sdk.Board) (sdk.SweepResult, error) {
	if req.DryRun {
		return sdk.SweepResult{}, nil
	}
	if _, err := s.Prune(ctx, req.Now.Add(-req.Ladder.AgentLost)); err != nil {
		s.log.Warn("pruning the record directory failed", "error", err)
	}
	return sdk.SweepResult{}, nil
}

// Synced is always true: Lite has no cache; every answer is a live read.
func (s *Substrate) Synced(context.Context) (bool, error) { return true, nil }

// Teardown does nothing and says so. Lite reapers fail only an attempt
// whose agent is already dead, and stop an orphaned task group with
// StopOrphan before they reap, so after a reap nothing of the attempt is
// left to tear down; a run failed by the orphan-run reaper stops any agent
// still attached to it through should_terminate. The server never signals
// an agent.
func (s *Substrate) Teardown(_ context.Context, req sdk.TeardownRequest) ([]sdk.TeardownOutcome, error) {
	object := "run " + req.RunID
	if req.Attempt != nil {
		object = req.Attempt.String()
	}
	return []sdk.TeardownOutcome{{Object: object, Action: sdk.TeardownNothing}}, nil
}

// WarmWorkers lists nothing: Lite has no warm pool.
func (s *Substrate) WarmWorkers(context.Context) ([]sdk.WarmWorker, error) {
	return nil, nil
}

// Prune removes the records of attempts of which nothing is left: the
// agent and the recorded task group both read dead on a fresh read, and no
// record of the attempt was written after writtenBefore (so a record an
// agent is writing this instant is never judged). A record that cannot be
// read, a liveness that is unknown, a group whose leader exited while other
// members run on (it reads alive): each keeps its records. Removing a dead
// attempt's records changes no answer: a missing record reads dead too. It
// returns the attempts whose records it removed.
func (s *Substrate) Prune(ctx context.Context, writtenBefore time.Time) ([]sdk.Attempt, error) {
	st, err := s.settings()
	if err != nil {
		return nil, err
	}
	entries, garbled, err := st.dir.List()
	if err != nil {
		return nil, err
	}
	if garbled > 0 {
		s.log.Warn("record directory holds records that cannot be read: left alone", "count", garbled)
	}
	b := &batch{dir: st.dir, log: s.log}
	if boot, err := proc.BootID(); err == nil {
		b.boot = boot
	}
	f := b.facts(false)
	var pruned []sdk.Attempt
	for _, e := range entries {
		if ctx.Err() != nil {
			break
		}
		if !e.Modified.Before(writtenBefore) {
			continue
		}
		if l := f.probe(e.Attempt); l.State != sdk.Dead {
			continue
		}
		if err := st.dir.Remove(e.Attempt); err != nil {
			s.log.Warn("could not prune a dead attempt's records", "attempt", e.Attempt.String(), "error", err)
			continue
		}
		pruned = append(pruned, e.Attempt)
	}
	if len(pruned) > 0 {
		s.log.Info("pruned the records of attempts with nothing left running", "count", len(pruned))
	}
	return pruned, nil
}

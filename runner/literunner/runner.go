// Package literunner is the Lite runner: the smallest real scheduler that the
// reapers need around them on Lite. On the leader, every cycle (RunOnce)
// drives the task instances of the Lite executor through the board's
// writers (package board/lifecycle), in a fixed order:
//
//  1. release: a task failure with retries left (or an attempt parked
//     up_for_retry) starts its next try on the retry rail; one parked
//     up_for_reschedule starts its next poke on the reschedule rail; an
//     infra failure is re-placed on the infra budget (a new epoch, the
//     task's retries untouched) once its mark is confirmed — Lite marks are
//     confirmed as made — or, unconfirmed, once the infra confirmation valve
//     has passed since the mark (infra_confirm_valve_open); with the budget
//     spent it is failed for good (infra_budget_spent). An attempt held for
//     review is never moved: an operator releases the hold first.
//  2. schedule: task instances in state none, of running runs, whose
//     upstreams all succeeded become scheduled; those an upstream failed
//     for good are settled upstream_failed, those behind a skipped one
//     skipped (see board/lifecycle's SettleBlocked).
//  3. dispatch: scheduled task instances become queued (stamping queued_at)
//     and get an agent each, started through the Lite spawner with a
//     credential minted for the attempt (the agent reports to reaperd's
//     attempt API with it; the board's connection string never reaches an
//     agent), up to MaxParallel queued plus running attempts, into the
//     open slots of each task's pool and under its run's max_active_tasks,
//     a recovery dispatch (a retry, a re-place) only as its pool's
//     recovery budget admits it. An
//     agent that cannot be started is a dispatch failure, judged like a
//     refused pod create: a passing shortage (no process slot, memory,
//     descriptor or disk) is offered again on the dispatch-failure backoff
//     rail for DispatchUnavailableWindow (dispatch_unavailable), then fails
//     (dispatch_unavailable_exhausted); any other error fails at once. Both
//     failures are infra failures with the terminal reason dispatch_failed:
//     not re-placed, no retry spent, over until a clear.
//  4. finalize: a running run whose task instances are all settled finishes
//     success when they all succeeded (or were skipped), else failed, each
//     a decision (run_finalized_success, run_finalized_failed).
//
// Agents are detached from the runner and outlive it (and reaperd). The
// runner is their parent, so it waits for each one it spawned once the
// process has exited, which costs no goroutine: nothing ever blocks on a live
// agent, and stopping the runner leaves the agents running.
//
// The runner is the scheduler's side of Lite, not part of the substrate: it
// creates executions, where the substrate plugin only observes and stops
// them. The two meet in the record directory, which the host resolves once
// from its configuration and hands to both.
package literunner

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/runner/internal/steps"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/lite/proc"
	"github.com/dexaflow/reaper/substrate/lite/records"
)

// Name is the runner's name in its decisions (sdk.Decision.Reaper) and logs.
const Name = "runner"

// Runner is the Lite runner. RunOnce and ReapAgents are safe to call
// concurrently with each other.
type Runner struct {
	cfg     Config
	w       *lifecycle.Writer
	spawner *Spawner
	dir     *records.Dir
	ownsDir bool
	log     hclog.Logger
	steps   steps.Driver

	mu     sync.Mutex
	agents map[sdk.Attempt]*Agent // spawned and not yet waited for

	// dispatched: attempts this runner queued whose running report it has
	// not seen yet (the dispatch latency is measured on the tick that finds
	// them running). Used by RunOnce only.
	dispatched steps.Dispatches
}

// New checks the configuration, opens the record directory when the
// configuration names none already open, and finds the agent binary.
func New(cfg Config, w *lifecycle.Writer) (*Runner, error) {
	if w == nil {
		return nil, errors.New("lite runner: no board writer")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	dir, owns := cfg.Records, false
	if dir == nil {
		if dir, err = records.Open(cfg.RecordDir); err != nil {
			return nil, fmt.Errorf("lite runner: %w", err)
		}
		owns = true
	}
	sp, err := NewSpawner(SpawnerConfig{
		AgentPath: cfg.AgentPath, Records: dir, LogDir: cfg.LogDir, RunAs: cfg.RunAs, Logger: cfg.Logger.Named("spawner"),
	})
	if err != nil {
		if owns {
			dir.Close()
		}
		return nil, fmt.Errorf("lite runner: %w", err)
	}
	return &Runner{
		cfg: cfg, w: w, spawner: sp, dir: dir, ownsDir: owns, log: cfg.Logger,
		steps: steps.Driver{
			W: w, Executor: sdk.ExecutorLite, Name: Name, Valve: cfg.Ladder.InfraConfirmValve,
			MaxActiveRuns: cfg.MaxActiveRuns, DispatchUnavailableWindow: cfg.DispatchUnavailableWindow, Log: cfg.Logger,
			Pools: cfg.Pools, Heartbeat: cfg.Heartbeat, Recovery: steps.NewRecovery(cfg.Recovery),
			PoolReads: &steps.PoolReads{},
		},
		agents: map[sdk.Attempt]*Agent{},
	}, nil
}

// Close releases the record directory when the runner opened it. It stops
// no agent. Call it after Run has returned.
func (r *Runner) Close() error {
	if !r.ownsDir {
		return nil
	}
	if err := r.dir.Close(); err != nil {
		return fmt.Errorf("lite runner: closing the record directory: %w", err)
	}
	return nil
}

// Result reports one cycle.
type Result struct {
	At time.Time // the cycle's now
	// Term is the leadership term the cycle's writes were fenced by (0:
	// none), which its decisions are audited under.
	Term int64
	// AgentsExited counts agents this runner spawned that were found exited
	// and waited for.
	AgentsExited int
	Dispatched   int // scheduled -> queued, with an agent started
	// Took is how long the cycle took (the runner's clock).
	Took time.Duration
	// Tally counts the shared steps (release, schedule, finalize, dispatch
	// failures), holds the dispatch latencies measured and the decisions
	// made, for the host to meter and audit.
	steps.Tally
}

// Changed reports whether the cycle wrote or reaped anything.
func (res Result) Changed() bool {
	return res.AgentsExited+res.Scheduled+res.Dispatched+res.Retried+res.Rescheduled+res.Replaced+
		res.OfferedAgain+res.Failed+res.Finalized+len(res.RunsStarted) > 0 || len(res.Decisions) > 0
}

// NeedsLeadership is true: the runner writes under the elector's term, so
// the host stops it before the elector resigns.
func (r *Runner) NeedsLeadership() bool { return true }

// Run runs a cycle every Interval until ctx is done: RunOnce while
// Config.Leading reports true at the tick, otherwise only ReapAgents (a
// replica that lost the lead still waits for the agents it spawned). Ticks
// missed by a long cycle are coalesced. Start Run on a goroutine of the
// caller's; it returns nil once ctx is done, leaving every agent running,
// and an error at once without Config.Leading.
func (r *Runner) Run(ctx context.Context) error {
	leading := r.cfg.Leading
	if leading == nil {
		return errors.New("lite runner: Run needs Config.Leading")
	}
	tk := r.cfg.Clock.NewTicker(r.cfg.Interval)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tk.C():
		}
		now := r.cfg.Clock.Now()
		term, ok := leading(now)
		if !ok {
			r.ReapAgents()
			continue
		}
		res, err := r.RunOnceFenced(ctx, now, term)
		if err != nil && ctx.Err() == nil {
			r.steps.CycleFailed(err)
		}
		r.cfg.Meter.RunnerCycle(res.Cycle(res.Took, r.cfg.Pools))
		if r.cfg.OnResult != nil {
			r.cfg.OnResult(res)
		}
	}
}

// shared adapts a shared step to RunOnce's steps.
func (r *Runner) shared(step func(context.Context, time.Time, *steps.Tally) error) func(context.Context, time.Time, *Result) error {
	return func(ctx context.Context, now time.Time, res *Result) error { return step(ctx, now, &res.Tally) }
}

// RunOnce runs one cycle at now: release, schedule, dispatch, finalize (see
// the package documentation), after waiting for the agents that exited. It
// must run on the leader only, and its writes are not fenced: Run fences
// them (RunOnceFenced). On an error it stops where it was: what was written
// stays, and the next cycle picks up from the board.
func (r *Runner) RunOnce(ctx context.Context, now time.Time) (Result, error) {
	return r.RunOnceFenced(ctx, now, 0)
}

// RunOnceFenced is RunOnce with every board write of the cycle fenced by
// the leadership term (lifecycle.Writer.Fenced): once term no longer leads
// the board, the cycle writes nothing more and ends with an error that
// wraps lifecycle.ErrDeposed. A term of 0 fences nothing.
func (r *Runner) RunOnceFenced(ctx context.Context, now time.Time, term int64) (Result, error) {
	res := Result{At: now, Term: term, AgentsExited: r.reapExited()}
	d := r.steps
	d.W = r.w.Fenced(term)
	phases := []struct {
		name string
		run  func(context.Context, time.Time, *Result) error
	}{
		{"release", r.shared(d.Release)},
		{"start", r.shared(d.StartRuns)},
		{"schedule", r.shared(d.Schedule)},
		{"dispatch", func(ctx context.Context, now time.Time, res *Result) error { return r.dispatch(ctx, d, now, res) }},
		{"observe", r.observeDispatches},
		{"finalize", r.shared(d.Finalize)},
		{"pools", r.shared(d.ReadPools)},
	}
	var err error
	for _, s := range phases {
		if err = s.run(ctx, now, &res); err != nil {
			err = fmt.Errorf("lite runner: %s: %w", s.name, err)
			break
		}
	}
	res.Took = r.cfg.Clock.Now().Sub(now)
	if res.Changed() {
		r.log.Info("lite runner cycle", "runs_started", len(res.RunsStarted), "runs_waiting", res.RunsWaiting,
			"scheduled", res.Scheduled, "dispatched", res.Dispatched,
			"retried", res.Retried, "rescheduled", res.Rescheduled, "replaced", res.Replaced,
			"offered_again", res.OfferedAgain, "failed", res.Failed, "finalized", res.Finalized,
			"waiting", res.Waiting, "agents_exited", res.AgentsExited)
	}
	return res, err
}

// observeDispatches measures the dispatch latency of the attempts this
// runner queued that have since reported running. An attempt that never
// reports running is forgotten once the dispatch-lost threshold and a tick
// have passed: it is the reapers' then.
func (r *Runner) observeDispatches(ctx context.Context, now time.Time, res *Result) error {
	return r.dispatched.Observe(ctx, r.w, now, r.cfg.Ladder.DispatchLost+r.cfg.Interval, &res.Tally)
}

// dispatch queues scheduled task instances and starts their agents, within
// MaxParallel.
func (r *Runner) dispatch(ctx context.Context, d steps.Driver, now time.Time, res *Result) error {
	return d.Dispatch(ctx, now, &res.Tally, r.cfg.MaxParallel, func(ctx context.Context, ti board.TaskInstance) (bool, error) {
		return r.dispatchOne(ctx, d, ti, now, res)
	})
}

// dispatchOne queues one attempt and starts its agent. It reports whether an
// agent was started.
func (r *Runner) dispatchOne(ctx context.Context, d steps.Driver, ti board.TaskInstance, now time.Time, res *Result) (bool, error) {
	a := ti.Attempt
	if err := ctx.Err(); err != nil {
		return false, err
	}
	// Queued first: the agent's RUNNING report is accepted only from queued.
	ok, err := d.W.Queue(ctx, a, now)
	if err != nil || !ok {
		return false, err
	}
	// The attempt's credential, minted now and recorded: its age is what
	// the credential ceiling and start_expired measure.
	cred, err := r.cfg.Credentials.Mint(a, now)
	if err != nil {
		return false, r.spawnFailed(ctx, d, ti, err, now, res)
	}
	if _, err := d.W.RecordMint(ctx, a, cred.Claims.MintedAt); err != nil {
		return false, err
	}
	ag, err := r.spawner.Spawn(ctx, SpawnRequest{
		Invocation: agent.Invocation{
			Attempt:            a,
			Command:            ti.Command,
			ExecutionTimeout:   ti.ExecutionTimeout,
			Heartbeat:          r.cfg.Heartbeat,
			Reporter:           agent.ReporterAPI,
			LogLevel:           r.cfg.AgentLogLevel,
			RescheduleExitCode: rescheduleExitCode(ti),
			EndEscaped:         true,
		},
		Env: cred.Env,
	})
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			// Stopping, not a verdict on the dispatch: the attempt stays
			// queued without an agent, which is what the dispatch-lost
			// reaper settles.
			return false, fmt.Errorf("dispatching %s: %w", a, cerr)
		}
		return false, r.spawnFailed(ctx, d, ti, err, now, res)
	}
	r.mu.Lock()
	r.agents[a] = ag
	r.mu.Unlock()
	r.dispatched.Queued(a, now)
	res.Dispatched++
	return true, nil
}

// spawnFailed settles a queued attempt whose agent could not be started.
func (r *Runner) spawnFailed(ctx context.Context, d steps.Driver, ti board.TaskInstance, spawnErr error, now time.Time, res *Result) error {
	return d.DispatchFailed(ctx, steps.DispatchFailure{
		TI: ti, Err: spawnErr, What: "the agent could not be started",
		Move:        decideSpawnFailure(spawnErr, ti.DispatchUnavailableSince, now, r.cfg.DispatchUnavailableWindow),
		AgainDetail: "the agent could not be started for now: offering the task again",
	}, now, &res.Tally)
}

// ReapAgents waits for every agent this runner spawned whose process has
// exited; it never blocks on a live one. It returns how many are still
// running. Run calls it on every tick; a host that drives RunOnce itself
// needs nothing else (RunOnce calls it first).
func (r *Runner) ReapAgents() int {
	r.reapExited()
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.agents)
}

// reapExited waits for the exited agents and returns how many there were.
// An agent has exited when the OS shows it a zombie (or gone); on a platform
// where that cannot be read (neither Linux nor macOS) the agents stay
// unreaped until this process exits.
func (r *Runner) reapExited() int {
	r.mu.Lock()
	var exited []*Agent
	for a, ag := range r.agents {
		info, err := proc.Stat(ag.PID)
		if (err == nil && info.Zombie) || errors.Is(err, proc.ErrNotExist) {
			exited = append(exited, ag)
			delete(r.agents, a)
		}
	}
	r.mu.Unlock()
	for _, ag := range exited {
		st, err := ag.Wait() // returns at once: the process has exited
		switch {
		case err != nil:
			r.log.Warn("could not wait for an agent", "attempt", ag.Attempt.String(), "pid", ag.PID, "error", err)
		case st == nil:
		case st.ExitCode() == -1:
			r.log.Warn("agent ended by a signal", "attempt", ag.Attempt.String(), "pid", ag.PID, "state", st.String())
		case st.ExitCode() == 3:
			r.log.Info("agent did not start its task: the attempt had moved on", "attempt", ag.Attempt.String(), "pid", ag.PID)
		case st.ExitCode() > 1:
			// 0 and 1 are a reported success and failure; the others say
			// the attempt did not run or could not report (see reaper-agent).
			r.log.Warn("agent exited without a normal report", "attempt", ag.Attempt.String(), "pid", ag.PID,
				"exit_code", st.ExitCode(), "log", ag.Log)
		}
	}
	return len(exited)
}

// rescheduleExitCode is the exit code by which the task's poke asks for
// its next one: a sensor's only (0: none).
func rescheduleExitCode(ti board.TaskInstance) int {
	if ti.Sensor.Declared {
		return agent.SensorRescheduleExitCode
	}
	return 0
}

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
//  2. schedule: task instances in state none, of running runs, become
//     scheduled (tasks of a run do not depend on each other here).
//  3. dispatch: scheduled task instances become queued (stamping queued_at)
//     and get an agent each, started through the Lite spawner with a
//     credential minted for the attempt (the agent reports to reaperd's
//     attempt API with it; the board's connection string never reaches an
//     agent), up to MaxParallel queued plus running attempts. An
//     agent that cannot be started is a dispatch failure, judged like a
//     refused pod create: a passing shortage (no process slot, memory,
//     descriptor or disk) is offered again on the dispatch-failure backoff
//     rail for DispatchUnavailableWindow (dispatch_unavailable), then fails
//     (dispatch_unavailable_exhausted); any other error fails at once. Both
//     failures are infra failures with the terminal reason dispatch_failed:
//     not re-placed, no retry spent, over until a clear.
//  4. finalize: a running run whose task instances are all settled finishes
//     success when they all succeeded (or were skipped), else failed.
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
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/substrate/lite"
	"github.com/dexaflow/reaper/substrate/lite/agent"
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
	spawner *lite.Spawner
	dir     *records.Dir
	ownsDir bool
	log     hclog.Logger

	mu     sync.Mutex
	agents map[sdk.Attempt]*lite.Agent // spawned and not yet waited for

	// dispatched: attempts this runner queued whose running report it has
	// not seen yet, with when they were queued (the dispatch latency is
	// measured on the tick that finds them running). Used by RunOnce only.
	dispatched map[sdk.Attempt]time.Time
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
	sp, err := lite.NewSpawner(lite.SpawnerConfig{
		AgentPath: cfg.AgentPath, Records: dir, LogDir: cfg.LogDir, Logger: cfg.Logger.Named("spawner"),
	})
	if err != nil {
		if owns {
			dir.Close()
		}
		return nil, fmt.Errorf("lite runner: %w", err)
	}
	return &Runner{
		cfg: cfg, w: w, spawner: sp, dir: dir, ownsDir: owns, log: cfg.Logger,
		agents: map[sdk.Attempt]*lite.Agent{}, dispatched: map[sdk.Attempt]time.Time{},
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
	// AgentsExited counts agents this runner spawned that were found exited
	// and waited for.
	AgentsExited int
	Scheduled    int // none -> scheduled
	Dispatched   int // scheduled -> queued, with an agent started
	Retried      int // retry rail
	Rescheduled  int // reschedule rail
	Replaced     int // infra re-place rail
	OfferedAgain int // dispatch-failure backoff rail
	// Failed counts attempts the runner failed for good: infra budget
	// spent, dispatch failed, up_for_retry without retries.
	Failed    int
	Finalized int // runs finished
	// Waiting counts unconfirmed infra marks still inside their valve.
	Waiting int
	// RunsStarted lists the queued runs started under the run start cap;
	// RunsWaiting counts the queued runs still waiting on it.
	RunsStarted []string
	RunsWaiting int
	// Took is how long the cycle took (the runner's clock).
	Took time.Duration
	// DispatchLatencies are the times from queueing to the running report
	// of the attempts this cycle found running; FinalizeLatencies the times
	// from each finished run's last task end to its finalization.
	DispatchLatencies []time.Duration
	FinalizeLatencies []time.Duration
	// Finished lists the runs finished, by run id.
	Finished []lifecycle.FinishedRun
	// Decisions are the judgments made, for the host to meter and audit.
	Decisions []sdk.Decision
}

// Changed reports whether the cycle wrote or reaped anything.
func (res Result) Changed() bool {
	return res.AgentsExited+res.Scheduled+res.Dispatched+res.Retried+res.Rescheduled+res.Replaced+
		res.OfferedAgain+res.Failed+res.Finalized+len(res.RunsStarted) > 0 || len(res.Decisions) > 0
}

// Run runs a cycle every Interval until ctx is done: RunOnce while leading
// reports true at the tick, otherwise only ReapAgents (a replica that lost
// the lead still waits for the agents it spawned). Ticks missed by a long
// cycle are coalesced. leading is required (the host's leadership status).
// Start Run on a goroutine of the caller's; it returns once ctx is done,
// leaving every agent running.
func (r *Runner) Run(ctx context.Context, leading func(now time.Time) bool) {
	tk := r.cfg.Clock.NewTicker(r.cfg.Interval)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C():
		}
		now := r.cfg.Clock.Now()
		if !leading(now) {
			r.ReapAgents()
			continue
		}
		res, err := r.RunOnce(ctx, now)
		if err != nil && ctx.Err() == nil {
			r.log.Error("lite runner cycle failed; the next cycle tries again", "error", err)
		}
		if r.cfg.OnResult != nil {
			r.cfg.OnResult(res)
		}
	}
}

// RunOnce runs one cycle at now: release, schedule, dispatch, finalize (see
// the package documentation), after waiting for the agents that exited. It
// must run on the leader only. On an error it stops where it was: what was
// written stays, and the next cycle picks up from the board.
func (r *Runner) RunOnce(ctx context.Context, now time.Time) (Result, error) {
	res := Result{At: now, AgentsExited: r.reapExited()}
	steps := []struct {
		name string
		run  func(context.Context, time.Time, *Result) error
	}{
		{"release", r.release},
		{"start", r.startRuns},
		{"schedule", r.schedule},
		{"dispatch", r.dispatch},
		{"observe", r.observeDispatches},
		{"finalize", r.finalize},
	}
	var err error
	for _, s := range steps {
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

// decide records one decision and logs it at level.
func (r *Runner) decide(res *Result, level hclog.Level, d sdk.Decision) {
	d.Reaper = Name
	res.Decisions = append(res.Decisions, d)
	args := []any{"decision", d.Label, "applied", d.Applied}
	if d.Attempt.TaskID != "" {
		args = append(args, "attempt", d.Attempt.String())
	}
	for k, v := range d.Evidence {
		args = append(args, k, v)
	}
	r.log.Log(level, d.Detail, args...)
}

// release walks the task instances waiting for a decision.
func (r *Runner) release(ctx context.Context, now time.Time, res *Result) error {
	var after *lifecycle.Key
	for {
		page, err := r.w.ListReleasable(ctx, sdk.ExecutorLite, after, ladder.PageSize)
		if err != nil {
			return err
		}
		for _, ti := range page {
			if err := r.releaseOne(ctx, ti, now, res); err != nil {
				return err
			}
		}
		if len(page) < ladder.PageSize {
			return nil
		}
		last := page[len(page)-1]
		after = &lifecycle.Key{RunID: last.RunID, TaskID: last.TaskID}
	}
}

func (r *Runner) releaseOne(ctx context.Context, ti board.TaskInstance, now time.Time, res *Result) error {
	a := ti.Attempt
	v := decideRelease(ti, now, r.cfg.Ladder.InfraConfirmValve)
	var (
		applied bool
		label   string
		detail  string
		level   = hclog.Info
		ev      = map[string]string{}
	)
	switch v.move {
	case moveNone:
		if v.wait > 0 {
			res.Waiting++
		}
		return nil

	case moveRetry:
		rel, err := r.w.Retry(ctx, a, now)
		if err != nil {
			return err
		}
		applied, label = rel.Applied, sdk.LabelTaskRetry
		ev["retries_left"] = strconv.Itoa(int(ti.Retries))
		ev["failure"] = ti.FailureReason
		detail = "task failure with retries left: next try"
		if rel.Applied {
			res.Retried++
			ev["next"] = rel.Attempt.String()
		} else {
			detail += " not started: " + rel.Reason
		}

	case moveReschedule:
		rel, err := r.w.Reschedule(ctx, a, now)
		if err != nil {
			return err
		}
		if rel.Applied {
			res.Rescheduled++
		}
		return nil

	case moveRetriesSpent:
		ok, err := r.w.Fail(ctx, a, []string{sdk.StateUpForRetry}, lifecycle.Failure{
			Kind: sdk.MarkTask, Reason: ti.FailureReason, Terminal: true,
			Message: "parked for a retry with no retries left: " + ti.ErrorMessage,
		}, now)
		if err != nil {
			return err
		}
		if ok {
			res.Failed++
			r.log.Warn("an attempt parked for a retry had no retries left: failed for good", "attempt", a.String())
		}
		return nil

	case moveReplace:
		rel, err := r.w.Replace(ctx, a, now)
		if err != nil {
			return err
		}
		applied, label = rel.Applied, sdk.LabelInfraReplace
		ev["mark"] = ti.FailureReason
		ev["infra_used"] = strconv.Itoa(int(ti.InfraUsed))
		ev["infra_budget"] = strconv.Itoa(int(ti.InfraBudget))
		detail = "infra failure re-placed on the infra budget"
		if rel.Applied {
			res.Replaced++
			ev["next"] = rel.Attempt.String()
		} else {
			detail += " not done: " + rel.Reason
		}

	case moveBudgetSpent:
		ok, err := r.w.Fail(ctx, a, []string{sdk.StateFailed}, lifecycle.Failure{
			Kind: sdk.MarkInfra, Reason: sdk.LabelInfraBudgetSpent, Terminal: true, Confirm: true,
			Message: fmt.Sprintf("%s: %s with all %d infra re-places spent: %s",
				sdk.LabelInfraBudgetSpent, ti.FailureReason, ti.InfraBudget, ti.ErrorMessage),
		}, now)
		if err != nil {
			return err
		}
		applied, label, level = ok, sdk.LabelInfraBudgetSpent, hclog.Warn
		ev["mark"] = ti.FailureReason
		ev["infra_budget"] = strconv.Itoa(int(ti.InfraBudget))
		detail = "infra failure with its budget spent: failed for good"
		if ok {
			res.Failed++
		}
	}

	if v.valveOpen {
		r.decide(res, hclog.Warn, sdk.Decision{
			Label: sdk.LabelInfraConfirmValveOpen, Attempt: a, Applied: applied,
			Detail: "infra mark still unconfirmed past the confirmation valve: acted on anyway",
			Evidence: map[string]string{
				"marked_at": ti.InfraMarkedAt.UTC().Format(time.RFC3339),
				"valve":     ladder.Format(r.cfg.Ladder.InfraConfirmValve),
			},
		})
	}
	r.decide(res, level, sdk.Decision{Label: label, Attempt: a, Applied: applied, Detail: detail, Evidence: ev})
	return nil
}

// schedule moves every task instance in state none of a running run to
// scheduled.
func (r *Runner) schedule(ctx context.Context, now time.Time, res *Result) error {
	for {
		as, err := r.w.EnqueueNew(ctx, sdk.ExecutorLite, ladder.PageSize, now)
		if err != nil {
			return err
		}
		res.Scheduled += len(as)
		if len(as) < ladder.PageSize {
			return nil
		}
	}
}

// startRuns starts queued runs under the run start cap (MaxActiveRuns),
// oldest first, and counts those still waiting.
func (r *Runner) startRuns(ctx context.Context, now time.Time, res *Result) error {
	for {
		started, waiting, err := r.w.StartQueuedRuns(ctx, r.cfg.MaxActiveRuns, ladder.PageSize, now)
		if err != nil {
			return err
		}
		res.RunsStarted = append(res.RunsStarted, started...)
		res.RunsWaiting = waiting
		for _, id := range started {
			r.log.Info("run started", "run", id, "waiting", waiting)
		}
		if len(started) < ladder.PageSize {
			return nil
		}
	}
}

// observeDispatches finds the attempts this runner queued that have since
// reported running, and measures their dispatch latency. An attempt that
// never reports running is forgotten once the dispatch-lost threshold and
// a tick have passed: it is the reapers' then.
func (r *Runner) observeDispatches(ctx context.Context, now time.Time, res *Result) error {
	if len(r.dispatched) == 0 {
		return nil
	}
	pending := make([]sdk.Attempt, 0, len(r.dispatched))
	for a, at := range r.dispatched {
		if now.Sub(at) > r.cfg.Ladder.DispatchLost+r.cfg.Interval {
			delete(r.dispatched, a)
			continue
		}
		pending = append(pending, a)
	}
	for start := 0; start < len(pending); start += ladder.PageSize {
		seen, err := r.w.RunningSince(ctx, pending[start:min(start+ladder.PageSize, len(pending))])
		if err != nil {
			return err
		}
		for a, t := range seen {
			res.DispatchLatencies = append(res.DispatchLatencies, t[1].Sub(t[0]))
			delete(r.dispatched, a)
		}
	}
	return nil
}

// dispatch queues scheduled task instances and starts their agents, within
// MaxParallel.
func (r *Runner) dispatch(ctx context.Context, now time.Time, res *Result) error {
	slots := -1 // no bound
	if r.cfg.MaxParallel > 0 {
		active, err := r.w.CountActive(ctx, sdk.ExecutorLite)
		if err != nil {
			return err
		}
		slots = max(r.cfg.MaxParallel-active, 0)
	}
	var after *lifecycle.Key
	for slots != 0 {
		limit := ladder.PageSize
		if slots > 0 {
			limit = min(limit, slots)
		}
		page, err := r.w.ListScheduled(ctx, sdk.ExecutorLite, after, limit)
		if err != nil {
			return err
		}
		for _, ti := range page {
			if slots == 0 {
				return nil
			}
			started, err := r.dispatchOne(ctx, ti, now, res)
			if err != nil {
				return err
			}
			if started && slots > 0 {
				slots--
			}
		}
		if len(page) < limit {
			return nil
		}
		last := page[len(page)-1]
		after = &lifecycle.Key{RunID: last.RunID, TaskID: last.TaskID}
	}
	return nil
}

// dispatchOne queues one attempt and starts its agent. It reports whether an
// agent was started.
func (r *Runner) dispatchOne(ctx context.Context, ti board.TaskInstance, now time.Time, res *Result) (bool, error) {
	a := ti.Attempt
	if err := ctx.Err(); err != nil {
		return false, err
	}
	// Queued first: the agent's RUNNING report is accepted only from queued.
	ok, err := r.w.Queue(ctx, a, now)
	if err != nil || !ok {
		return false, err
	}
	// The attempt's credential, minted now and recorded: its age is what
	// the credential ceiling and start_expired measure.
	cred, err := r.cfg.Credentials.Mint(a, now)
	if err != nil {
		return false, r.spawnFailed(ctx, ti, err, now, res)
	}
	if _, err := r.w.RecordMint(ctx, a, cred.Claims.MintedAt); err != nil {
		return false, err
	}
	ag, err := r.spawner.Spawn(ctx, lite.SpawnRequest{
		Invocation: agent.Invocation{
			Attempt:          a,
			Command:          ti.Command,
			ExecutionTimeout: ti.ExecutionTimeout,
			Heartbeat:        r.cfg.Heartbeat,
			Reporter:         agent.ReporterAPI,
			LogLevel:         r.cfg.AgentLogLevel,
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
		return false, r.spawnFailed(ctx, ti, err, now, res)
	}
	r.mu.Lock()
	r.agents[a] = ag
	r.mu.Unlock()
	r.dispatched[a] = now
	res.Dispatched++
	return true, nil
}

// spawnFailed settles a queued attempt whose agent could not be started.
func (r *Runner) spawnFailed(ctx context.Context, ti board.TaskInstance, spawnErr error, now time.Time, res *Result) error {
	a := ti.Attempt
	ev := map[string]string{"error": spawnErr.Error()}
	if !ti.DispatchUnavailableSince.IsZero() {
		ev["unavailable_since"] = ti.DispatchUnavailableSince.UTC().Format(time.RFC3339)
	}
	m := decideSpawnFailure(spawnErr, ti.DispatchUnavailableSince, now, r.cfg.DispatchUnavailableWindow)
	if m == spawnOfferAgain {
		rel, err := r.w.DispatchBackoff(ctx, a, now)
		if err != nil {
			return err
		}
		if rel.Applied {
			res.OfferedAgain++
			ev["next"] = rel.Attempt.String()
		}
		r.decide(res, hclog.Warn, sdk.Decision{
			Label: sdk.LabelDispatchUnavailable, Attempt: a, Applied: rel.Applied, Evidence: ev,
			Detail: "the agent could not be started for now: offering the task again",
		})
		return nil
	}
	label, detail := sdk.LabelDispatchFailed, "the agent could not be started: dispatch failed for good"
	if m == spawnExhausted {
		label = sdk.LabelDispatchUnavailableSpent
		detail = "the agent could not be started for " + ladder.Format(r.cfg.DispatchUnavailableWindow) +
			": dispatch failed for good"
	}
	ok, err := r.w.Fail(ctx, a, []string{sdk.StateQueued}, lifecycle.Failure{
		Kind: sdk.MarkInfra, Reason: sdk.LabelDispatchFailed, Terminal: true, Confirm: true,
		Message: sdk.LabelDispatchFailed + ": " + spawnErr.Error(),
	}, now)
	if err != nil {
		return err
	}
	if ok {
		res.Failed++
	}
	r.decide(res, hclog.Error, sdk.Decision{Label: label, Attempt: a, Applied: ok, Detail: detail, Evidence: ev})
	return nil
}

// finalize finishes the running runs whose task instances are all settled.
func (r *Runner) finalize(ctx context.Context, now time.Time, res *Result) error {
	for {
		runs, err := r.w.FinishSettledRuns(ctx, ladder.PageSize, now)
		if err != nil {
			return err
		}
		for _, f := range runs {
			r.log.Info("run finished", "run", f.RunID, "state", f.State, "unsuccessful", f.Unsuccessful)
		}
		res.Finalized += len(runs)
		res.Finished = append(res.Finished, runs...)
		for _, f := range runs {
			if !f.SettledAt.IsZero() {
				res.FinalizeLatencies = append(res.FinalizeLatencies, now.Sub(f.SettledAt))
			}
		}
		if len(runs) < ladder.PageSize {
			return nil
		}
	}
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
	var exited []*lite.Agent
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

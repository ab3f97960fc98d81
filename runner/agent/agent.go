// Package agent is reaper's agent, the execution side's smallest part: it
// runs one task attempt as the leader of its own process group, records the
// group, heartbeats, enforces the attempt's execution timeout, and reports
// the terminal outcome. The same agent runs as a local process the Lite
// runner spawned, as the task container of a kube runner's pod, and inside
// a warm worker pod (see worker.go); its command is cmd/reaper-agent.
//
// Run is the whole agent as a library function. It talks to the control
// plane only through the Reporter interface, so tests drive it with an
// in-memory reporter and real processes, and the reaper-agent binary plugs
// in the attempt API's client (its production reporter) or the JSON-lines
// FileReporter at the same seam (see Reporter).
//
// RunInPod is the same agent as the task container of a Kubernetes pod: it
// also leaves the attempt's durable outcome record in the container's
// termination message (see pod.go).
//
// The life of one attempt:
//
//  1. RUNNING is reported (retried for up to StartRetry). The attempt API's
//     reporter first exchanges the bootstrap token the runner handed the
//     agent for the attempt's working token (once; a refused exchange is a
//     refusal like any other). An answer of should_terminate means the
//     attempt moved on: the task never starts (ErrSuperseded) and nothing
//     is reported.
//  2. The task, "$SHELL -c COMMAND", is started as the leader of a new process
//     group. It waits on a gate pipe before running COMMAND, so no user code
//     runs until the agent has written the group's .pgid record. If the
//     record cannot be written the gate is closed, the group is killed, and
//     the attempt fails (group_record).
//  3. While the task runs the agent heartbeats every Heartbeat; an answer of
//     should_terminate stops the whole group (SIGTERM, TerminateGrace,
//     SIGKILL). At ExecutionTimeout the whole group is SIGKILLed, which no
//     task can trap, and the attempt fails with
//     "execution_timeout: task exceeded Ns limit".
//  4. After the leader exits the agent drains the output pipe for at most
//     DrainBound: a descendant that still holds it (one that escaped the
//     group with setsid, or a backgrounded process) cannot hold the report
//     back; the agent logs that the last lines may be lost. Output already
//     read is in Output, whatever happened to the task.
//  5. Processes the task left in its group are stopped (SIGTERM, grace,
//     SIGKILL), so nothing runs on that nobody watches.
//  6. The outcome is reported for exactly this (try, epoch); then, once the
//     group is gone, the attempt's records are removed (a missing record
//     reads dead, as does a record of exited processes).
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/internal/runas"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/substrate/kube/podrecord"
	"github.com/dexaflow/reaper/substrate/lite/proc"
	"github.com/dexaflow/reaper/substrate/lite/records"
)

// Reporter is the agent's line to the control plane. Every call names the
// attempt, so the board applies it only while the task instance still holds
// exactly that (try, epoch), and answers should_terminate otherwise.
//
// reaper-agent implements it over reaperd's attempt API, whose server makes
// the board's guarded running, heartbeat and report transitions. The agent
// imports no database code and never holds the database's credentials.
type Reporter interface {
	// Running reports that the attempt starts its task.
	Running(ctx context.Context, a sdk.Attempt, now time.Time) (shouldTerminate bool, err error)
	// Heartbeat reports that the attempt is alive.
	Heartbeat(ctx context.Context, a sdk.Attempt, now time.Time) (shouldTerminate bool, err error)
	// Report reports the attempt's terminal outcome.
	Report(ctx context.Context, a sdk.Attempt, o Outcome, now time.Time) (shouldTerminate bool, err error)
}

// Outcome is an attempt's terminal result.
type Outcome struct {
	State    string `json:"state"`     // sdk.StateSuccess or sdk.StateFailed
	ExitCode int    `json:"exit_code"` // the task's exit code; -1 when killed by a signal or never run
	Reason   string `json:"reason,omitempty"`
	Message  string `json:"message,omitempty"` // the error message: "<reason>: <detail>"
	// OutputLost: a descendant still held the output pipe at the drain
	// bound, so lines it wrote after that are lost.
	OutputLost bool `json:"output_lost,omitempty"`
}

// Failure reasons (the first word of Outcome.Message).
const (
	ReasonExitCode         = "exit_code"            // the task exited non-zero
	ReasonSignal           = "signal"               // the task died of a signal the agent did not send
	ReasonExecutionTimeout = "execution_timeout"    // the agent enforced the declared timeout
	ReasonTerminated       = "terminated"           // the control plane answered should_terminate
	ReasonAgentStopped     = podrecord.AgentStopped // the agent itself was told to stop (the same word its pod record uses)
	ReasonGroupRecord      = "group_record"         // the task's group could not be recorded
	ReasonStartFailed      = "start_failed"         // the task could not be started
	// ReasonWatchdog: a warm worker's attempt watchdog ended the attempt
	// at the credential ceiling (the same reason as the ceiling's reap).
	ReasonWatchdog = sdk.LabelCredentialCeiling
)

// WatchdogMessage is the message of an attempt a warm worker's watchdog
// ended.
const WatchdogMessage = ReasonWatchdog + ": attempt outlived auth.max_attempt_credential_lifetime (the warm worker's attempt watchdog)"

// Errors Run returns besides wrapped causes.
var (
	// ErrSuperseded: RUNNING was answered should_terminate; the task did not
	// start and nothing was reported.
	ErrSuperseded = errors.New("the control plane says the attempt has moved on")
	// ErrNotReported: the outcome could not be delivered within ReportRetry.
	ErrNotReported = errors.New("the outcome could not be reported")
	// ErrStartUnanswered: the RUNNING report went unanswered for all of
	// StartRetry, or until its answer was lost for good (ErrAnswerLost):
	// every failure was one Config.Unanswered counts as an answer that
	// never came (see ControlPlaneUnanswered). The task did not start and
	// nothing was reported.
	ErrStartUnanswered = errors.New("the control plane never answered the pre-start calls")
	// ErrStopUnreported: the agent was stopped (its context cancelled)
	// with StopUnreported set: the task's group is stopped and OnOutcome
	// called, but no outcome is reported.
	ErrStopUnreported = errors.New("the agent was stopped: the outcome is left to whoever stopped it")
	// ErrRefused, wrapped by a Reporter's error, says the control plane
	// refused the call for good (a lapsed or invalid credential): the agent
	// does not retry it. Any other error is retried within its bound.
	ErrRefused = errors.New("the control plane refused the call")
)

// Defaults.
const (
	ShellDefault       = "/bin/sh"
	DrainBoundDefault  = 10 * time.Second
	StartRetryDefault  = 2 * time.Minute
	ReportRetryDefault = 2 * time.Minute
)

// Config is one attempt for Run.
type Config struct {
	// Attempt is the attempt this agent runs.
	Attempt sdk.Attempt
	// Command is the task, run as Shell -c Command. Required.
	Command string
	// Shell runs Command; default ShellDefault.
	Shell string
	// Dir is the task's working directory; "" is the agent's.
	Dir string
	// RunAs, when set, is the user the task runs as (Lite's run_as): its
	// uid, gid and groups, and its HOME, USER and LOGNAME. The agent stays
	// its own user. nil: the task runs as the agent's user.
	RunAs *runas.User
	// Env is added to the agent's environment for the task, after the
	// REAPER_RUN_ID, REAPER_TASK_ID, REAPER_TRY and REAPER_EPOCH variables.
	Env []string
	// Records is the record directory the .pgid record goes to. Required.
	Records *records.Dir
	// Output receives the task's stdout and stderr. Default: io.Discard.
	Output io.Writer

	// ExecutionTimeout is the task's declared limit; 0: none.
	ExecutionTimeout time.Duration
	// Watchdog is a warm worker's attempt watchdog: once the task has run
	// this long its whole group is SIGKILLed, like at the timeout, and the
	// attempt fails as credential_ceiling (WatchdogMessage), a task
	// failure. The worker sets it to what is left of the credential
	// ceiling (ladder.WarmAttemptWatchdog); 0: none.
	Watchdog time.Duration
	// Heartbeat is the heartbeat interval; default the ladder's.
	Heartbeat time.Duration
	// DrainBound is the longest wait for the output pipe after the task's
	// leader exits; default DrainBoundDefault.
	DrainBound time.Duration
	// TerminateGrace is how long a group told to stop gets after SIGTERM;
	// default ladder.OrphanStopGrace.
	TerminateGrace time.Duration
	// KillWait is how long to wait for a group after SIGKILL; default
	// ladder.OrphanKillWait.
	KillWait time.Duration
	// StartRetry bounds the retries of the RUNNING report; default
	// StartRetryDefault.
	StartRetry time.Duration
	// ReportRetry bounds the retries of the terminal report; default
	// ReportRetryDefault.
	ReportRetry time.Duration

	// Clock times every threshold above; default clock.Real.
	Clock clock.Clock
	// Logger is the agent's log; default a null logger.
	Logger hclog.Logger
	// Journal, when set, receives the task's start (once its group is
	// recorded, before its command is released) and its end (once its group
	// is gone, before the outcome is reported). Default: none.
	Journal *Journal
	// OnTaskStarted, when set, is called with the group id once the group is
	// recorded and the task released, after the agent's timers are armed.
	// Tests use it to know when to act; production leaves it nil.
	OnTaskStarted func(pgid int)
	// OnOutcome, when set, is called with the attempt's outcome once it is
	// known and the task's group is stopped, before the outcome is reported:
	// pod mode writes the durable outcome record there, so the record
	// exists whether or not the report gets through.
	OnOutcome func(Outcome)
	// Unanswered tells a failed pre-start call whose answer never came (the
	// control plane was down or unreachable) from an answer; default
	// ControlPlaneUnanswered (the error wraps ErrUnanswered).
	Unanswered func(error) bool
	// RescheduleExitCode, when positive, is the exit code by which a task
	// asks for its next poke (a reschedule-mode sensor): the attempt ends
	// up_for_reschedule instead of failed. 0: none.
	RescheduleExitCode int
	// StopUnreported: an agent stopped from outside (its context
	// cancelled: SIGTERM) stops the task's group and calls OnOutcome with
	// the agent_stopped failure, but reports nothing, so the attempt is
	// settled by what stopped it rather than as a task failure. Pod mode
	// sets it: there the stop is the cluster's (the pod deleted, evicted,
	// preempted, its node shut down, its deadline passed), and the pod's
	// end says which.
	StopUnreported bool
}

func (c Config) withDefaults() (Config, error) {
	if c.Command == "" {
		return c, errors.New("agent config: no command")
	}
	if c.Records == nil {
		return c, errors.New("agent config: no record directory")
	}
	if c.ExecutionTimeout < 0 {
		return c, fmt.Errorf("agent config: negative execution timeout %s", c.ExecutionTimeout)
	}
	if c.Watchdog < 0 {
		return c, fmt.Errorf("agent config: negative watchdog %s", c.Watchdog)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.Heartbeat, ladder.Defaults().Heartbeat)
	def(&c.DrainBound, DrainBoundDefault)
	def(&c.TerminateGrace, ladder.OrphanStopGrace)
	def(&c.KillWait, ladder.OrphanKillWait)
	def(&c.StartRetry, StartRetryDefault)
	def(&c.ReportRetry, ReportRetryDefault)
	if c.Shell == "" {
		c.Shell = ShellDefault
	}
	if c.Output == nil {
		c.Output = io.Discard
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.Unanswered == nil {
		c.Unanswered = ControlPlaneUnanswered
	}
	if c.RescheduleExitCode < 0 || c.RescheduleExitCode > 255 {
		return c, fmt.Errorf("agent config: reschedule exit code %d is not an exit code", c.RescheduleExitCode)
	}
	return c, nil
}

// TimeoutMessage is the message of an execution timeout of d.
func TimeoutMessage(d time.Duration) string {
	secs := strconv.FormatFloat(d.Seconds(), 'f', -1, 64)
	return fmt.Sprintf("%s: task exceeded %ss limit", ReasonExecutionTimeout, secs)
}

// Run runs one attempt to its end and reports its outcome. It returns the
// outcome and nil once the outcome is reported; ErrSuperseded when the task
// never started because the attempt moved on; an error wrapping
// ErrNotReported when the report could not be delivered. Cancelling ctx
// stops the task's group and reports the attempt failed (agent_stopped). Run
// returns only after every goroutine it started has ended.
func Run(ctx context.Context, cfg Config, rep Reporter) (Outcome, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return Outcome{}, err
	}
	r := &runner{cfg: cfg, rep: rep, log: cfg.Logger.With("attempt", cfg.Attempt.String())}
	return r.run(ctx)
}

type runner struct {
	cfg Config
	rep Reporter
	log hclog.Logger
}

func (r *runner) run(ctx context.Context) (Outcome, error) {
	a := r.cfg.Attempt
	unanswered := true // every failure of the RUNNING report so far was an answer that never came
	if err := r.retry(ctx, "running report", r.cfg.StartRetry, func(cctx context.Context) (bool, error) {
		term, err := r.rep.Running(cctx, a, r.cfg.Clock.Now())
		if err != nil && !r.cfg.Unanswered(err) {
			unanswered = false
		}
		return term, err
	}); err != nil {
		switch {
		case errors.Is(err, ErrSuperseded):
			r.log.Warn("the control plane answered should_terminate to RUNNING: not starting the task")
		case errors.Is(err, errGaveUp) && unanswered && errors.Is(err, ErrAnswerLost):
			r.log.Error("the control plane applied a pre-start call but its answer was lost for good: not starting the task",
				"error", err)
			err = fmt.Errorf("%w: %w", ErrStartUnanswered, err)
		case errors.Is(err, errGaveUp) && unanswered:
			r.log.Error("the control plane never answered the RUNNING report: not starting the task",
				"start_retry", r.cfg.StartRetry, "error", err)
			err = fmt.Errorf("%w: %w", ErrStartUnanswered, err)
		}
		// Nothing was started: the spawner's record names an agent that is
		// about to exit, which reads dead with or without it.
		if rerr := r.cfg.Records.Remove(a); rerr != nil {
			r.log.Warn("could not remove the attempt's records", "error", rerr)
		}
		return Outcome{}, err
	}

	t, err := startTask(r.cfg)
	if err != nil {
		r.log.Error("could not start the task", "error", err)
		return r.finish(ctx, nil, failed(ReasonStartFailed, -1, err.Error()))
	}
	r.log.Info("task started", "pgid", t.pgid)
	if err := r.recordGroup(t); err != nil {
		r.log.Error("could not record the task's process group: stopping it", "pgid", t.pgid, "error", err)
		t.abort(r.cfg.Clock, r.cfg.KillWait, r.log)
		out := failed(ReasonGroupRecord, -1, "could not record the task process group: "+err.Error())
		out.OutputLost = r.drain(ctx, t)
		t.reap()
		return r.finish(ctx, t, out)
	}
	r.journal(JournalEntry{Event: JournalTaskStart, PGID: t.pgid, LeaderStart: t.start})
	t.release(r.log)
	out := r.supervise(ctx, t)
	code := out.ExitCode
	r.journal(JournalEntry{Event: JournalTaskEnd, PGID: t.pgid, LeaderStart: t.start,
		State: out.State, Reason: out.Reason, ExitCode: &code})
	return r.finish(ctx, t, out)
}

// journal records an entry in the agent's journal, when it keeps one. A
// journal that cannot be written never stops the task.
func (r *runner) journal(e JournalEntry) {
	if err := r.cfg.Journal.Record(e); err != nil {
		r.log.Warn("could not write the agent journal", "error", err)
	}
}

func failed(reason string, code int, detail string) Outcome {
	return Outcome{State: sdk.StateFailed, ExitCode: code, Reason: reason, Message: reason + ": " + detail}
}

func (r *runner) recordGroup(t *task) error {
	if err := t.readStart(); err != nil {
		return err
	}
	boot, err := bootID()
	if err != nil {
		r.log.Warn("could not read the boot id; the group record carries none", "error", err)
	}
	var agentStart uint64
	if self, err := proc.Stat(os.Getpid()); err == nil {
		agentStart = self.Start
	} else {
		r.log.Warn("could not read the agent's own start time; the group record carries none", "error", err)
	}
	return r.cfg.Records.WriteGroup(records.GroupRecord{
		Attempt:     r.cfg.Attempt,
		PGID:        t.pgid,
		AgentPID:    os.Getpid(),
		AgentStart:  agentStart,
		LeaderStart: t.start,
		Boot:        boot,
	})
}

// supervise runs the task to the exit of its leader, enforcing the timeout
// and should_terminate, then drains its output and stops what it left.
func (r *runner) supervise(ctx context.Context, t *task) Outcome {
	clk := r.cfg.Clock
	hbCtx, stopHeartbeats := context.WithCancel(ctx)
	terminate := make(chan struct{}, 1)
	hbDone := make(chan struct{})
	ticker := clk.NewTicker(r.cfg.Heartbeat)
	go func() {
		defer close(hbDone)
		r.heartbeat(hbCtx, ticker, terminate)
	}()
	defer func() {
		stopHeartbeats()
		<-hbDone
	}()

	sv := &supervision{r: r, t: t}
	if r.cfg.ExecutionTimeout > 0 {
		sv.timeout = clk.After(r.cfg.ExecutionTimeout)
	}
	if r.cfg.Watchdog > 0 {
		sv.watchdog = clk.After(r.cfg.Watchdog)
	}
	if r.cfg.OnTaskStarted != nil {
		r.cfg.OnTaskStarted(t.pgid)
	}
	sv.wait(ctx.Done(), terminate)
	stopHeartbeats()
	<-hbDone

	if sv.grace != nil {
		// A stop was under way when the leader exited: members that outlive
		// the grace are killed, as they would have been with the leader.
		gone, err := proc.AwaitGone(context.WithoutCancel(ctx), t.pgid, sv.grace)
		if err != nil {
			r.log.Warn("could not tell whether the task's group still runs", "pgid", t.pgid, "error", err)
		}
		if !gone {
			r.log.Warn("the task's group outlived its grace: killing it", "pgid", t.pgid)
			t.signal(sigKill, r.log)
		}
	}

	outputLost := r.drain(ctx, t)
	r.stopLeftovers(ctx, t)
	t.reap()

	out := r.outcomeOf(t, sv.intervened)
	out.OutputLost = outputLost
	return out
}

// supervision is one task's supervision up to its leader's exit: the
// agent's deadlines and the first intervention it made.
type supervision struct {
	r *runner
	t *task
	// timeout and watchdog fire the execution timeout and the warm
	// worker's attempt watchdog (nil: none, or fired already).
	timeout, watchdog <-chan time.Time
	// grace fires when a stopped group's grace ends (nil: no stop under
	// way, or its grace ended).
	grace <-chan time.Time
	// intervened is set by the first intervention of the agent.
	intervened Outcome
}

// wait supervises the task until its leader exits: it kills the group at
// the timeout or the watchdog, and stops it (SIGTERM, then SIGKILL past the
// grace) on should_terminate or when done closes.
func (sv *supervision) wait(done <-chan struct{}, terminate <-chan struct{}) {
	r, t := sv.r, sv.t
	for {
		select {
		case <-t.exited:
			return
		case <-sv.timeout:
			sv.timeout = nil
			if sv.intervened.Reason == "" {
				sv.intervened = failed(ReasonExecutionTimeout, -1, "")
				sv.intervened.Message = TimeoutMessage(r.cfg.ExecutionTimeout)
			}
			r.log.Warn("execution timeout: killing the task's whole process group", "pgid", t.pgid, "timeout", r.cfg.ExecutionTimeout)
			t.signal(sigKill, r.log)
		case <-sv.watchdog:
			sv.watchdog = nil
			if sv.intervened.Reason == "" {
				sv.intervened = failed(ReasonWatchdog, -1, "")
				sv.intervened.Message = WatchdogMessage
			}
			r.log.Warn("the warm worker's attempt watchdog: killing the task's whole process group", "pgid", t.pgid,
				"watchdog", r.cfg.Watchdog)
			t.signal(sigKill, r.log)
		case <-terminate:
			sv.stop(failed(ReasonTerminated, -1, "the control plane answered should_terminate"), "should_terminate")
		case <-done:
			done = nil
			sv.stop(failed(ReasonAgentStopped, -1, "the agent was stopped before the task finished"), "agent stopped")
		case <-sv.grace:
			sv.grace = nil
			r.log.Warn("the task's group outlived its grace: killing it", "pgid", t.pgid)
			t.signal(sigKill, r.log)
		}
	}
}

// stop stops the task's group with SIGTERM and starts its grace, unless a
// stop is under way already; o is the outcome, unless the agent intervened
// before.
func (sv *supervision) stop(o Outcome, why string) {
	r, t := sv.r, sv.t
	if sv.intervened.Reason == "" {
		sv.intervened = o
	}
	if sv.grace != nil {
		return // already stopping
	}
	r.log.Warn("stopping the task's process group", "pgid", t.pgid, "why", why, "grace", r.cfg.TerminateGrace)
	t.signal(sigTerm, r.log)
	sv.grace = r.cfg.Clock.After(r.cfg.TerminateGrace)
}

// outcomeOf is the outcome of a task whose group is reaped: the agent's
// intervention when it made one, else what the leader's exit says.
func (r *runner) outcomeOf(t *task, intervened Outcome) Outcome {
	switch {
	case intervened.Reason != "":
		out := intervened
		out.ExitCode = exitCode(t.state)
		return out
	case t.state.Success():
		return Outcome{State: sdk.StateSuccess, ExitCode: 0}
	case r.cfg.RescheduleExitCode > 0 && exitCode(t.state) == r.cfg.RescheduleExitCode:
		return Outcome{State: sdk.StateUpForReschedule, ExitCode: r.cfg.RescheduleExitCode}
	case exitCode(t.state) >= 0:
		return failed(ReasonExitCode, exitCode(t.state), fmt.Sprintf("task exited with code %d", exitCode(t.state)))
	default:
		return failed(ReasonSignal, -1, "task was killed by "+signalName(t.state))
	}
}

// heartbeat beats on every tick until ctx ends or the control plane answers
// should_terminate (then it says so on terminate and stops beating).
func (r *runner) heartbeat(ctx context.Context, ticker clock.Ticker, terminate chan<- struct{}) {
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
		}
		cctx, cancel := context.WithTimeout(ctx, r.cfg.Heartbeat)
		term, err := r.rep.Heartbeat(cctx, r.cfg.Attempt, r.cfg.Clock.Now())
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("heartbeat failed", "error", err)
			}
			continue
		}
		if term {
			r.log.Warn("the control plane answered should_terminate to a heartbeat")
			select {
			case terminate <- struct{}{}:
			default:
			}
			return
		}
	}
}

// drain waits for the output copy to reach the end of the pipe, for at most
// DrainBound. It reports whether output may have been lost.
func (r *runner) drain(ctx context.Context, t *task) bool {
	select {
	case <-t.drained:
		return false
	default:
	}
	bound := r.cfg.Clock.After(r.cfg.DrainBound)
	select {
	case <-t.drained:
		return false
	case <-bound:
		r.log.Warn("a descendant of the task still holds its output pipe: reporting without waiting for it; lines it writes from now on are lost",
			"drain_bound", r.cfg.DrainBound)
	case <-ctx.Done():
		r.log.Warn("the agent is stopping: not waiting for the task's output pipe; its last lines may be lost")
	}
	t.cutOutput()
	return true
}

// stopLeftovers stops processes the task left running in its group.
func (r *runner) stopLeftovers(ctx context.Context, t *task) {
	running, err := groupRunning(t.pgid)
	if err != nil {
		r.log.Warn("could not tell whether the task's group still runs", "pgid", t.pgid, "error", err)
		return
	}
	if !running {
		return
	}
	r.log.Warn("the task left processes running in its group: stopping them", "pgid", t.pgid)
	// Detached from ctx: an agent that is stopping still must not leave them.
	if _, err := t.stop(context.WithoutCancel(ctx), r.cfg.Clock, r.cfg.TerminateGrace, r.cfg.KillWait); err != nil {
		r.log.Error("could not stop the task's leftover processes; its records stay so the reapers see them",
			"pgid", t.pgid, "error", err)
	}
}

// finish reports the outcome and, once the group is gone, removes the
// attempt's records.
func (r *runner) finish(ctx context.Context, t *task, out Outcome) (Outcome, error) {
	a := r.cfg.Attempt
	r.log.Info("task finished", "state", out.State, "exit_code", out.ExitCode, "message", out.Message)
	if r.cfg.OnOutcome != nil {
		r.cfg.OnOutcome(out)
	}
	var err error
	if r.cfg.StopUnreported && out.Reason == ReasonAgentStopped {
		r.log.Warn("the agent was stopped from outside: its outcome is not reported")
		err = ErrStopUnreported
	} else {
		// The outcome is reported even when the agent is being stopped.
		rctx := context.WithoutCancel(ctx)
		err = r.retry(rctx, "terminal report", r.cfg.ReportRetry, func(cctx context.Context) (bool, error) {
			// should_terminate on a report means the attempt had already
			// moved on and the board kept what it had: nothing is left to
			// stop.
			_, err := r.rep.Report(cctx, a, out, r.cfg.Clock.Now())
			return false, err
		})
	}
	if t != nil {
		if running, gerr := groupRunning(t.pgid); gerr != nil || running {
			r.log.Warn("keeping the attempt's records: its group may still run", "pgid", t.pgid, "error", gerr)
			return out, r.reportErr(err)
		}
	}
	if rerr := r.cfg.Records.Remove(a); rerr != nil {
		r.log.Warn("could not remove the attempt's records", "error", rerr)
	}
	return out, r.reportErr(err)
}

func (r *runner) reportErr(err error) error {
	if err == nil || errors.Is(err, ErrStopUnreported) {
		return err
	}
	r.log.Error("the outcome could not be reported", "error", err)
	return fmt.Errorf("%w: %w", ErrNotReported, err)
}

// errGaveUp marks a retry that ran out of its bound.
var errGaveUp = errors.New("gave up")

// retry calls f until it succeeds, backing off from 1 s up to 15 s, for at
// most bound: an outage of the control plane (reaperd restarting, the API
// unreachable) is ridden out. A refusal (ErrRefused) is not retried, and
// an answer lost for good (ErrAnswerLost) gives up at once. An answer of
// should_terminate is ErrSuperseded.
func (r *runner) retry(ctx context.Context, what string, bound time.Duration, f func(context.Context) (bool, error)) error {
	clk := r.cfg.Clock
	deadline := clk.Now().Add(bound)
	backoff := time.Second
	for {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		term, err := f(cctx)
		cancel()
		if err == nil {
			if term {
				return ErrSuperseded
			}
			return nil
		}
		if errors.Is(err, ErrRefused) {
			return fmt.Errorf("%s: not retried: %w", what, err)
		}
		if errors.Is(err, ErrAnswerLost) {
			return fmt.Errorf("%s: %w at once: %w", what, errGaveUp, err)
		}
		left := deadline.Sub(clk.Now())
		if left <= 0 {
			return fmt.Errorf("%s: %w after %s: %w", what, errGaveUp, bound, err)
		}
		r.log.Warn(what+" failed; retrying", "error", err, "in", min(backoff, left))
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), err)
		case <-clk.After(min(backoff, left)):
		}
		backoff = min(2*backoff, 15*time.Second)
	}
}

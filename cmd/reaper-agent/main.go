// Command reaper-agent is the Lite agent: it runs one task attempt as the
// leader of its own process group and reports its outcome (see package
// github.com/dexaflow/reaper/runner/agent for what it does).
//
// It is normally started by literunner.Spawner, detached in its own session, with
// -gate-fd: it then does nothing until the spawner has written its .pid
// record and sent the go-ahead, and refuses to run if that record does not
// name it.
//
// Exit codes:
//
//	0  the task succeeded and the outcome was reported
//	1  the task failed and the outcome was reported
//	2  bad command line or environment
//	3  RUNNING was answered should_terminate: the task never started
//	4  the control plane could not be reached (RUNNING or the outcome)
//	5  the spawner never sent the go-ahead: the task never started
//	6  pod mode: the RUNNING report went unanswered for -start-retry (2m);
//	   the infra marker was written, the task never started
//	7  worker mode: the warm worker's claims were refused (its credential
//	   lapsed); it ran what it had claimed to the end first
//
// The agent makes itself non-dumpable before it does anything else (see
// confine.Undumpable): its task runs as its user and cannot read the agent's
// environment or memory, where its credential is. It strips its own
// settings and credentials (the attempt's and a warm worker's token) from
// every task's environment.
//
// With REAPER_AGENT_JOURNAL_DIR set, the agent also appends its own journal
// to a file of its own in that directory (agent.Journal): when it began,
// when its task started and ended, when it exited. It is off by default;
// fault soaks read it to judge the system from the processes' side.
//
// Modes: -mode lite (default) is the agent of a local process, started by
// the Lite spawner. -mode pod (or REAPER_AGENT_MODE=pod, or without either
// REAPER_RECORD_FILE set, as the kube runner sets it) is the agent as the
// task container of a dedicated Kubernetes pod: it runs the attempt the same
// way and also writes the durable outcome record to
// -termination-message-path (default REAPER_RECORD_FILE, else
// /dev/termination-log): SUCCESS, FAILED or RESCHEDULE with the
// task's exit code before the outcome is reported, or the infra marker when
// its pre-start calls went unanswered for -start-retry (see
// agent.RunInPod).
//
// -mode worker is the agent as a warm pool worker (a long-lived pod of the
// kube edition): with -worker NAME and its worker credential
// (REAPER_WORKER_TOKEN, REAPER_ATTEMPT_API, REAPER_ATTEMPT_API_CA) it claims
// the attempts the runner bound to it and runs each with the attempt's own
// credential, the same protocol as above, each bounded by -watchdog (the
// credential ceiling); SIGTERM drains it (see agent.RunWorker).
//
// Reporters: -reporter api (the runners') reports RUNNING, heartbeats and
// the outcome to reaperd's attempt API with the attempt's own credential
// (REAPER_ATTEMPT_TOKEN, REAPER_ATTEMPT_API, REAPER_ATTEMPT_API_CA from the
// environment), renewing it with each accepted heartbeat. What
// REAPER_ATTEMPT_TOKEN holds is the attempt's bootstrap token: the agent's
// first call, before RUNNING, exchanges it once for the working token, so
// the copy left in the environment (or a pod spec) is worth nothing once
// the agent has started; -reporter file
// appends JSON lines to -report-file and answers should_terminate once
// -terminate-file exists (tests of the agent alone). The agent has no way
// to reach the board itself: it never holds the database's credentials.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/internal/confine"
	"github.com/dexaflow/reaper/internal/runas"
	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/runner/agent/apireport"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/lite/proc"
	"github.com/dexaflow/reaper/substrate/lite/records"
)

// Exit codes.
const (
	exitSuccess    = 0
	exitFailed     = 1
	exitUsage      = 2
	exitSuperseded = 3
	exitUnreported = 4
	exitNoGoAhead  = 5
	exitUnanswered = 6
	// exitWorkerRefused: worker mode, the warm worker's claims were refused
	// (its credential lapsed): it claims nothing more.
	exitWorkerRefused = 7
)

func main() {
	// Before anything reads the environment: the agent's credential (the
	// attempt's or the worker's) is in it, and the task the agent starts
	// runs as the same user. Non-dumpable, the agent's /proc/<pid>/environ
	// and memory are closed to that task.
	if err := confine.Undumpable(); err != nil {
		fmt.Fprintf(os.Stderr, "reaper-agent: %v\n", err)
		os.Exit(exitUsage)
	}
	os.Exit(run(os.Args[1:]))
}

func run(args []string) (code int) {
	inv, ok := parseInvocation(args)
	if !ok {
		return exitUsage
	}
	log := hclog.New(&hclog.LoggerOptions{
		Name:       "reaper-agent",
		Level:      hclog.LevelFromString(inv.LogLevel),
		JSONFormat: inv.LogJSON,
		Output:     os.Stderr,
	})

	if inv.Mode == agent.ModeWorker {
		// A worker keeps no journal of its own: it is no one attempt's agent.
		signal.Ignore(syscall.SIGHUP)
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		return runWorker(ctx, inv, log, os.Getenv)
	}

	// The journal, off unless the environment names its directory.
	var journal *agent.Journal
	if jdir := os.Getenv(agent.JournalDirEnv); jdir != "" {
		j, err := agent.OpenJournal(jdir, inv.Attempt)
		if err != nil {
			log.Error("cannot open the agent journal", "error", err)
			return exitUsage
		}
		defer j.Close()
		journal = j
	}

	// Detached from any terminal: a hangup is not a reason to abandon a task.
	signal.Ignore(syscall.SIGHUP)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	dir, code := openRecorded(inv, log)
	if dir == nil {
		return code
	}

	// From here the agent is recorded and may act on its attempt: its life
	// in the journal starts now and ends with its exit.
	if journal != nil {
		exited := journalLife(journal, log)
		defer func() { exited(code) }()
	}

	output := os.Stdout
	if inv.Output != "" {
		f, err := os.OpenFile(inv.Output, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			log.Error("cannot open the task's output file", "error", err)
			return exitUsage
		}
		defer f.Close()
		output = f
	}

	rep, closeRep, err := openReporter(inv)
	if err != nil {
		log.Error("cannot reach the attempt API", "error", err)
		return exitUsage
	}
	defer closeRep()

	runAs, err := lookupRunAs(inv)
	if err != nil {
		log.Error("cannot run the task as the configured user", "error", err)
		return exitUsage
	}
	return runAttempt(ctx, inv, attemptConfig(inv, dir, output, journal, runAs, log), rep, log)
}

// parseInvocation reads and checks the command line; false when it is
// refused (a problem of the checks is printed as one line).
func parseInvocation(args []string) (agent.Invocation, bool) {
	var inv agent.Invocation
	fs := flag.NewFlagSet("reaper-agent", flag.ContinueOnError)
	inv.Bind(fs)
	if err := fs.Parse(args); err != nil {
		return inv, false
	}
	if err := inv.Validate(); err != nil {
		// One line: every problem of the command line, joined.
		fmt.Fprintf(os.Stderr, "reaper-agent: %s\n", strings.Join(strings.Split(err.Error(), "\n"), "; "))
		return inv, false
	}
	return inv, true
}

// openRecorded waits for the spawner's go-ahead (when it gates the agent),
// opens the record directory and checks that the agent's own record is in
// it: the agent acts on its attempt only once the reapers can see it. A nil
// directory comes with the exit code to end with.
func openRecorded(inv agent.Invocation, log hclog.Logger) (*records.Dir, int) {
	if inv.GateFD > 0 {
		if err := awaitGoAhead(inv.GateFD); err != nil {
			log.Error("no go-ahead from the spawner: not running the task", "error", err)
			return nil, exitNoGoAhead
		}
	}
	dir, err := records.Open(inv.RecordDir)
	if err != nil {
		log.Error("record directory refused", "error", err)
		return nil, exitUsage
	}
	if inv.GateFD > 0 {
		if err := checkOwnRecord(dir, inv.Attempt); err != nil {
			log.Error("refusing to run a task the reapers cannot see", "error", err)
			return nil, exitUsage
		}
	}
	return dir, exitSuccess
}

// journalLife writes the agent's start to its journal and returns the
// function that writes its exit with the code it ends with.
func journalLife(journal *agent.Journal, log hclog.Logger) (exited func(code int)) {
	var start uint64
	if self, err := proc.Stat(os.Getpid()); err == nil {
		start = self.Start
	}
	if err := journal.Record(agent.JournalEntry{Event: agent.JournalAgentStart, AgentStart: start}); err != nil {
		log.Warn("could not write the agent journal", "error", err)
	}
	return func(code int) {
		if err := journal.Record(agent.JournalEntry{Event: agent.JournalAgentExit, AgentStart: start, ExitCode: &code}); err != nil {
			log.Warn("could not write the agent journal", "error", err)
		}
	}
}

// openReporter returns the reporter the command line names, with the
// function that closes it.
func openReporter(inv agent.Invocation) (agent.Reporter, func(), error) {
	switch inv.Reporter {
	case agent.ReporterFile:
		return agent.NewFileReporter(inv.ReportFile, inv.TerminateFile), func() {}, nil
	case agent.ReporterAPI:
		ar, err := apireport.New(os.Getenv)
		if err != nil {
			return nil, nil, err
		}
		return ar, ar.Close, nil
	}
	// Validate refused it already.
	return nil, nil, fmt.Errorf("unknown reporter %q", inv.Reporter)
}

// lookupRunAs returns the user the task runs as (nil: the agent's own),
// checking that the agent may switch to it.
func lookupRunAs(inv agent.Invocation) (*runas.User, error) {
	if inv.RunAs == "" {
		return nil, nil
	}
	u, err := runas.Lookup(inv.RunAs)
	if err == nil {
		err = runas.CheckCanSwitch()
	}
	if err != nil {
		return nil, err
	}
	return &u, nil
}

// attemptConfig is the agent's configuration for the attempt the command
// line names.
func attemptConfig(inv agent.Invocation, dir *records.Dir, output *os.File, journal *agent.Journal,
	runAs *runas.User, log hclog.Logger) agent.Config {
	return agent.Config{
		RunAs:              runAs,
		Attempt:            inv.Attempt,
		Command:            inv.Command,
		Shell:              inv.Shell,
		Dir:                inv.Dir,
		Records:            dir,
		Output:             output,
		ExecutionTimeout:   inv.ExecutionTimeout,
		Heartbeat:          inv.Heartbeat,
		DrainBound:         inv.DrainBound,
		TerminateGrace:     inv.TerminateGrace,
		KillWait:           inv.KillWait,
		Journal:            journal,
		Logger:             log,
		StartRetry:         inv.StartRetry,
		ReportRetry:        inv.ReportRetry,
		RescheduleExitCode: inv.RescheduleExitCode,
	}
}

// runAttempt runs the attempt (in its pod, or as a local process) and
// returns the agent's exit code for how it ended.
func runAttempt(ctx context.Context, inv agent.Invocation, cfg agent.Config, rep agent.Reporter, log hclog.Logger) int {
	var (
		out agent.Outcome
		err error
	)
	if inv.Mode == agent.ModePod {
		out, err = agent.RunInPod(ctx, cfg, rep, inv.TerminationMessagePath)
	} else {
		sweep := inv.EndEscaped && agent.SubreaperForEscapes(log)
		out, err = agent.Run(ctx, cfg, rep)
		if sweep {
			agent.EndEscaped(inv.Attempt, log)
		}
	}
	switch {
	case errors.Is(err, agent.ErrStartUnanswered):
		return exitUnanswered
	case errors.Is(err, agent.ErrSuperseded):
		return exitSuperseded
	case err != nil && out.State == "":
		log.Error("the attempt did not run", "error", err)
		return exitUnreported
	case err != nil:
		return exitUnreported
	case out.State == sdk.StateSuccess, out.State == sdk.StateUpForReschedule:
		return exitSuccess
	default:
		return exitFailed
	}
}

// awaitGoAhead reads the spawner's "go" line from the inherited descriptor.
// End-of-file first means the spawner could not record this agent.
func awaitGoAhead(fd int) error {
	f := os.NewFile(uintptr(fd), "gate")
	if f == nil {
		return fmt.Errorf("gate descriptor %d is not open", fd)
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if strings.TrimSpace(line) != "go" {
		return fmt.Errorf("reading the go-ahead from descriptor %d: got %q (%v)", fd, line, err)
	}
	return nil
}

// checkOwnRecord verifies that the spawner's .pid record names this process.
func checkOwnRecord(dir *records.Dir, a sdk.Attempt) error {
	rec, err := dir.ReadAgent(a)
	if err != nil {
		return fmt.Errorf("checking this agent's record: %w", err)
	}
	if rec.PID != os.Getpid() {
		return fmt.Errorf("checking this agent's record %s: it names pid %d, this agent is %d",
			dir.AgentPath(a), rec.PID, os.Getpid())
	}
	return nil
}

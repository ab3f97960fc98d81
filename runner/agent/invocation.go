package agent

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// SensorRescheduleExitCode is the exit code by which a sensor's poke asks
// for its next poke (75, EX_TEMPFAIL: "try again later"). The runners hand
// it to the agent of a task declared a sensor only; whatever reports
// up_for_reschedule for any other task, the board fails it
// (reschedule_not_sensor).
const SensorRescheduleExitCode = 75

// Reporter kinds of the reaper-agent command line.
const (
	// ReporterFile is the JSON-lines FileReporter (-report-file).
	ReporterFile = "file"
	// ReporterAPI reports to reaperd's attempt API with the attempt's own
	// credential, from the environment (attempttoken.EnvToken, EnvAPI,
	// EnvCA; never flags: a command line is visible to every user). The
	// runners use it: an agent never holds the board's credentials.
	ReporterAPI = "api"
)

// Agent modes of the reaper-agent command line.
const (
	// ModeLite is the agent of a local process (the Lite edition): it is
	// started by the spawner and recorded in the record directory.
	ModeLite = "lite"
	// ModePod is the agent as the task container of a dedicated pod: it
	// also writes the durable outcome record to the termination message
	// path (RunInPod).
	ModePod = "pod"
	// ModeWorker is the agent as a warm pool worker: a long-lived pod that
	// claims the attempts bound to it and runs each (RunWorker).
	ModeWorker = "worker"
)

// Environment variables the reaper-agent command line reads.
const (
	// ModeEnv selects the mode when -mode is not given (a pod template can
	// set it once for every task).
	ModeEnv = "REAPER_AGENT_MODE"
	// TerminationMessagePathEnv names the file the outcome record goes to:
	// the default of -termination-message-path. The kube runner sets it in
	// every task container (to the container's terminationMessagePath), so
	// without -mode or REAPER_AGENT_MODE its presence selects pod mode; a
	// harness that plays the kubelet points it at a file of its own.
	TerminationMessagePathEnv = "REAPER_RECORD_FILE"
)

// defaultMode is the mode when -mode is not given: REAPER_AGENT_MODE, else
// pod when the environment names a record file, else lite.
func defaultMode() string {
	switch {
	case os.Getenv(ModeEnv) != "":
		return os.Getenv(ModeEnv)
	case os.Getenv(TerminationMessagePathEnv) != "":
		return ModePod
	}
	return ModeLite
}

// Invocation is the reaper-agent command line. The spawner builds one and
// turns it into arguments with Args; the binary reads it back with Bind and
// flag parsing, so the two sides cannot disagree on a flag's name.
type Invocation struct {
	RecordDir        string        // -record-dir: the record directory ("" = default)
	Attempt          sdk.Attempt   // -run, -task, -try, -epoch
	Command          string        // -command: the task, run as SHELL -c COMMAND
	Shell            string        // -shell
	Dir              string        // -workdir: the task's working directory
	Output           string        // -output: file the task's stdout and stderr are appended to ("" = the agent's stdout)
	ExecutionTimeout time.Duration // -execution-timeout (0 = none)
	Heartbeat        time.Duration // -heartbeat
	DrainBound       time.Duration // -drain-bound
	TerminateGrace   time.Duration // -terminate-grace
	KillWait         time.Duration // -kill-wait
	// GateFD is the inherited descriptor the agent reads the spawner's
	// go-ahead from ("go\n", sent once the .pid record is written); 0: none.
	GateFD        int    // -gate-fd
	Reporter      string // -reporter: "file" or "api"
	ReportFile    string // -report-file: the FileReporter's file
	TerminateFile string // -terminate-file: its should_terminate trigger
	LogLevel      string // -log-level
	LogJSON       bool   // -log-json
	// Mode is ModeLite or ModePod (-mode; default $REAPER_AGENT_MODE, else
	// pod when $REAPER_RECORD_FILE is set, else lite).
	Mode string
	// TerminationMessagePath is where pod mode writes the outcome record
	// (-termination-message-path; default $REAPER_RECORD_FILE, else
	// TerminationMessagePathDefault).
	TerminationMessagePath string
	// StartRetry bounds the retries of the RUNNING report (-start-retry;
	// default StartRetryDefault).
	StartRetry time.Duration
	// ReportRetry bounds the retries of the terminal report
	// (-report-retry; default ReportRetryDefault).
	ReportRetry time.Duration
	// RescheduleExitCode is the exit code by which the task asks for its
	// next poke (-reschedule-exit-code; 0: none). The runners set it to
	// SensorRescheduleExitCode for a task declared a sensor, and for no
	// other.
	RescheduleExitCode int
	// RunAs is the user the task runs as (-run-as, a name or a uid; Lite's
	// run_as), the agent staying its own user; "": the agent's user. It
	// needs the agent to be root or to hold CAP_SETUID and CAP_SETGID.
	RunAs string
	// EndEscaped (-end-escaped; lite mode): the agent is a child subreaper
	// and, once its attempt has ended, ends every process of the task that
	// escaped its group (as a warm worker does between attempts; see
	// EndEscaped). The Lite runner sets it. Off by default: a test running
	// the agent inside its own process must not sweep that process's other
	// children.
	EndEscaped bool

	// Worker mode (-mode worker) only: the worker's name (-worker, its
	// pod's), how many attempts it runs at once (-slots), how often it
	// claims (-poll) and each attempt's watchdog (-watchdog; 0: none). The
	// attempt flags (-run, -task, -try, -epoch, -command) are not used: the
	// attempts come from its claims.
	Worker   string
	Slots    int
	Poll     time.Duration
	Watchdog time.Duration
}

// Bind registers the flags on fs, writing into inv.
func (inv *Invocation) Bind(fs *flag.FlagSet) {
	fs.StringVar(&inv.RecordDir, "record-dir", "", "record directory (default $TMPDIR/dexaflow-agent-pids-<uid>)")
	fs.StringVar(&inv.Attempt.RunID, "run", "", "run id (required)")
	fs.StringVar(&inv.Attempt.TaskID, "task", "", "task id (required)")
	int32Var(fs, &inv.Attempt.Try, "try", "try number")
	int32Var(fs, &inv.Attempt.Epoch, "epoch", "attempt epoch")
	fs.StringVar(&inv.Command, "command", "", "the task: run as SHELL -c COMMAND (required)")
	fs.StringVar(&inv.Shell, "shell", ShellDefault, "the shell that runs the command")
	fs.StringVar(&inv.Dir, "workdir", "", "the task's working directory")
	fs.StringVar(&inv.Output, "output", "", "append the task's stdout and stderr to this file (default: the agent's stdout)")
	fs.DurationVar(&inv.ExecutionTimeout, "execution-timeout", 0, "the task's declared execution timeout (0: none)")
	fs.DurationVar(&inv.Heartbeat, "heartbeat", 0, "heartbeat interval (default: the ladder's, 15s)")
	fs.DurationVar(&inv.DrainBound, "drain-bound", DrainBoundDefault, "longest wait for the output pipe after the task exits")
	fs.DurationVar(&inv.TerminateGrace, "terminate-grace", 0, "grace after SIGTERM before SIGKILL (default 10s)")
	fs.DurationVar(&inv.KillWait, "kill-wait", 0, "wait after SIGKILL (default 5s)")
	fs.IntVar(&inv.GateFD, "gate-fd", 0, "inherited fd to read the spawner's go-ahead from (0: none)")
	fs.StringVar(&inv.Reporter, "reporter", ReporterFile, "how outcomes reach the control plane: api (the attempt API, REAPER_ATTEMPT_* in the environment) or file")
	fs.StringVar(&inv.ReportFile, "report-file", "", "the file reporter's JSON-lines file")
	fs.StringVar(&inv.TerminateFile, "terminate-file", "", "the file reporter answers should_terminate once this file exists")
	fs.StringVar(&inv.LogLevel, "log-level", "info", "log level")
	fs.BoolVar(&inv.LogJSON, "log-json", false, "log JSON lines")
	fs.StringVar(&inv.Mode, "mode", defaultMode(), "lite (a local process) or pod (the task container of a pod; writes the outcome record)")
	fs.StringVar(&inv.TerminationMessagePath, "termination-message-path", envOr(TerminationMessagePathEnv, TerminationMessagePathDefault),
		"pod mode: the file the durable outcome record is written to")
	fs.DurationVar(&inv.StartRetry, "start-retry", 0, "how long the RUNNING report is retried (default 2m)")
	fs.DurationVar(&inv.ReportRetry, "report-retry", 0, "how long the terminal report is retried (default 2m)")
	fs.IntVar(&inv.RescheduleExitCode, "reschedule-exit-code", 0, "the task's exit code that asks for its next poke (0: none)")
	fs.StringVar(&inv.RunAs, "run-as", "", "lite mode: the user the task runs as (a name or a uid; needs root or CAP_SETUID and CAP_SETGID)")
	fs.BoolVar(&inv.EndEscaped, "end-escaped", false, "lite mode: end the task's processes that escaped its group once the attempt has ended")
	fs.StringVar(&inv.Worker, "worker", "", "worker mode: the warm worker's name (its pod's)")
	fs.IntVar(&inv.Slots, "slots", 0, "worker mode: attempts run at once (default 1)")
	fs.DurationVar(&inv.Poll, "poll", 0, "worker mode: how often the worker claims (default 1s)")
	fs.DurationVar(&inv.Watchdog, "watchdog", 0, "worker mode: each attempt's wall-clock bound, the credential ceiling (0: none)")
}

// envOr is the environment variable name's value, or def when unset.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func int32Var(fs *flag.FlagSet, p *int32, name, usage string) {
	fs.Func(name, usage, func(s string) error {
		n, err := strconv.ParseInt(s, 10, 32)
		if err != nil {
			return err
		}
		*p = int32(n)
		return nil
	})
}

// Validate checks what the agent cannot run without.
func (inv Invocation) Validate() error {
	if inv.Mode == ModeWorker {
		return inv.validateWorker()
	}
	var errs []error
	if inv.Attempt.RunID == "" {
		errs = append(errs, errors.New("-run is required"))
	}
	if inv.Attempt.TaskID == "" {
		errs = append(errs, errors.New("-task is required"))
	}
	if inv.Command == "" {
		errs = append(errs, errors.New("-command is required"))
	}
	switch inv.Reporter {
	case ReporterFile:
		if inv.ReportFile == "" {
			errs = append(errs, errors.New("-reporter file needs -report-file"))
		}
	case ReporterAPI:
	default:
		errs = append(errs, fmt.Errorf("-reporter %q: unknown (known: %s, %s)", inv.Reporter, ReporterFile, ReporterAPI))
	}
	switch inv.Mode {
	case ModeLite, "":
	case ModePod:
		if inv.TerminationMessagePath == "" {
			errs = append(errs, errors.New("-mode pod needs -termination-message-path"))
		}
	default:
		errs = append(errs, fmt.Errorf("-mode %q: unknown (known: %s, %s, %s)", inv.Mode, ModeLite, ModePod, ModeWorker))
	}
	if inv.RescheduleExitCode < 0 || inv.RescheduleExitCode > 255 {
		errs = append(errs, fmt.Errorf("-reschedule-exit-code %d: not an exit code", inv.RescheduleExitCode))
	}
	if inv.RunAs != "" && inv.Mode != ModeLite && inv.Mode != "" {
		errs = append(errs, fmt.Errorf("-run-as is for -mode %s (a pod's user is its securityContext's)", ModeLite))
	}
	if inv.GateFD < 0 || inv.GateFD == 1 || inv.GateFD == 2 {
		errs = append(errs, fmt.Errorf("-gate-fd %d: not a usable descriptor", inv.GateFD))
	}
	return errors.Join(errs...)
}

func (inv Invocation) validateWorker() error {
	var errs []error
	if inv.Worker == "" {
		errs = append(errs, errors.New("-mode worker needs -worker"))
	}
	if inv.Reporter != ReporterAPI {
		errs = append(errs, errors.New("-mode worker needs -reporter api"))
	}
	if inv.Slots < 0 || inv.Poll < 0 || inv.Watchdog < 0 {
		errs = append(errs, errors.New("-slots, -poll and -watchdog must not be negative"))
	}
	if inv.RunAs != "" {
		errs = append(errs, fmt.Errorf("-run-as is for -mode %s (a pod's user is its securityContext's)", ModeLite))
	}
	return errors.Join(errs...)
}

// WorkerArgs renders a worker-mode invocation as reaper-agent arguments:
// the mode, the worker flags and the reporter, heartbeat and logging
// flags (no attempt flags).
func (inv Invocation) WorkerArgs() []string {
	args := []string{"-mode=" + ModeWorker, "-worker=" + inv.Worker, "-reporter=" + ReporterAPI}
	if inv.Slots > 0 {
		args = append(args, "-slots="+strconv.Itoa(inv.Slots))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"poll", inv.Poll}, {"watchdog", inv.Watchdog}, {"heartbeat", inv.Heartbeat},
		{"terminate-grace", inv.TerminateGrace}, {"kill-wait", inv.KillWait}} {
		if d.v != 0 {
			args = append(args, "-"+d.name+"="+d.v.String())
		}
	}
	if inv.LogLevel != "" {
		args = append(args, "-log-level="+inv.LogLevel)
	}
	return args
}

// Args renders the invocation as reaper-agent arguments.
func (inv Invocation) Args() []string {
	args := []string{
		"-run=" + inv.Attempt.RunID,
		"-task=" + inv.Attempt.TaskID,
		"-try=" + strconv.Itoa(int(inv.Attempt.Try)),
		"-epoch=" + strconv.Itoa(int(inv.Attempt.Epoch)),
		"-command=" + inv.Command,
	}
	str := func(name, v string) {
		if v != "" {
			args = append(args, "-"+name+"="+v)
		}
	}
	dur := func(name string, d time.Duration) {
		if d != 0 {
			args = append(args, "-"+name+"="+d.String())
		}
	}
	str("record-dir", inv.RecordDir)
	str("shell", inv.Shell)
	str("workdir", inv.Dir)
	str("output", inv.Output)
	dur("execution-timeout", inv.ExecutionTimeout)
	dur("heartbeat", inv.Heartbeat)
	dur("drain-bound", inv.DrainBound)
	dur("terminate-grace", inv.TerminateGrace)
	dur("kill-wait", inv.KillWait)
	if inv.GateFD != 0 {
		args = append(args, "-gate-fd="+strconv.Itoa(inv.GateFD))
	}
	str("reporter", inv.Reporter)
	str("report-file", inv.ReportFile)
	str("terminate-file", inv.TerminateFile)
	str("log-level", inv.LogLevel)
	if inv.LogJSON {
		args = append(args, "-log-json")
	}
	str("mode", inv.Mode)
	str("termination-message-path", inv.TerminationMessagePath)
	dur("start-retry", inv.StartRetry)
	dur("report-retry", inv.ReportRetry)
	str("run-as", inv.RunAs)
	if inv.EndEscaped {
		args = append(args, "-end-escaped")
	}
	if inv.RescheduleExitCode != 0 {
		args = append(args, "-reschedule-exit-code="+strconv.Itoa(inv.RescheduleExitCode))
	}
	return args
}

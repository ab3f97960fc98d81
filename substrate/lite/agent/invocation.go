package agent

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

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
}

// Bind registers the flags on fs, writing into inv.
func (inv *Invocation) Bind(fs *flag.FlagSet) {
	fs.StringVar(&inv.RecordDir, "record-dir", "", "record directory (default $TMPDIR/dexaflow-agent-pids-<uid>)")
	fs.StringVar(&inv.Attempt.RunID, "run", "", "run id (required)")
	fs.StringVar(&inv.Attempt.TaskID, "task", "", "task id (required)")
	int32Var(fs, &inv.Attempt.Try, "try", "try number")
	int32Var(fs, &inv.Attempt.Epoch, "epoch", "attempt epoch")
	fs.StringVar(&inv.Command, "command", "", "the task: run as SHELL -c COMMAND (required)")
	fs.StringVar(&inv.Shell, "shell", DefaultShell, "the shell that runs the command")
	fs.StringVar(&inv.Dir, "workdir", "", "the task's working directory")
	fs.StringVar(&inv.Output, "output", "", "append the task's stdout and stderr to this file (default: the agent's stdout)")
	fs.DurationVar(&inv.ExecutionTimeout, "execution-timeout", 0, "the task's declared execution timeout (0: none)")
	fs.DurationVar(&inv.Heartbeat, "heartbeat", 0, "heartbeat interval (default: the ladder's, 15s)")
	fs.DurationVar(&inv.DrainBound, "drain-bound", DefaultDrainBound, "longest wait for the output pipe after the task exits")
	fs.DurationVar(&inv.TerminateGrace, "terminate-grace", 0, "grace after SIGTERM before SIGKILL (default 10s)")
	fs.DurationVar(&inv.KillWait, "kill-wait", 0, "wait after SIGKILL (default 5s)")
	fs.IntVar(&inv.GateFD, "gate-fd", 0, "inherited fd to read the spawner's go-ahead from (0: none)")
	fs.StringVar(&inv.Reporter, "reporter", ReporterFile, "how outcomes reach the control plane: api (the attempt API, REAPER_ATTEMPT_* in the environment) or file")
	fs.StringVar(&inv.ReportFile, "report-file", "", "the file reporter's JSON-lines file")
	fs.StringVar(&inv.TerminateFile, "terminate-file", "", "the file reporter answers should_terminate once this file exists")
	fs.StringVar(&inv.LogLevel, "log-level", "info", "log level")
	fs.BoolVar(&inv.LogJSON, "log-json", false, "log JSON lines")
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
	if inv.GateFD < 0 || inv.GateFD == 1 || inv.GateFD == 2 {
		errs = append(errs, fmt.Errorf("-gate-fd %d: not a usable descriptor", inv.GateFD))
	}
	return errors.Join(errs...)
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
	return args
}

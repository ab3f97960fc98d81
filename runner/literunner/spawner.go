package literunner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/dexaflow/reaper/internal/runas"
	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/lite/proc"
	"github.com/dexaflow/reaper/substrate/lite/records"
)

// AgentBinary is the Lite agent's executable name.
const AgentBinary = "reaper-agent"

// gateFD is the descriptor the agent reads its go-ahead from: the first of
// exec.Cmd.ExtraFiles.
const gateFD = 3

// SpawnerConfig configures a Spawner.
type SpawnerConfig struct {
	// AgentPath is the reaper-agent executable. Default: reaper-agent next
	// to the running executable, else on PATH.
	AgentPath string
	// Records is the verified record directory. Required.
	Records *records.Dir
	// LogDir receives, per attempt, <name>.agent.log (the agent's own log)
	// and, unless the request names another file, <name>.out (the task's
	// output), where <name> is records.Name. Default: Records.Path().
	LogDir string
	// RunAs, when set, is the user every task runs as (the runner's
	// run_as; see package internal/runas): the agent stays the spawner's
	// user and starts its task as RunAs. NewSpawner refuses a user that
	// does not exist, is root or the spawner's own, or that the spawner
	// cannot switch to.
	RunAs string
	// Logger logs spawns. Default: a null logger.
	Logger hclog.Logger
}

// Spawner starts Lite agents: each detached in its own session, so it
// outlives whoever spawned it, and each recorded before it may start its
// task.
//
// The handshake: the agent is started with a pipe on descriptor 3 and waits
// on it. The spawner reads the agent's start time, writes the .pid record,
// and only then sends the go-ahead. If the record cannot be written the
// spawner closes the pipe (the agent sees end-of-file and exits without
// running anything), kills the agent, and fails the dispatch.
type Spawner struct {
	agentPath string
	dir       *records.Dir
	logDir    string
	runAs     string
	log       hclog.Logger
}

// NewSpawner checks the configuration and finds the agent binary.
func NewSpawner(cfg SpawnerConfig) (*Spawner, error) {
	if cfg.Records == nil {
		return nil, errors.New("lite spawner: no record directory")
	}
	path := cfg.AgentPath
	if path == "" {
		if exe, err := os.Executable(); err == nil {
			if cand := filepath.Join(filepath.Dir(exe), AgentBinary); isExecutable(cand) {
				path = cand
			}
		}
	}
	if path == "" {
		p, err := exec.LookPath(AgentBinary)
		if err != nil {
			return nil, fmt.Errorf("lite spawner: finding %s: %w", AgentBinary, err)
		}
		path = p
	}
	if !isExecutable(path) {
		return nil, fmt.Errorf("lite spawner: %s is not an executable file", path)
	}
	if cfg.RunAs != "" {
		if _, err := runas.Lookup(cfg.RunAs); err != nil {
			return nil, fmt.Errorf("lite spawner: %w", err)
		}
		if err := runas.CheckCanSwitch(); err != nil {
			return nil, fmt.Errorf("lite spawner: %w", err)
		}
	}
	logDir := cfg.LogDir
	if logDir == "" {
		logDir = cfg.Records.Path()
	}
	if err := os.MkdirAll(logDir, 0o700); err != nil {
		return nil, fmt.Errorf("lite spawner: creating log directory %s: %w", logDir, err)
	}
	log := cfg.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Spawner{agentPath: path, dir: cfg.Records, logDir: logDir, runAs: cfg.RunAs, log: log}, nil
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// SpawnRequest is one agent to start.
type SpawnRequest struct {
	// Invocation is the agent's command line: the attempt, the command, its
	// execution timeout, the reporter and any test-shortened durations.
	// Spawn sets RecordDir and GateFD itself, and Output when it is empty.
	Invocation agent.Invocation
	// Env is added to the agent's environment (the task inherits it, less
	// what the agent keeps private). The spawner's own environment is
	// passed on without the control plane's database credentials
	// (agentEnviron).
	Env []string
}

// Agent is a spawned agent.
type Agent struct {
	Attempt sdk.Attempt
	PID     int
	// Start is the agent's start time as recorded (0 when unreadable).
	Start uint64
	// Output is the file the task's output is appended to; Log the agent's.
	Output, Log string

	cmd *exec.Cmd
}

// Wait waits for the agent to exit and reaps it, returning its state. The
// spawner is the agent's parent: until someone waits, an exited agent stays
// a zombie (which Liveness reads dead, but which holds a process slot).
func (a *Agent) Wait() (*os.ProcessState, error) {
	err := a.cmd.Wait()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		return a.cmd.ProcessState, fmt.Errorf("waiting for agent %d: %w", a.PID, err)
	}
	return a.cmd.ProcessState, nil
}

// Spawn starts the agent for one attempt and records it. On any error no
// agent of the attempt is left running and no task has started.
func (s *Spawner) Spawn(ctx context.Context, req SpawnRequest) (*Agent, error) {
	inv := req.Invocation
	a := inv.Attempt
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("spawning the agent of %s: %w", a, err)
	}
	name := records.Name(a)
	inv.RecordDir = s.dir.Path()
	inv.GateFD = gateFD
	inv.RunAs = s.runAs
	if inv.Output == "" {
		inv.Output = filepath.Join(s.logDir, name+".out")
	}
	if err := inv.Validate(); err != nil {
		return nil, fmt.Errorf("spawning the agent of %s: %w", a, err)
	}
	logPath := filepath.Join(s.logDir, name+".agent.log")
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("spawning the agent of %s: opening its log: %w", a, err)
	}
	defer logFile.Close()
	gateR, gateW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("spawning the agent of %s: gate pipe: %w", a, err)
	}
	defer gateW.Close()

	cmd := exec.Command(s.agentPath, inv.Args()...)
	cmd.Env = append(agentEnviron(os.Environ()), req.Env...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.ExtraFiles = []*os.File{gateR}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	gateR.Close()
	if err != nil {
		return nil, fmt.Errorf("spawning the agent of %s: %w", a, err)
	}
	ag := &Agent{Attempt: a, PID: cmd.Process.Pid, Output: inv.Output, Log: logPath, cmd: cmd}

	// abandon undoes the spawn: no go-ahead, so the agent exits on its own
	// without running anything; the kill makes sure of it.
	abandon := func(cause error) (*Agent, error) {
		gateW.Close()
		if _, kerr := proc.Signal(ag.PID, unix.SIGKILL); kerr != nil {
			s.log.Error("could not kill an unrecorded agent", "attempt", a.String(), "pid", ag.PID, "error", kerr)
		}
		_, _ = ag.Wait()
		s.log.Error("agent not started: dispatch fails", "attempt", a.String(), "error", cause)
		return nil, fmt.Errorf("spawning the agent of %s: %w", a, cause)
	}

	boot, err := proc.BootID()
	if err != nil {
		s.log.Warn("could not read the boot id; the agent record carries none", "error", err)
	}
	if info, err := proc.Stat(ag.PID); err == nil {
		ag.Start = info.Start
	} else {
		s.log.Warn("could not read the agent's start time; only signal 0 will judge it", "pid", ag.PID, "error", err)
	}
	if err := s.dir.WriteAgent(records.AgentRecord{Attempt: a, PID: ag.PID, Start: ag.Start, Boot: boot}); err != nil {
		return abandon(fmt.Errorf("recording the agent: %w", err))
	}
	if _, err := gateW.WriteString("go\n"); err != nil {
		if rerr := os.Remove(s.dir.AgentPath(a)); rerr != nil {
			s.log.Warn("could not remove the record of an agent that died at start", "error", rerr)
		}
		return abandon(fmt.Errorf("releasing the agent: %w", err))
	}
	s.log.Info("agent spawned", "attempt", a.String(), "pid", ag.PID, "output", ag.Output, "log", logPath)
	return ag, nil
}

// controlPlaneEnv names variables of the spawner's (reaperd's) environment
// that carry the board's credentials: an agent and its task run user code
// and never receive them.
var controlPlaneEnv = []string{"REAPER_DSN=", "PGPASSWORD=", "PGPASSFILE=", "PGSERVICEFILE="}

// agentEnviron is env less controlPlaneEnv.
func agentEnviron(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !slices.ContainsFunc(controlPlaneEnv, func(p string) bool { return strings.HasPrefix(kv, p) }) {
			out = append(out, kv)
		}
	}
	return out
}

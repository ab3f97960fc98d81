package ctl

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/host/config"
	"github.com/dexaflow/reaper/sdk"
)

// Bounds of submit's input.
const (
	// SubmitTasksMax is the most task instances one submit creates.
	SubmitTasksMax = 10000
	// idMaxLen bounds run, dag and task ids.
	idMaxLen = 200
	// DagDefault is the dag id of submitted runs unless -dag names one.
	DagDefault = "reaperctl"
)

type submitJSON struct {
	RunID string           `json:"run_id"`
	DagID string           `json:"dag_id"`
	State string           `json:"state"`
	Tasks []submitTaskJSON `json:"tasks"`
}

type submitTaskJSON struct {
	TaskID                  string   `json:"task_id"`
	Command                 string   `json:"command"`
	Retries                 int32    `json:"retries"`
	ExecutionTimeoutSeconds float64  `json:"execution_timeout_seconds,omitempty"`
	Sensor                  bool     `json:"sensor,omitempty"`
	SensorTimeoutSeconds    float64  `json:"sensor_timeout_seconds,omitempty"`
	Executor                string   `json:"executor"`
	Upstreams               []string `json:"upstreams,omitempty"`
}

func (c CLI) submit(ctx context.Context, inv *invocation) error {
	fs := inv.flags()
	resolve := inv.operatorFlag()
	runID := fs.String("run", "", "the run's `ID` (default: run-<UTC time>-<random>)")
	dag := fs.String("dag", DagDefault, "the run's dag `NAME`")
	taskList := fs.String("tasks", "", "comma-separated task `ID,...`, one per command (default t1..tN)")
	timeout := fs.Duration("timeout", 0, "execution timeout `D` of each task, rounded up to seconds (0: none)")
	retries := fs.Int("retries", 0, "`N` retries each task declares")
	n := fs.Int("n", 0, "with -command: `N` tasks running the same command")
	command := fs.String("command", "", "with -n: the shell command `CMD` every task runs")
	executor := fs.String("executor", "", "the executor `NAME` of every task: lite, kube or warm (default: the configuration's edition)")
	sensorTimeout := fs.Duration("sensor", 0, "declare every task a sensor with this timeout `D`, counted from its first poke:"+
		" a poke that exits 75 asks for the next (0: not sensors)")
	runFilePath := fs.String("file", "", "a run file `PATH` declaring the run's tasks, their commands and upstreams (HCL; see docs)")
	cmds, err := inv.parse(0, -1)
	if err != nil {
		return err
	}

	var run lifecycle.NewRun
	if *runFilePath != "" {
		for _, f := range []string{"tasks", "timeout", "retries", "n", "command", "sensor"} {
			if flagSet(fs, f) {
				return usagef("-file declares the tasks: -%s goes in the run file", f)
			}
		}
		if len(cmds) > 0 {
			return usagef("-file declares the tasks: give no commands after --")
		}
		run, err = c.submitFile(*runFilePath, *runID, flagSet(fs, "dag"), *dag)
	} else {
		run, err = c.submitPlan(submitInput{
			runID: *runID, dag: *dag, tasks: *taskList, timeout: *timeout, retries: *retries, sensorTimeout: *sensorTimeout,
			n: *n, nSet: flagSet(fs, "n"), command: *command, commandSet: flagSet(fs, "command"), cmds: cmds,
		})
	}
	if err != nil {
		return err
	}
	if run.Operator, err = resolve(); err != nil {
		return err
	}
	if *executor != "" && !board.IsExecutor(*executor) {
		return usagef("-executor %q: want %s, %s or %s", *executor, sdk.ExecutorLite, sdk.ExecutorKube, sdk.ExecutorWarm)
	}

	s, err := c.open(ctx, inv.configPath)
	if err != nil {
		return err
	}
	defer s.close()
	// The tasks go to the edition's runner unless told: a kube board's
	// tasks to the kube runner, as its task pods.
	executorName := *executor
	if executorName == "" {
		executorName = s.cfg.Edition
	}
	for i := range run.Tasks {
		if run.Tasks[i].Executor == "" {
			run.Tasks[i].Executor = executorName
		}
	}
	if err := checkPools(run.Tasks, s.cfg.Runner); err != nil {
		return err
	}
	if err := s.writer.CreateRun(ctx, run, c.now()); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" { // unique_violation
			return fmt.Errorf("run %q already exists", run.RunID)
		}
		return fmt.Errorf("create run %s: %w", run.RunID, err)
	}

	if !inv.json {
		_, err := fmt.Fprintln(inv.stdout, run.RunID)
		return err
	}
	doc := submitJSON{RunID: run.RunID, DagID: run.DagID, State: sdk.RunRunning}
	for _, t := range run.Tasks {
		doc.Tasks = append(doc.Tasks, submitTaskJSON{TaskID: t.TaskID, Command: t.Command, Retries: t.Retries,
			ExecutionTimeoutSeconds: t.ExecutionTimeout.Seconds(), Sensor: t.Sensor,
			SensorTimeoutSeconds: t.SensorTimeout.Seconds(), Executor: t.Executor, Upstreams: t.Upstreams})
	}
	return writeJSON(inv.stdout, doc)
}

// submitFile builds the run the run file at path declares; -run and -dag,
// when given, name the run and its dag over the file's run and dag.
func (c CLI) submitFile(path, runID string, dagSet bool, dag string) (lifecycle.NewRun, error) {
	rf, err := readRunFile(path)
	if err != nil {
		return lifecycle.NewRun{}, err
	}
	if runID == "" {
		runID = rf.runID
	}
	if runID == "" {
		runID = c.newRunID()
	}
	if !dagSet && rf.dag != "" {
		dag = rf.dag
	}
	if err := checkID("run", runID); err != nil {
		return lifecycle.NewRun{}, err
	}
	if err := checkID("dag", dag); err != nil {
		return lifecycle.NewRun{}, err
	}
	run := lifecycle.NewRun{RunID: runID, DagID: dag, State: sdk.RunRunning, Tasks: rf.tasks,
		MaxActiveTasks: rf.maxActiveTasks}
	for i := range run.Tasks {
		if run.Tasks[i].Executor == "" {
			run.Tasks[i].Executor = rf.executor
		}
	}
	return run, nil
}

// submitInput is submit's command line.
type submitInput struct {
	runID, dag, tasks string
	timeout           time.Duration
	sensorTimeout     time.Duration // > 0: every task is a sensor with this timeout
	retries, n        int
	nSet              bool
	command           string
	commandSet        bool
	cmds              []string // positional: one command per task
}

// submitPlan checks submit's command line and builds the run, before the
// board is touched.
func (c CLI) submitPlan(in submitInput) (lifecycle.NewRun, error) {
	var cmds []string
	switch {
	case in.nSet || in.commandSet:
		if len(in.cmds) > 0 {
			return lifecycle.NewRun{}, usagef("give either commands as arguments or -n N -command CMD, not both")
		}
		if !in.nSet || !in.commandSet {
			return lifecycle.NewRun{}, usagef("-n and -command go together")
		}
		if in.n < 1 || in.n > SubmitTasksMax {
			return lifecycle.NewRun{}, usagef("-n %d: want 1 to %d tasks", in.n, SubmitTasksMax)
		}
		for i := 0; i < in.n; i++ {
			cmds = append(cmds, in.command)
		}
	case len(in.cmds) == 0:
		return lifecycle.NewRun{}, usagef("no command: give commands after --, or -n N -command CMD")
	default:
		if len(in.cmds) > SubmitTasksMax {
			return lifecycle.NewRun{}, usagef("%d commands: at most %d tasks", len(in.cmds), SubmitTasksMax)
		}
		cmds = in.cmds
	}
	for i, cmd := range cmds {
		if strings.TrimSpace(cmd) == "" {
			return lifecycle.NewRun{}, usagef("command %d is empty", i+1)
		}
	}
	if in.timeout < 0 {
		return lifecycle.NewRun{}, usagef("-timeout %s: must not be negative", in.timeout)
	}
	if in.timeout > time.Duration(1<<31-1)*time.Second {
		return lifecycle.NewRun{}, usagef("-timeout %s: too long", in.timeout)
	}
	if in.sensorTimeout < 0 {
		return lifecycle.NewRun{}, usagef("-sensor %s: must not be negative", in.sensorTimeout)
	}
	if in.sensorTimeout > time.Duration(1<<31-1)*time.Second {
		return lifecycle.NewRun{}, usagef("-sensor %s: too long", in.sensorTimeout)
	}
	if in.retries < 0 || in.retries > 1000 {
		return lifecycle.NewRun{}, usagef("-retries %d: want 0 to 1000", in.retries)
	}

	runID := in.runID
	if runID == "" {
		runID = c.newRunID()
	}
	if err := checkID("-run", runID); err != nil {
		return lifecycle.NewRun{}, err
	}
	if err := checkID("-dag", in.dag); err != nil {
		return lifecycle.NewRun{}, err
	}
	ids := make([]string, len(cmds))
	if in.tasks == "" {
		for i := range ids {
			ids[i] = "t" + strconv.Itoa(i+1)
		}
	} else {
		given := strings.Split(in.tasks, ",")
		if len(given) != len(cmds) {
			return lifecycle.NewRun{}, usagef("-tasks names %d tasks for %d commands", len(given), len(cmds))
		}
		seen := map[string]bool{}
		for i, id := range given {
			id = strings.TrimSpace(id)
			if err := checkID("-tasks", id); err != nil {
				return lifecycle.NewRun{}, err
			}
			if seen[id] {
				return lifecycle.NewRun{}, usagef("-tasks names %q twice", id)
			}
			seen[id] = true
			ids[i] = id
		}
	}

	run := lifecycle.NewRun{RunID: runID, DagID: in.dag, State: sdk.RunRunning}
	for i, cmd := range cmds {
		if err := lifecycle.CheckCommand(cmd); err != nil {
			return lifecycle.NewRun{}, usagef("task %s: %v", ids[i], err)
		}
		run.Tasks = append(run.Tasks, lifecycle.NewTask{
			TaskID: ids[i], Retries: int32(in.retries), // the executor: -executor, else the edition's
			Command: cmd, ExecutionTimeout: in.timeout,
			Sensor: in.sensorTimeout > 0, SensorTimeout: in.sensorTimeout,
		})
	}
	return run, nil
}

// checkID refuses an id that would not survive a table or a shell: empty,
// too long, or holding spaces or control characters.
func checkID(flagName, id string) error {
	switch {
	case id == "":
		return usagef("%s: an empty id", flagName)
	case len(id) > idMaxLen:
		return usagef("%s: id longer than %d bytes", flagName, idMaxLen)
	}
	for _, r := range id {
		if unicode.IsSpace(r) || unicode.IsControl(r) || r == ',' {
			return usagef("%s %q: ids hold no spaces, commas or control characters", flagName, id)
		}
	}
	return nil
}

// newRunID names a submitted run by its time and a random suffix.
func (c CLI) newRunID() string {
	var b [3]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "run-" + c.now().UTC().Format("20060102-150405") + "-" + hex.EncodeToString(b[:])
}

// checkPools refuses a task whose pool the configuration's runner does not
// name (the default pool aside): the runner would never start it.
func checkPools(tasks []lifecycle.NewTask, r *config.Runner) error {
	for _, t := range tasks {
		if t.Pool == "" || t.Pool == lifecycle.DefaultPool {
			continue
		}
		if r != nil {
			if _, ok := r.Pools[t.Pool]; ok {
				continue
			}
		}
		var names []string
		if r != nil {
			for n := range r.Pools {
				names = append(names, n)
			}
		}
		slices.Sort(names)
		return usagef("task %s: pool %q is not configured (the runner's pool blocks name: %s): the runner would never start it",
			t.TaskID, t.Pool, strings.Join(append([]string{lifecycle.DefaultPool}, names...), ", "))
	}
	return nil
}

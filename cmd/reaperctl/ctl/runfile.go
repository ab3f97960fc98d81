package ctl

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
)

// RunFileMax bounds a run file's size, in bytes: SubmitTasksMax tasks of
// modest commands fit well inside it.
const RunFileMax = 16 << 20

// A run file (submit -file) declares one run in HCL, the configuration's
// language:
//
//	run = "nightly-2026-12-07"   # optional: the run's id (default: generated)
//	dag = "etl"                  # optional: its dag id (default: reaperctl)
//	executor = "lite"            # optional: every task's executor (default: the edition)
//
//	task "extract" {
//	  command = "extract.sh"
//	  retries = 2                # optional, 0 to 1000
//	  timeout = "10m"            # optional execution timeout
//	}
//
//	max_active_tasks = 8         # optional: most tasks queued or running at once
//
//	task "load" {
//	  command  = "load.sh"
//	  upstream = ["extract"]     # optional: runs once every one succeeded
//	  sensor_timeout = "1h"      # optional: declares the task a sensor
//	  pool = "db"                # optional: the pool whose slots it takes (default_pool)
//	  pool_slots = 2             # optional: how many (1)
//	}
//
// Every problem of the file is reported at once, each with its file:line.
var (
	runFileSchema = &hcl.BodySchema{
		Attributes: []hcl.AttributeSchema{{Name: "run"}, {Name: "dag"}, {Name: "executor"}, {Name: "max_active_tasks"}},
		Blocks:     []hcl.BlockHeaderSchema{{Type: "task", LabelNames: []string{"id"}}},
	}
	taskBlockSchema = &hcl.BodySchema{
		Attributes: []hcl.AttributeSchema{
			{Name: "command", Required: true}, {Name: "upstream"}, {Name: "retries"}, {Name: "timeout"},
			{Name: "sensor_timeout"}, {Name: "executor"}, {Name: "pool"}, {Name: "pool_slots"},
		},
	}
)

// runFile is a parsed run file: the run, its tasks (executor left empty
// where the file names none) and where each task was declared.
type runFile struct {
	runID, dag, executor string
	maxActiveTasks       int32
	tasks                []lifecycle.NewTask
	declared             map[string]hcl.Range
}

// readRunFile reads and checks the run file at path: its syntax, its
// attributes, each task, and that the tasks' upstreams form a graph.
func readRunFile(path string) (runFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return runFile{}, fmt.Errorf("read the run file: %w", err)
	}
	defer f.Close()
	src, err := io.ReadAll(io.LimitReader(f, RunFileMax+1))
	if err != nil {
		return runFile{}, fmt.Errorf("read the run file %s: %w", path, err)
	}
	if len(src) > RunFileMax {
		return runFile{}, usagef("run file %s: larger than %d bytes", path, RunFileMax)
	}
	return parseRunFile(path, src)
}

// parseRunFile parses src, the run file named path.
func parseRunFile(path string, src []byte) (runFile, error) {
	file, diags := hclsyntax.ParseConfig(src, path, hcl.InitialPos)
	if diags.HasErrors() {
		return runFile{}, diagError(diags)
	}
	content, diags := file.Body.Content(runFileSchema)
	rf := runFile{declared: map[string]hcl.Range{}}
	rf.runID, diags = stringAttr(content.Attributes, "run", diags)
	rf.dag, diags = stringAttr(content.Attributes, "dag", diags)
	rf.executor, diags = stringAttr(content.Attributes, "executor", diags)
	if a := content.Attributes["executor"]; a != nil && rf.executor != "" && !board.IsExecutor(rf.executor) {
		diags = append(diags, attrDiag(a, fmt.Sprintf("executor %q: want %s, %s or %s", rf.executor,
			sdk.ExecutorLite, sdk.ExecutorKube, sdk.ExecutorWarm)))
	}
	if a := content.Attributes["max_active_tasks"]; a != nil {
		var n int64
		n, diags = wholeAttr(a, 1, 1<<20, diags)
		rf.maxActiveTasks = int32(n)
	}
	for _, b := range content.Blocks {
		t, d := taskOf(b)
		diags = append(diags, d...)
		if prev, dup := rf.declared[t.TaskID]; dup {
			r := b.DefRange
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
				Summary: "Task declared twice", Detail: fmt.Sprintf("Task %q is also declared at %s.", t.TaskID, prev)})
			continue
		}
		rf.declared[t.TaskID] = b.DefRange
		rf.tasks = append(rf.tasks, t)
	}
	if len(content.Blocks) == 0 && !diags.HasErrors() {
		r := file.Body.MissingItemRange()
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
			Summary: "No task", Detail: "A run file declares at least one task block."})
	}
	if len(content.Blocks) > SubmitTasksMax {
		r := content.Blocks[SubmitTasksMax].DefRange
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
			Summary: "Too many tasks", Detail: fmt.Sprintf("A run holds at most %d tasks.", SubmitTasksMax)})
	}
	if diags.HasErrors() {
		return runFile{}, diagError(diags)
	}
	if err := lifecycle.CheckGraph(rf.tasks); err != nil {
		var ge *lifecycle.GraphError
		if errors.As(err, &ge) && ge.Task != "" {
			r := rf.declared[ge.Task]
			return runFile{}, diagError(hcl.Diagnostics{{Severity: hcl.DiagError, Subject: &r,
				Summary: "Not a graph", Detail: ge.Error() + "."}})
		}
		return runFile{}, usagef("run file %s: %v", path, err)
	}
	return rf, nil
}

// taskOf reads one task block.
func taskOf(b *hcl.Block) (lifecycle.NewTask, hcl.Diagnostics) {
	id := b.Labels[0]
	var diags hcl.Diagnostics
	if err := checkID("task", id); err != nil {
		r := b.LabelRanges[0]
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
			Summary: "Bad task id", Detail: err.Error() + "."})
	}
	content, d := b.Body.Content(taskBlockSchema)
	diags = append(diags, d...)
	t := lifecycle.NewTask{TaskID: id}
	t.Command, diags = stringAttr(content.Attributes, "command", diags)
	if a := content.Attributes["command"]; a != nil {
		if strings.TrimSpace(t.Command) == "" {
			diags = append(diags, attrDiag(a, "the command is empty"))
		} else if err := lifecycle.CheckCommand(t.Command); err != nil {
			diags = append(diags, attrDiag(a, err.Error()))
		}
	}
	t.Executor, diags = stringAttr(content.Attributes, "executor", diags)
	if a := content.Attributes["executor"]; a != nil && t.Executor != "" && !board.IsExecutor(t.Executor) {
		diags = append(diags, attrDiag(a, fmt.Sprintf("executor %q: want %s, %s or %s", t.Executor,
			sdk.ExecutorLite, sdk.ExecutorKube, sdk.ExecutorWarm)))
	}
	if a := content.Attributes["upstream"]; a != nil {
		v, d := a.Expr.Value(nil)
		diags = append(diags, d...)
		if !d.HasErrors() {
			l, err := convert.Convert(v, cty.List(cty.String))
			if err != nil || l.IsNull() || !l.IsWhollyKnown() {
				diags = append(diags, attrDiag(a, "upstream is a list of task ids"))
			} else {
				for _, u := range l.AsValueSlice() {
					if u.IsNull() {
						diags = append(diags, attrDiag(a, "upstream is a list of task ids"))
						continue
					}
					t.Upstreams = append(t.Upstreams, u.AsString())
				}
			}
		}
	}
	if a := content.Attributes["retries"]; a != nil {
		var n int64
		n, diags = wholeAttr(a, 0, 1000, diags)
		t.Retries = int32(n)
	}
	t.Pool, diags = stringAttr(content.Attributes, "pool", diags)
	if a := content.Attributes["pool_slots"]; a != nil {
		var n int64
		n, diags = wholeAttr(a, 1, lifecycle.PoolSlotsMax, diags)
		t.PoolSlots = int32(n)
	}
	var timeout, sensor time.Duration
	timeout, diags = durationAttr(content.Attributes, "timeout", diags)
	sensor, diags = durationAttr(content.Attributes, "sensor_timeout", diags)
	t.ExecutionTimeout, t.Sensor, t.SensorTimeout = timeout, sensor > 0, sensor
	return t, diags
}

// wholeAttr reads attribute a as a whole number from lo to hi.
func wholeAttr(a *hcl.Attribute, lo, hi int64, diags hcl.Diagnostics) (int64, hcl.Diagnostics) {
	v, d := a.Expr.Value(nil)
	diags = append(diags, d...)
	if d.HasErrors() {
		return 0, diags
	}
	n, err := convert.Convert(v, cty.Number)
	if err != nil || n.IsNull() || !n.IsKnown() {
		return 0, append(diags, attrDiag(a, a.Name+" is a whole number"))
	}
	i, acc := n.AsBigFloat().Int64()
	if acc != 0 || i < lo || i > hi {
		return 0, append(diags, attrDiag(a, fmt.Sprintf("%s: want a whole number from %d to %d", a.Name, lo, hi)))
	}
	return i, diags
}

// stringAttr reads attribute name as a string ("" when absent).
func stringAttr(attrs hcl.Attributes, name string, diags hcl.Diagnostics) (string, hcl.Diagnostics) {
	a := attrs[name]
	if a == nil {
		return "", diags
	}
	v, d := a.Expr.Value(nil)
	diags = append(diags, d...)
	if d.HasErrors() {
		return "", diags
	}
	s, err := convert.Convert(v, cty.String)
	if err != nil || s.IsNull() || !s.IsKnown() {
		return "", append(diags, attrDiag(a, name+" is a string"))
	}
	return s.AsString(), diags
}

// durationAttr reads attribute name as a positive Go duration, at most
// what an int4 of seconds holds (0 when absent).
func durationAttr(attrs hcl.Attributes, name string, diags hcl.Diagnostics) (time.Duration, hcl.Diagnostics) {
	a := attrs[name]
	s, diags := stringAttr(attrs, name, diags)
	if a == nil || s == "" {
		return 0, diags
	}
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return 0, append(diags, attrDiag(a, fmt.Sprintf("%s %q: not a duration (such as 90s or 10m)", name, s)))
	case d <= 0:
		return 0, append(diags, attrDiag(a, fmt.Sprintf("%s %q: must be positive", name, s)))
	case d > time.Duration(1<<31-1)*time.Second:
		return 0, append(diags, attrDiag(a, fmt.Sprintf("%s %q: too long", name, s)))
	}
	return d, diags
}

func attrDiag(a *hcl.Attribute, detail string) *hcl.Diagnostic {
	r := a.Expr.Range()
	return &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r, Summary: "Invalid " + a.Name, Detail: detail + "."}
}

// diagError is diags as one usage error, a line a problem, each with the
// file:line it is about.
func diagError(diags hcl.Diagnostics) error {
	var lines []string
	for _, d := range diags {
		if d.Severity != hcl.DiagError {
			continue
		}
		where := ""
		if d.Subject != nil {
			where = fmt.Sprintf("%s:%d: ", d.Subject.Filename, d.Subject.Start.Line)
		}
		lines = append(lines, where+d.Summary+": "+strings.TrimSuffix(d.Detail, "."))
	}
	return usagef("%s", strings.Join(lines, "\n"))
}

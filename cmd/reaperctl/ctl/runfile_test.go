package ctl

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

func writeRunFile(t *testing.T, src string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "run.hcl")
	if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const diamond = `
run = "etl-1"
dag = "etl"

task "extract" {
  command = "echo extract"
  retries = 2
  timeout = "90s"
}

task "clean" {
  command  = "echo clean"
  upstream = ["extract"]
}

task "count" {
  command  = "echo count"
  upstream = ["extract"]
  sensor_timeout = "1h"
}

task "load" {
  command  = "echo load"
  upstream = ["clean", "count"]
}
`

func TestSubmitRunFile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("DeclaresTheRunItsTasksAndTheirUpstreams", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		r := b.ctl(t, "submit", "-file", writeRunFile(t, diamond)).ok(t)
		golden(t, r.stdout, "etl-1\n")
		run, err := b.store.Run(ctx, "etl-1")
		if err != nil || run.DagID != "etl" || run.State != sdk.RunRunning {
			t.Fatalf("run %+v, %v", run, err)
		}
		tis, err := b.store.TaskInstances(ctx, "etl-1")
		if err != nil || len(tis) != 4 {
			t.Fatalf("%d task instances, %v", len(tis), err)
		}
		byID := map[string]int{}
		for i, ti := range tis {
			byID[ti.TaskID] = i
		}
		ex := tis[byID["extract"]]
		if ex.Command != "echo extract" || ex.Retries != 2 || ex.ExecutionTimeout != 90*time.Second ||
			ex.Executor != sdk.ExecutorLite {
			t.Fatalf("extract %+v", ex)
		}
		if c := tis[byID["count"]]; !c.Sensor.Declared || c.Sensor.Timeout != time.Hour {
			t.Fatalf("count is not a sensor of 1h: %+v", c.Sensor)
		}
		var ups []string
		if err := b.store.Pool().QueryRow(ctx, `SELECT upstreams FROM task_instances
            WHERE run_id = 'etl-1' AND task_id = 'load'`).Scan(&ups); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(ups, []string{"clean", "count"}) {
			t.Fatalf("load's upstreams %v", ups)
		}
	})

	t.Run("FlagsNameTheRunAndDagOverTheFile", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		b.ctl(t, "submit", "-run", "other", "-dag", "d2", "-json", "-file", writeRunFile(t, diamond)).ok(t)
		if run, err := b.store.Run(ctx, "other"); err != nil || run.DagID != "d2" {
			t.Fatalf("run %+v, %v", run, err)
		}
	})

	t.Run("RefusalsNameTheTaskAndItsLine", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		for _, c := range []struct{ name, src, want string }{
			{"Cycle", "task \"a\" {\n  command = \"true\"\n  upstream = [\"b\"]\n}\ntask \"b\" {\n  command = \"true\"\n  upstream = [\"a\"]\n}\n",
				`run.hcl:1: Not a graph: task "a": its upstreams form a cycle (each waits for the next): a -> b -> a`},
			{"UnknownUpstream", "task \"a\" {\n  command = \"true\"\n}\n\ntask \"b\" {\n  command = \"true\"\n  upstream = [\"c\"]\n}\n",
				`run.hcl:5: Not a graph: task "b": upstream "c" is not a task of the run`},
			{"Duplicate", "task \"a\" {\n  command = \"true\"\n}\ntask \"a\" {\n  command = \"false\"\n}\n",
				`run.hcl:4: Task declared twice: Task "a" is also declared at`},
			{"NoCommand", "task \"a\" {\n}\n", `run.hcl:1: Missing required argument`},
			{"UnknownAttribute", "task \"a\" {\n  command = \"true\"\n  priority = 3\n}\n", `run.hcl:3: Unsupported argument`},
			{"BadTimeout", "task \"a\" {\n  command = \"true\"\n  timeout = \"soon\"\n}\n",
				`run.hcl:3: Invalid timeout: timeout "soon": not a duration`},
			{"NoTask", "dag = \"x\"\n", "No task"},
			{"Syntax", "task \"a\" {\n  command = \n}\n", "run.hcl:"},
		} {
			r := b.ctl(t, "submit", "-file", writeRunFile(t, c.src))
			if r.code != 2 || !strings.Contains(r.stderr, c.want) || r.stdout != "" {
				t.Errorf("%s: exit %d, stderr %q, want 2 and %q", c.name, r.code, r.stderr, c.want)
			}
		}
		var n int
		if err := b.store.Pool().QueryRow(ctx, `SELECT count(*) FROM runs`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%d runs written by refused files, %v", n, err)
		}
	})

	t.Run("EveryProblemOfTheFileAtOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		r := b.ctl(t, "submit", "-file", writeRunFile(t,
			"task \"a\" {\n  command = \"true\"\n  retries = -1\n}\ntask \"b c\" {\n  command = \" \"\n}\n"))
		for _, want := range []string{"run.hcl:3: Invalid retries", "run.hcl:5: Bad task id", "run.hcl:6: Invalid command"} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("stderr %q does not say %q", r.stderr, want)
			}
		}
	})

	t.Run("TaskFlagsAndCommandsAreRefusedBesideAFile", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		p := writeRunFile(t, diamond)
		b.ctl(t, "submit", "-file", p, "-retries", "3").failed(t, 2, "-retries goes in the run file")
		b.ctl(t, "submit", "-file", p, "--", "true").failed(t, 2, "give no commands after --")
	})
}

// TestTheExampleRunFileParses: examples/runs/etl.hcl is a graph.
func TestTheExampleRunFileParses(t *testing.T) {
	rf, err := readRunFile(filepath.Join("..", "..", "..", "examples", "runs", "etl.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rf.tasks) != 4 || rf.dag != "etl" {
		t.Fatalf("%d tasks, dag %q", len(rf.tasks), rf.dag)
	}
}

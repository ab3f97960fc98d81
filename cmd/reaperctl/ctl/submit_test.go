package ctl

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
)

func TestSubmit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("CommandsAfterDashDashBecomeTasks", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		r := b.ctl(t, "submit", "-run", "r1", "-dag", "nightly", "-timeout", "30s", "-retries", "2",
			"--", "sleep 5", "exit 3").ok(t)
		golden(t, r.stdout, "r1\n")

		run, err := b.store.Run(ctx, "r1")
		if err != nil {
			t.Fatal(err)
		}
		if run.State != sdk.RunRunning || run.DagID != "nightly" || !run.StartedAt.Equal(base) {
			t.Fatalf("run %+v, want running since base", run)
		}
		tis, err := b.store.TaskInstances(ctx, "r1")
		if err != nil {
			t.Fatal(err)
		}
		if len(tis) != 2 {
			t.Fatalf("%d task instances, want 2", len(tis))
		}
		for i, want := range []struct{ id, cmd string }{{"t1", "sleep 5"}, {"t2", "exit 3"}} {
			ti := tis[i]
			if ti.TaskID != want.id || ti.Command != want.cmd || ti.Executor != sdk.ExecutorLite ||
				ti.State != sdk.StateNone || ti.Retries != 2 || ti.MaxRetries != 2 ||
				ti.ExecutionTimeout != 30*time.Second || ti.Try != 1 || ti.Epoch != 0 {
				t.Fatalf("task instance %d: %+v", i, ti)
			}
		}
	})

	t.Run("TasksGoToTheEditionsExecutorUnlessTold", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		kube := filepath.Join(t.TempDir(), "kube.hcl")
		src := fmt.Sprintf("edition = \"kube\"\n\nstore {\n  dsn = %q\n}\n\nsubstrate \"kube\" {\n  namespace = \"tasks\"\n}\n", b.dsn)
		if err := os.WriteFile(kube, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		run(t, b.cli, "submit", "-config", kube, "-run", "rk", "--", "true").ok(t)
		run(t, b.cli, "submit", "-config", kube, "-run", "rw", "-executor", "warm", "--", "true").ok(t)
		b.ctl(t, "submit", "-run", "rb", "-executor", "docker", "--", "true").
			failed(t, 2, `-executor "docker": want lite, kube or warm`)
		for runID, want := range map[string]string{"rk": sdk.ExecutorKube, "rw": sdk.ExecutorWarm} {
			tis, err := b.store.TaskInstances(ctx, runID)
			if err != nil || len(tis) != 1 || tis[0].Executor != want {
				t.Fatalf("run %s: %+v %v, want one task of executor %s", runID, tis, err, want)
			}
		}
		if _, err := b.store.Run(ctx, "rb"); err == nil {
			t.Fatal("a refused submit created its run")
		}
	})

	t.Run("OverlongCommandRefusedNamingTaskAndLimit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		long := "echo " + strings.Repeat("x", lifecycle.CommandMax)
		b.ctl(t, "submit", "-run", "rl", "-tasks", "ok,big", "--", "true", long).
			failed(t, 2, fmt.Sprintf("task big: the command is %d bytes, at most %d", len(long), lifecycle.CommandMax))
		if _, err := b.store.Run(ctx, "rl"); err == nil {
			t.Fatal("a refused submit created its run")
		}
		// The board's own edge refuses it too, whoever writes the run.
		err := b.w.CreateRun(ctx, lifecycle.NewRun{RunID: "rl", DagID: "d",
			Tasks: []lifecycle.NewTask{{TaskID: "big", Executor: sdk.ExecutorWarm, Command: long}}}, base)
		if err == nil || !strings.Contains(err.Error(), "task big: the command is") {
			t.Fatalf("the board took an overlong command: %v", err)
		}
	})

	t.Run("SameCommandNTimesWithNamedTasks", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		r := b.ctl(t, "submit", "-n", "3", "-command", "echo hi", "-tasks", "a,b,c", "-run", "r2", "-json").ok(t)
		var doc submitJSON
		r.decode(t, &doc)
		if doc.RunID != "r2" || doc.DagID != DagDefault || doc.State != sdk.RunRunning || len(doc.Tasks) != 3 ||
			doc.Tasks[2].TaskID != "c" || doc.Tasks[2].Command != "echo hi" || doc.Tasks[0].ExecutionTimeoutSeconds != 0 {
			t.Fatalf("document %+v", doc)
		}
		tis, err := b.store.TaskInstances(ctx, "r2")
		if err != nil || len(tis) != 3 || tis[0].TaskID != "a" || tis[0].ExecutionTimeout != 0 {
			t.Fatalf("task instances %+v %v", tis, err)
		}
	})

	t.Run("SensorFlagDeclaresEveryTaskASensorWithItsTimeout", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		r := b.ctl(t, "submit", "-run", "rs", "-sensor", "10m", "-json", "--", "test -e /tmp/ready || exit 75").ok(t)
		var doc submitJSON
		r.decode(t, &doc)
		if len(doc.Tasks) != 1 || !doc.Tasks[0].Sensor || doc.Tasks[0].SensorTimeoutSeconds != 600 {
			t.Fatalf("document %+v", doc)
		}
		ti, err := b.store.TaskInstance(ctx, "rs", "t1")
		if err != nil || !ti.Sensor.Declared || ti.Sensor.Timeout != 10*time.Minute {
			t.Fatalf("task instance %+v %v", ti.Sensor, err)
		}
		// Without the flag, a task is no sensor.
		b.ctl(t, "submit", "-run", "rn", "--", "true").ok(t)
		if ti, err := b.store.TaskInstance(ctx, "rn", "t1"); err != nil || ti.Sensor.Declared {
			t.Fatalf("task instance %+v %v", ti.Sensor, err)
		}
	})

	t.Run("GeneratedRunID", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		r := b.ctl(t, "submit", "true").ok(t)
		if !regexp.MustCompile(`^run-20300102-120000-[0-9a-f]{6}\n$`).MatchString(r.stdout) {
			t.Fatalf("run id %q", r.stdout)
		}
	})

	t.Run("ExistingRunIsOneLineAndChangesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		b.ctl(t, "submit", "-run", "r1", "--", "true").ok(t)
		before := b.snapshot(t)
		b.ctl(t, "submit", "-run", "r1", "--", "false", "false").failed(t, 1, `run "r1" already exists`)
		b.unchanged(t, before)
	})

	t.Run("DSNFromTheEnvironmentOverridesTheFile", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		b.cfgPath = writeConfig(t, closedDSN(t), "")
		b.ctl(t, "status").failed(t, 1, "cannot reach the board")
		dsn := b.dsn
		b.cli.Getenv = func(k string) string {
			if k == "REAPER_DSN" {
				return dsn
			}
			return ""
		}
		b.ctl(t, "submit", "-run", "env", "--", "true").ok(t)
		if _, err := b.store.Run(ctx, "env"); err != nil {
			t.Fatal(err)
		}
	})
}

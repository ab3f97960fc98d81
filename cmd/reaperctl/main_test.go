package main_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/pgtest"
	"github.com/dexaflow/reaper/testkit/testbin"
)

// The real reaperctl binary against a real PostgreSQL board.

var binDir string

func TestMain(m *testing.M) {
	os.Exit(testbin.Main(m, "reaperctl", []string{"."}, func(m *testing.M, bin string) int {
		binDir = bin
		return pgtest.Run(m)
	}))
}

// reaperctl runs the binary and returns its exit code, stdout and stderr.
func reaperctl(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "reaperctl"), args...)
	cmd.Env = append(os.Environ(), "REAPER_DSN=")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), errOut.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), out.String(), errOut.String()
	}
	t.Fatal(err)
	return 0, "", ""
}

// TestMarkThroughTheBinary: reaperctl mark writes the operator's verdict on
// a provisional infra mark (exit 0, one line on stdout), and refuses a
// finished run with one line on stderr and exit 1, writing nothing.
func TestMarkThroughTheBinary(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.NewDSN(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, w := board.New(pool, board.Options{}), lifecycle.New(pool, lifecycle.Options{})
	now := time.Now().UTC().Truncate(time.Second)
	lease, ok, err := store.TryAcquire(ctx, "host-a", time.Hour, now.Add(-time.Hour))
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	cfg := filepath.Join(t.TempDir(), "reaper.hcl")
	src := fmt.Sprintf("edition = \"lite\"\n\nstore {\n  dsn = %q\n}\n\nsubstrate \"lite\" {}\n", dsn)
	if err := os.WriteFile(cfg, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, run := range []string{"open", "done"} {
		if err := w.CreateRun(ctx, lifecycle.NewRun{RunID: run, DagID: "dag", Tasks: []lifecycle.NewTask{
			{TaskID: "t", Executor: sdk.ExecutorKube}}}, now.Add(-time.Hour)); err != nil {
			t.Fatal(err)
		}
		a := sdk.Attempt{RunID: run, TaskID: "t", Try: 1}
		if ok, err := w.Enqueue(ctx, a, now.Add(-3*time.Minute)); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if ok, err := w.Queue(ctx, a, now.Add(-3*time.Minute)); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if stop, err := w.Running(ctx, a, now.Add(-2*time.Minute)); err != nil || stop {
			t.Fatal(stop, err)
		}
		res, err := store.Mark(ctx, []sdk.Mark{{Attempt: a, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
			Reason: sdk.LabelPodLost, Term: lease.Term, At: now.Add(-time.Minute)}})
		if err != nil || !res[0].Applied {
			t.Fatal(res, err)
		}
	}
	if ok, err := w.FinishRun(ctx, "done", sdk.RunFailed, "stopped", now.Add(-time.Second)); err != nil || !ok {
		t.Fatal(ok, err)
	}

	t.Run("AVerdictExitsZeroWithOneLine", func(t *testing.T) {
		code, out, errOut := reaperctl(t, "mark", "-config", cfg, "-by", "alice", "open", "t", "failed")
		if code != 0 || errOut != "" || strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, "marked open/t try 1 epoch 0 failed by alice") {
			t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
		}
		ti, err := store.TaskInstance(ctx, "open", "t")
		if err != nil || ti.State != sdk.StateFailed || ti.LastFailureKind != "" || ti.FailureReason != sdk.LabelOperatorMark {
			t.Fatalf("row %+v %v", ti, err)
		}
	})

	t.Run("RefusedOnAFinishedRunExitsOneWithOneLine", func(t *testing.T) {
		before, err := store.TaskInstance(ctx, "done", "t")
		if err != nil {
			t.Fatal(err)
		}
		code, out, errOut := reaperctl(t, "mark", "-config", cfg, "-by", "alice", "done", "t", "success")
		want := "reaperctl mark: run done has finished (failed): its tasks are not marked; clear a task to run it again\n"
		if code != 1 || out != "" || errOut != want {
			t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1 and %q", code, out, errOut, want)
		}
		after, err := store.TaskInstance(ctx, "done", "t")
		if err != nil || after.State != before.State || after.LastFailureKind != sdk.FailureInfra || !after.UpdatedAt.Equal(before.UpdatedAt) {
			t.Fatalf("the refused verdict changed the row: %+v %v", after, err)
		}
	})

	t.Run("ABadVerdictExitsTwo", func(t *testing.T) {
		code, out, errOut := reaperctl(t, "mark", "-config", cfg, "open", "t", "maybe")
		if code != 2 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, `"maybe": mark a task failed or success`) {
			t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
		}
	})
}

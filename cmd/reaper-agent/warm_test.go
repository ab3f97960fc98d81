package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/sdktest"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// TestWorkerModeEscapedProcessEndsWithItsAttempt: the reaper-agent binary
// in worker mode, claiming from a real attempt API on a real board, runs a
// warm attempt whose task escapes its group (a double fork and setsid,
// sleeping forever) after writing a file into its scratch directory, then
// the next attempt bound to the worker. Once the first attempt has ended
// its escaped process is gone (/proc) and its scratch directory removed;
// the next attempt, which succeeds only if it sees neither (nor shares a
// scratch directory), succeeds.
func TestWorkerModeEscapedProcessEndsWithItsAttempt(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	bin := filepath.Join(dir, "reaper-agent")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	pool := pgtest.NewDB(t)
	w := lifecycle.New(pool, lifecycle.Options{})
	api := attemptapitest.Start(t, w, attemptapitest.Options{})
	const worker = "warm-x"
	now := time.Now()
	work, tmp := filepath.Join(dir, "work"), filepath.Join(dir, "tmp")
	for _, d := range []string{work, tmp} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	escape := `(setsid sh -c 'echo "$TMPDIR" > "$WORK/scratch1"; echo secret > "$TMPDIR/left"; ` +
		`echo $$ > "$WORK/escaped.tmp"; mv "$WORK/escaped.tmp" "$WORK/escaped.pid"; exec sleep 1000' ` +
		`</dev/null >/dev/null 2>&1 &); while [ ! -s "$WORK/escaped.pid" ]; do sleep 0.01; done`
	check := `s1=$(cat "$WORK/scratch1"); pid=$(cat "$WORK/escaped.pid"); ` +
		`if kill -0 "$pid" 2>/dev/null; then echo "escaped $pid alive"; exit 1; fi; ` +
		`if [ -e "$s1" ]; then echo "scratch $s1 left"; exit 2; fi; ` +
		`if [ "$TMPDIR" = "$s1" ] || [ -n "$(ls -A "$TMPDIR")" ]; then echo "scratch shared"; exit 3; fi`
	var attempts []sdk.Attempt
	for i, cmd := range []string{escape, check} {
		at := now.Add(time.Duration(i) * time.Second) // bound one after the other: claimed oldest first
		runID := fmt.Sprintf("r%d", i)
		if err := w.CreateRun(ctx, lifecycle.NewRun{RunID: runID, DagID: "dag", Tasks: []lifecycle.NewTask{
			{TaskID: "t", Executor: sdk.ExecutorWarm, Command: cmd}}}, at); err != nil {
			t.Fatal(err)
		}
		a := sdk.Attempt{RunID: runID, TaskID: "t", Try: 1}
		if ok, err := w.Enqueue(ctx, a, at); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if ok, err := w.QueueWarm(ctx, a, worker, at); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if ok, err := w.RecordMint(ctx, a, at); err != nil || !ok {
			t.Fatal(ok, err)
		}
		attempts = append(attempts, a)
	}
	cred, err := api.Issuer.MintWorker(worker, now)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-mode", "worker", "-worker", worker, "-slots", "1", "-poll", "50ms",
		"-reporter", "api", "-record-dir", filepath.Join(dir, "rec"), "-heartbeat", "1s")
	cmd.Env = append(os.Environ(), attempttoken.EnvWorkerToken+"="+cred.Token, attempttoken.EnvAPI+"="+api.URL,
		attempttoken.EnvCA+"="+api.CA, "WORK="+work, "TMPDIR="+tmp)
	out := &sdktest.LogBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()

	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Both attempts' outcomes on the board: the event the worker makes.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var ended int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM task_instances WHERE state IN ('success', 'failed')`).
			Scan(&ended); err != nil {
			t.Fatal(err)
		}
		if ended == len(attempts) {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("the worker exited (%v) with %d of %d attempts ended:\n%s", err, ended, len(attempts), out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d attempts ended; the worker:\n%s", ended, len(attempts), out.String())
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil { // the pod's end: a drain
		t.Fatal(err)
	}
	if err := <-exited; err != nil {
		t.Fatalf("the worker: %v\n%s", err, out.String())
	}
	for _, a := range attempts {
		var state, msg string
		if err := pool.QueryRow(ctx, `SELECT state, coalesce(error_message, '') FROM task_instances WHERE run_id = $1`,
			a.RunID).Scan(&state, &msg); err != nil {
			t.Fatal(err)
		}
		if state != sdk.StateSuccess {
			t.Fatalf("%s ended %s (%s): the next attempt saw what the first left\n%s", a, state, msg, out.String())
		}
	}
	pidText, err := os.ReadFile(filepath.Join(work, "escaped.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(string(pidText))
	if _, err := os.Stat("/proc/" + pid); err == nil {
		if n, err := strconv.Atoi(pid); err == nil {
			_ = syscall.Kill(n, syscall.SIGKILL)
		}
		t.Fatalf("the escaped process %s outlived its attempt", pid)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Fatalf("scratch directories left in the worker's temporary directory: %v", left)
	}
	if !strings.Contains(out.String(), "escaped their attempt's group were ended") {
		t.Errorf("the sweep was not logged:\n%s", out.String())
	}
}

// TestLiteAgentEndsItsTasksEscapedProcesses: the reaper-agent binary in
// lite mode with -end-escaped (as the Lite runner starts it) runs a task
// that escapes its group (a double fork and setsid, sleeping forever):
// once the agent has reported and exited, the escaped process is gone.
func TestLiteAgentEndsItsTasksEscapedProcesses(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "reaper-agent")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	pidFile := filepath.Join(dir, "escaped.pid")
	escape := `(setsid sh -c 'echo $$ > "` + pidFile + `.tmp"; mv "` + pidFile + `.tmp" "` + pidFile + `"; exec sleep 1000' ` +
		`</dev/null >/dev/null 2>&1 &); while [ ! -s "` + pidFile + `" ]; do sleep 0.01; done`
	out, err := exec.Command(bin, "-end-escaped", "-record-dir", filepath.Join(dir, "rec"), "-run", "r", "-task", "t",
		"-try", "1", "-command", escape, "-reporter", "file", "-report-file", filepath.Join(dir, "report.jsonl")).CombinedOutput()
	if err != nil {
		t.Fatalf("the agent: %v\n%s", err, out)
	}
	pidText, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("the task never escaped: %v\n%s", err, out)
	}
	pid := strings.TrimSpace(string(pidText))
	if _, err := os.Stat("/proc/" + pid); err == nil {
		if n, err := strconv.Atoi(pid); err == nil {
			_ = syscall.Kill(n, syscall.SIGKILL)
		}
		t.Fatalf("the escaped process %s outlived its agent\n%s", pid, out)
	}
	if !strings.Contains(string(out), "escaped their attempt's group were ended") {
		t.Errorf("the sweep was not logged:\n%s", out)
	}
}

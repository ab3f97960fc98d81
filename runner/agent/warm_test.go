package agent

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/lite/records"
)

// warmHelperEnv names, in the environment of this test binary run again as
// a warm worker, the directory it works in.
const warmHelperEnv = "REAPER_TEST_WARM_WORKER_DIR"

// escapeCommand double-forks a process into a session of its own
// (setsid) that writes its pid and a file into the attempt's scratch
// directory and sleeps forever; the task itself then exits 0.
const escapeCommand = `(setsid sh -c 'echo "$TMPDIR" > "$WORK/scratch1"; echo secret > "$TMPDIR/left"; ` +
	`echo $$ > "$WORK/escaped.tmp"; mv "$WORK/escaped.tmp" "$WORK/escaped.pid"; exec sleep 1000' ` +
	`</dev/null >/dev/null 2>&1 &); while [ ! -s "$WORK/escaped.pid" ]; do sleep 0.01; done`

// checkCommand succeeds only if the escaped process and the first
// attempt's scratch directory are gone, and its own scratch directory is a
// fresh, empty one.
const checkCommand = `s1=$(cat "$WORK/scratch1"); pid=$(cat "$WORK/escaped.pid"); ` +
	`if kill -0 "$pid" 2>/dev/null; then echo "escaped $pid alive"; exit 1; fi; ` +
	`if [ -e "$s1" ]; then echo "scratch $s1 left"; exit 2; fi; ` +
	`if [ "$TMPDIR" = "$s1" ] || [ -n "$(ls -A "$TMPDIR")" ]; then echo "scratch shared"; exit 3; fi; ` +
	`[ "$(stat -c %a "$TMPDIR")" = 700 ] || exit 4`

// TestWarmAttemptsApartEscapedProcessEndsWithItsAttempt: a warm attempt
// whose task escapes its group (double fork, setsid, sleep forever) and
// leaves a file in its scratch directory: once the attempt has ended, the
// escaped process is gone (/proc), its scratch directory is gone, and the
// next attempt on the same worker sees neither (it succeeds only if so).
// The worker runs in a process of its own (this test binary run again),
// as the reaper-agent binary runs it: a child subreaper.
func TestWarmAttemptsApartEscapedProcessEndsWithItsAttempt(t *testing.T) {
	work := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestWarmWorkerHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), warmHelperEnv+"="+work)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the warm worker: %v\n%s", err, out)
	}
	pidText, err := os.ReadFile(filepath.Join(work, "escaped.pid"))
	if err != nil {
		t.Fatalf("the first task never escaped: %v\n%s", err, out)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(pidText)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
		_ = exec.Command("kill", "-9", strconv.Itoa(pid)).Run()
		t.Fatalf("the escaped process %d outlived its attempt", pid)
	}
	var reports []Outcome
	data, err := os.ReadFile(filepath.Join(work, "reports.json"))
	if err == nil {
		err = json.Unmarshal(data, &reports)
	}
	if err != nil {
		t.Fatalf("reports: %v\n%s", err, out)
	}
	if len(reports) != 2 || reports[0].State != sdk.StateSuccess || reports[1].State != sdk.StateSuccess {
		t.Fatalf("reported %+v: want both attempts' success (the second checks it sees nothing of the first)\n%s", reports, out)
	}
	if left, _ := os.ReadDir(filepath.Join(work, "tmp")); len(left) != 0 {
		t.Fatalf("scratch directories left behind: %v", left)
	}
}

// TestWarmWorkerHelperProcess is the worker of the test above, run in its
// own process; on its own it does nothing.
func TestWarmWorkerHelperProcess(t *testing.T) {
	work := os.Getenv(warmHelperEnv)
	if work == "" {
		t.Skip("run by TestWarmAttemptsApartEscapedProcessEndsWithItsAttempt")
	}
	dir, err := records.Open(filepath.Join(work, "rec"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(work, "tmp"), 0o700); err != nil {
		t.Fatal(err)
	}
	rep := &memReporter{}
	attempts := []Claimed{
		{Attempt: sdk.Attempt{RunID: "r", TaskID: "escapes", Try: 1}, Command: escapeCommand, Reporter: rep},
		{Attempt: sdk.Attempt{RunID: "r", TaskID: "next", Try: 1}, Command: checkCommand, Reporter: rep},
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var mu sync.Mutex
	claim := func(_ context.Context, _ int, running []sdk.Attempt) ([]Claimed, error) {
		mu.Lock()
		defer mu.Unlock()
		if len(running) > 0 {
			return nil, nil
		}
		if len(attempts) == 0 {
			stop() // both have ended
			return nil, nil
		}
		c := attempts[0]
		attempts = attempts[1:]
		return []Claimed{c}, nil
	}
	err = RunWorker(ctx, WorkerConfig{Name: "w", Claim: claim, Poll: 20 * time.Millisecond, Subreaper: true,
		ScratchDir: filepath.Join(work, "tmp"),
		Attempt:    Config{Env: []string{"WORK=" + work}, Records: dir, Output: os.Stdout}})
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(rep.reported())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "reports.json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestWorkerRefusesAWithheldCommandAndServesTheNext: a claimed attempt
// whose command the control plane withheld (over the limit) is failed
// (command_too_large) without running anything, and the worker goes on to
// run the next attempt it claims.
func TestWorkerRefusesAWithheldCommandAndServesTheNext(t *testing.T) {
	b := setup(t, "")
	big := sdk.Attempt{RunID: "r", TaskID: "big", Try: 1}
	next := sdk.Attempt{RunID: "r", TaskID: "next", Try: 1}
	cl := &claims{batches: [][]Claimed{
		{{Attempt: big, Refuse: "the command is 40000 bytes, over 32768", Reporter: b.rep}},
		{{Attempt: next, Command: "true", Reporter: b.rep}},
	}}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() {
		done <- RunWorker(ctx, WorkerConfig{Name: "w", Claim: cl.claim, Attempt: b.cfg, Poll: 10 * time.Millisecond})
	}()
	for deadline := time.Now().Add(10 * time.Second); len(b.rep.reported()) < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("reported %+v: the worker did not serve both claims", b.rep.reported())
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	rep := b.rep.reported()
	if rep[0].State != sdk.StateFailed || rep[0].Reason != ReasonCommandTooLarge || rep[1].State != sdk.StateSuccess {
		t.Fatalf("reported %+v: want the withheld one failed %s, the next one's success", rep, ReasonCommandTooLarge)
	}
}

// TestWorkerClaimTooLargeAsksForFewer: a claim whose answer was too large
// to read is refused (nothing of it used) and the worker's next claim asks
// for half as many attempts, down to one, so one oversized answer does not
// break the worker claim after claim: it serves what fits.
func TestWorkerClaimTooLargeAsksForFewer(t *testing.T) {
	b := setup(t, "")
	a := sdk.Attempt{RunID: "r", TaskID: "fits", Try: 1}
	var (
		mu    sync.Mutex
		asked []int
		given bool
	)
	claim := func(_ context.Context, slots int, _ []sdk.Attempt) ([]Claimed, error) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, slots)
		switch {
		case given:
			return nil, nil
		case slots > 1: // the answer for that many is over the limit
			return nil, ErrClaimTooLarge
		}
		given = true
		return []Claimed{{Attempt: a, Command: "true", Reporter: b.rep}}, nil
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() {
		done <- RunWorker(ctx, WorkerConfig{Name: "w", Slots: 4, Claim: claim, Attempt: b.cfg, Poll: 10 * time.Millisecond})
	}()
	for deadline := time.Now().Add(10 * time.Second); len(b.rep.reported()) < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the worker never ran the attempt that fits")
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) < 3 || asked[0] != 4 || asked[1] != 2 || asked[2] != 1 {
		t.Fatalf("the claims asked for %v slots, want 4, 2, 1", asked)
	}
	if rep := b.rep.reported(); rep[0].State != sdk.StateSuccess {
		t.Fatalf("reported %+v", rep)
	}
}

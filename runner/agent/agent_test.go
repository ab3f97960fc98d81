package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/substrate/lite/proc"
	"github.com/dexaflow/reaper/substrate/lite/records"
	"github.com/dexaflow/reaper/testkit/eventually"
)

// memReporter is an in-memory control plane.
type memReporter struct {
	mu         sync.Mutex
	calls      []string
	outcomes   []Outcome
	heartbeats int
	// answers: should_terminate for each call kind
	terminateRunning   bool
	terminateHeartbeat bool
}

func (m *memReporter) Running(ctx context.Context, a sdk.Attempt, now time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, EventRunning)
	return m.terminateRunning, nil
}

func (m *memReporter) Heartbeat(ctx context.Context, a sdk.Attempt, now time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, EventHeartbeat)
	m.heartbeats++
	return m.terminateHeartbeat, nil
}

func (m *memReporter) Report(ctx context.Context, a sdk.Attempt, o Outcome, now time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, EventReport)
	m.outcomes = append(m.outcomes, o)
	return false, nil
}

func (m *memReporter) reported() []Outcome {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Outcome(nil), m.outcomes...)
}

// bundle is what one test works with.
type bundle struct {
	cfg     Config
	rep     *memReporter
	dir     *records.Dir
	work    string // a scratch directory the task can write markers into
	outPath string
	started chan int // receives the group id once the task is released
}

func setup(t *testing.T, command string) *bundle {
	t.Helper()
	dir, err := records.Open(filepath.Join(t.TempDir(), "rec"))
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	outPath := filepath.Join(work, "task.out")
	out, err := os.Create(outPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { out.Close() })
	b := &bundle{rep: &memReporter{}, dir: dir, work: work, outPath: outPath, started: make(chan int, 1)}
	b.cfg = Config{
		Attempt:       sdk.Attempt{RunID: "run-1", TaskID: "task_a", Try: 1, Epoch: 0},
		Command:       command,
		Env:           []string{"WORK=" + work},
		Records:       dir,
		Output:        out,
		OnTaskStarted: func(pgid int) { b.started <- pgid },
	}
	return b
}

// result is what Run returned.
type result struct {
	out Outcome
	err error
	at  time.Time
}

// start runs the agent in a goroutine; the returned channel gets its result.
func (b *bundle) start(t *testing.T, ctx context.Context) <-chan result {
	t.Helper()
	done := make(chan result, 1)
	go func() {
		out, err := Run(ctx, b.cfg, b.rep)
		done <- result{out, err, time.Now()}
	}()
	return done
}

// pgid waits for the task to be released and returns its group id.
func (b *bundle) pgid(t *testing.T) int {
	t.Helper()
	select {
	case pgid := <-b.started:
		t.Cleanup(func() { _, _ = proc.SignalGroup(pgid, unix.SIGKILL) })
		return pgid
	case <-time.After(10 * time.Second):
		t.Fatal("the task never started")
	}
	return 0
}

func await(t *testing.T, done <-chan result, within time.Duration) result {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(within):
		t.Fatalf("the agent did not finish within %s", within)
	}
	return result{}
}

func (b *bundle) output(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(b.outPath)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func assertGroupGone(t *testing.T, pgid int) {
	t.Helper()
	if running, err := proc.GroupRunning(pgid); err != nil || running {
		t.Fatalf("process group %d still runs (%v)", pgid, err)
	}
}

func TestSuccessReportsAndKeepsOutput(t *testing.T) {
	b := setup(t, `echo "hello $REAPER_TASK_ID try $REAPER_TRY"; echo oops >&2`)
	r := await(t, b.start(t, context.Background()), 10*time.Second)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.out.State != sdk.StateSuccess || r.out.ExitCode != 0 {
		t.Fatalf("outcome %+v", r.out)
	}
	if got := b.output(t); got != "hello task_a try 1\noops\n" {
		t.Fatalf("output %q", got)
	}
	if calls := strings.Join(b.rep.calls, ","); calls != "running,report" {
		t.Fatalf("calls %s", calls)
	}
	if _, err := b.dir.ReadGroup(b.cfg.Attempt); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("group record left behind after a clean exit: %v", err)
	}
}

func TestNonZeroExitFails(t *testing.T) {
	b := setup(t, "exit 7")
	r := await(t, b.start(t, context.Background()), 10*time.Second)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.out.State != sdk.StateFailed || r.out.ExitCode != 7 || r.out.Message != "exit_code: task exited with code 7" {
		t.Fatalf("outcome %+v", r.out)
	}
}

func TestGroupRecordedBeforeCommandRuns(t *testing.T) {
	// The command checks that its group's record exists when it starts.
	b := setup(t, "")
	b.cfg.Command = fmt.Sprintf("test -f %q", b.dir.GroupPath(b.cfg.Attempt))
	r := await(t, b.start(t, context.Background()), 10*time.Second)
	if r.err != nil || r.out.State != sdk.StateSuccess {
		t.Fatalf("the command ran before its group was recorded: %+v, %v", r.out, r.err)
	}
}

func TestExecutionTimeoutKillsWholeGroup(t *testing.T) {
	// A backgrounded grandchild holds stdout; a trap makes the leader
	// ignore SIGTERM. Only a SIGKILL to the whole group ends all of it.
	b := setup(t, `trap '' TERM; echo before; (sleep 1000 & sleep 1000; echo never) & sleep 1000; echo never`)
	fake := clock.NewFake(time.Unix(1_700_000_000, 0))
	b.cfg.Clock = fake
	b.cfg.ExecutionTimeout = 5 * time.Second
	done := b.start(t, context.Background())
	pgid := b.pgid(t)
	waitOutput(t, b, "before\n")
	fake.Advance(5 * time.Second)
	// The fake clock does not move again, so the drain bound never passes:
	// the agent can only return because the killed group released the pipe.
	r := await(t, done, 10*time.Second)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.out.State != sdk.StateFailed || r.out.Reason != ReasonExecutionTimeout ||
		r.out.Message != "execution_timeout: task exceeded 5s limit" {
		t.Fatalf("outcome %+v", r.out)
	}
	if r.out.OutputLost {
		t.Fatal("output reported lost though the group released the pipe")
	}
	assertGroupGone(t, pgid)
	if got := b.output(t); got != "before\n" {
		t.Fatalf("output %q, want the line written before the kill", got)
	}
	if rep := b.rep.reported(); len(rep) != 1 || rep[0].Reason != ReasonExecutionTimeout {
		t.Fatalf("reported %+v", rep)
	}
}

// TestWarmWatchdogKillsWholeGroupAndReportsCredentialCeiling: a warm
// worker's attempt watchdog (no pod deadline behind it) SIGKILLs the whole
// group at the bound, like the timeout, and the failure is reported as
// credential_ceiling, a task failure.
func TestWarmWatchdogKillsWholeGroupAndReportsCredentialCeiling(t *testing.T) {
	b := setup(t, `trap '' TERM; echo before; (sleep 1000 & sleep 1000) & sleep 1000`)
	fake := clock.NewFake(time.Unix(1_700_000_000, 0))
	b.cfg.Clock = fake
	b.cfg.ExecutionTimeout = time.Hour // declared, but longer than the watchdog
	b.cfg.Watchdog = 30 * time.Minute
	done := b.start(t, context.Background())
	pgid := b.pgid(t)
	waitOutput(t, b, "before\n")
	fake.Advance(30 * time.Minute)
	r := await(t, done, 10*time.Second)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.out.State != sdk.StateFailed || r.out.Reason != sdk.LabelCredentialCeiling || r.out.Message != WatchdogMessage {
		t.Fatalf("outcome %+v", r.out)
	}
	assertGroupGone(t, pgid)
	if rep := b.rep.reported(); len(rep) != 1 || rep[0].Reason != sdk.LabelCredentialCeiling {
		t.Fatalf("reported %+v", rep)
	}
}

// waitOutput waits, bounded, for the task (a real process) to have written
// want.
func waitOutput(t *testing.T, b *bundle, want string) {
	t.Helper()
	if !eventually.Until(10*time.Second, func() bool { return b.output(t) == want }) {
		t.Fatalf("output %q, want %q", b.output(t), want)
	}
}

func TestEscapedDescendantCannotHoldTheReport(t *testing.T) {
	// A descendant that leaves the group with setsid keeps stdout open; the
	// agent reports the timeout once the drain bound has passed.
	b := setup(t, `setsid sh -c 'echo $$ > "$WORK/escaped"; exec sleep 1000' & echo before; sleep 1000`)
	b.cfg.ExecutionTimeout = 200 * time.Millisecond
	b.cfg.DrainBound = 500 * time.Millisecond
	begin := time.Now()
	done := b.start(t, context.Background())
	pgid := b.pgid(t)
	escaped := filepath.Join(b.work, "escaped")
	eventually.True(t, 10*time.Second, escaped+" to appear", func() bool { _, err := os.Stat(escaped); return err == nil })
	t.Cleanup(func() {
		data, _ := os.ReadFile(escaped)
		if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
			_, _ = proc.Signal(pid, unix.SIGKILL)
		}
	})
	r := await(t, done, 10*time.Second)
	if r.out.Reason != ReasonExecutionTimeout || !r.out.OutputLost {
		t.Fatalf("outcome %+v, want a timeout with output possibly lost", r.out)
	}
	if took := r.at.Sub(begin); took > 200*time.Millisecond+500*time.Millisecond+3*time.Second {
		t.Fatalf("the report took %s", took)
	}
	assertGroupGone(t, pgid)
	if !strings.Contains(b.output(t), "before\n") {
		t.Fatalf("output %q lost the line written before the kill", b.output(t))
	}
}

func TestShouldTerminateFromHeartbeatStopsGroup(t *testing.T) {
	b := setup(t, `sleep 1000 & sleep 1000`)
	fake := clock.NewFake(time.Unix(1_700_000_000, 0))
	b.cfg.Clock = fake
	b.rep.terminateHeartbeat = true
	done := b.start(t, context.Background())
	pgid := b.pgid(t)
	fake.Advance(b.cfg.withDefaultsOrFatal(t).Heartbeat)
	r := await(t, done, 10*time.Second)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.out.State != sdk.StateFailed || r.out.Reason != ReasonTerminated {
		t.Fatalf("outcome %+v", r.out)
	}
	assertGroupGone(t, pgid)
	if b.rep.heartbeats != 1 {
		t.Fatalf("%d heartbeats, want 1", b.rep.heartbeats)
	}
}

func (c Config) withDefaultsOrFatal(t *testing.T) Config {
	t.Helper()
	c, err := c.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestShouldTerminateKillsAGroupThatTrapsTerm(t *testing.T) {
	b := setup(t, `trap '' TERM; sleep 1000 & while :; do sleep 0.05; done`)
	b.cfg.Heartbeat = 50 * time.Millisecond
	b.cfg.TerminateGrace = 200 * time.Millisecond
	b.rep.terminateHeartbeat = true
	done := b.start(t, context.Background())
	pgid := b.pgid(t)
	r := await(t, done, 10*time.Second)
	if r.out.Reason != ReasonTerminated {
		t.Fatalf("outcome %+v", r.out)
	}
	assertGroupGone(t, pgid)
}

func TestCancelStopsGroupAndReports(t *testing.T) {
	b := setup(t, `sleep 1000`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := b.start(t, ctx)
	pgid := b.pgid(t)
	cancel()
	r := await(t, done, 10*time.Second)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.out.Reason != ReasonAgentStopped {
		t.Fatalf("outcome %+v", r.out)
	}
	assertGroupGone(t, pgid)
	if len(b.rep.reported()) != 1 {
		t.Fatal("the outcome of a stopped agent was not reported")
	}
}

func TestLeftoverProcessesAreStopped(t *testing.T) {
	// The background child does not hold the output pipe, so the agent does
	// not wait for it; it stops it before reporting.
	b := setup(t, `sleep 1000 >/dev/null 2>&1 & echo done`)
	done := b.start(t, context.Background())
	pgid := b.pgid(t)
	r := await(t, done, 10*time.Second)
	if r.out.State != sdk.StateSuccess {
		t.Fatalf("outcome %+v", r.out)
	}
	assertGroupGone(t, pgid)
}

func TestBackgroundWriterIsDrained(t *testing.T) {
	// A backgrounded child that still holds stdout finishes its writes
	// within the drain bound: nothing is lost.
	b := setup(t, `(sleep 0.2; echo late) & echo early`)
	r := await(t, b.start(t, context.Background()), 10*time.Second)
	if r.out.State != sdk.StateSuccess || r.out.OutputLost {
		t.Fatalf("outcome %+v", r.out)
	}
	if got := b.output(t); got != "early\nlate\n" {
		t.Fatalf("output %q", got)
	}
}

func TestUnrecordableGroupNeverRunsTheCommand(t *testing.T) {
	b := setup(t, "")
	marker := filepath.Join(b.work, "ran")
	b.cfg.Command = "touch " + marker
	// A record already in the way: the agent's cannot be written.
	if err := os.WriteFile(b.dir.GroupPath(b.cfg.Attempt), []byte("in the way"), 0o600); err != nil {
		t.Fatal(err)
	}
	b.cfg.OnTaskStarted = nil
	r := await(t, b.start(t, context.Background()), 10*time.Second)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.out.State != sdk.StateFailed || r.out.Reason != ReasonGroupRecord {
		t.Fatalf("outcome %+v", r.out)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command ran though its group was never recorded")
	}
	if rep := b.rep.reported(); len(rep) != 1 || rep[0].Reason != ReasonGroupRecord {
		t.Fatalf("reported %+v", rep)
	}
}

func TestSupersededAtRunningNeverStarts(t *testing.T) {
	b := setup(t, "")
	marker := filepath.Join(b.work, "ran")
	b.cfg.Command = "touch " + marker
	b.rep.terminateRunning = true
	r := await(t, b.start(t, context.Background()), 10*time.Second)
	if !errors.Is(r.err, ErrSuperseded) {
		t.Fatalf("err %v, want ErrSuperseded", r.err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command ran for a superseded attempt")
	}
	if len(b.rep.reported()) != 0 {
		t.Fatal("a superseded attempt reported an outcome")
	}
}

func TestTimeoutMessage(t *testing.T) {
	for d, want := range map[time.Duration]string{
		5 * time.Second:         "execution_timeout: task exceeded 5s limit",
		90 * time.Minute:        "execution_timeout: task exceeded 5400s limit",
		1500 * time.Millisecond: "execution_timeout: task exceeded 1.5s limit",
	} {
		if got := TimeoutMessage(d); got != want {
			t.Errorf("TimeoutMessage(%s) = %q, want %q", d, got, want)
		}
	}
}

func TestInvocationRoundTrip(t *testing.T) {
	in := Invocation{
		RecordDir: "/r", Attempt: sdk.Attempt{RunID: "run = 1", TaskID: "t", Try: 3, Epoch: 2},
		Command: "echo 'a b' -x", Output: "/o", ExecutionTimeout: 90 * time.Second,
		Heartbeat: time.Second, DrainBound: 2 * time.Second, TerminateGrace: 3 * time.Second,
		KillWait: 4 * time.Second, GateFD: 3, Reporter: ReporterFile, ReportFile: "/f",
		TerminateFile: "/t", Shell: "/bin/bash", Dir: "/w", LogLevel: "debug", LogJSON: true,
		Mode: ModePod, TerminationMessagePath: "/m", StartRetry: 5 * time.Second, ReportRetry: 6 * time.Second, RescheduleExitCode: 99,
	}
	var out Invocation
	flags := flag.NewFlagSet("reaper-agent", flag.ContinueOnError)
	out.Bind(flags)
	if err := flags.Parse(in.Args()); err != nil {
		t.Fatal(err)
	}
	if out != in {
		t.Fatalf("round trip:\n got %+v\nwant %+v", out, in)
	}
	if err := out.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := (Invocation{Reporter: "carrier-pigeon"}).Validate(); err == nil {
		t.Fatal("an empty invocation validated")
	}
	bad := in
	bad.Mode = "vm"
	if err := bad.Validate(); err == nil {
		t.Fatal("an unknown mode validated")
	}
	bad.Mode, bad.TerminationMessagePath = ModePod, ""
	if err := bad.Validate(); err == nil {
		t.Fatal("pod mode validated without a termination message path")
	}

	// -run-as is Lite's: it round-trips there and is refused elsewhere.
	lite := in
	lite.Mode, lite.TerminationMessagePath, lite.RunAs = ModeLite, "", "nobody"
	var back Invocation
	flags = flag.NewFlagSet("reaper-agent", flag.ContinueOnError)
	back.Bind(flags)
	if err := flags.Parse(lite.Args()); err != nil || back.RunAs != "nobody" || back.Validate() != nil {
		t.Fatalf("-run-as round trip: %q (%v, %v)", back.RunAs, err, back.Validate())
	}
	for _, mode := range []string{ModePod, ModeWorker} {
		other := lite
		other.Mode, other.TerminationMessagePath, other.Worker, other.Reporter = mode, "/m", "w", ReporterAPI
		if err := other.Validate(); err == nil || !strings.Contains(err.Error(), "-run-as is for -mode lite") {
			t.Errorf("-run-as in mode %s: %v, want refused", mode, err)
		}
	}
}

func TestFileReporter(t *testing.T) {
	dir := t.TempDir()
	path, term := filepath.Join(dir, "report.jsonl"), filepath.Join(dir, "terminate")
	r := NewFileReporter(path, term)
	a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}
	now := time.Unix(1_700_000_000, 0)
	if stop, err := r.Running(context.Background(), a, now); err != nil || stop {
		t.Fatalf("Running = %v, %v", stop, err)
	}
	if err := os.WriteFile(term, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if stop, err := r.Heartbeat(context.Background(), a, now); err != nil || !stop {
		t.Fatalf("Heartbeat after the terminate file = %v, %v", stop, err)
	}
	if _, err := r.Report(context.Background(), a, Outcome{State: sdk.StateSuccess}, now); err != nil {
		t.Fatal(err)
	}
	events, err := ReadReportFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 3 || events[0].Event != EventRunning || !events[1].Terminate ||
		events[2].Outcome == nil || events[2].Attempt() != a {
		t.Fatalf("events %+v", events)
	}
}

// The file reporter has no control plane to go unanswered: its failures (a
// file it cannot write, the agent's own cancellation) are answers, never
// ErrUnanswered, so they never end a start as ErrStartUnanswered.
func TestFileReporterFailuresAreAnswers(t *testing.T) {
	dir := t.TempDir()
	a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}
	now := time.Unix(1_700_000_000, 0)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for name, call := range map[string]func() (bool, error){
		"Unwritable": func() (bool, error) {
			return NewFileReporter(filepath.Join(dir, "missing", "report.jsonl"), "").Running(context.Background(), a, now)
		},
		"Cancelled": func() (bool, error) {
			return NewFileReporter(filepath.Join(dir, "report.jsonl"), "").Running(cancelled, a, now)
		},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := call()
			if err == nil || ControlPlaneUnanswered(err) || errors.Is(err, ErrUnanswered) {
				t.Fatalf("%v; want a failure that is an answer", err)
			}
		})
	}
}

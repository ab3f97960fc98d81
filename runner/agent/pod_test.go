package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dexaflow/reaper/testkit/eventually"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/substrate/kube/podrecord"
)

// flakyReporter is a control plane whose calls fail as told.
type flakyReporter struct {
	memReporter
	mu         sync.Mutex
	runningErr func(n int) error // the n-th RUNNING call's error (nil: answered)
	reportErr  error
	runningN   int
	// seenAtReport is the termination message as it was when the outcome
	// was first reported.
	seenAtReport *string
	msgPath      string
}

func (f *flakyReporter) Running(ctx context.Context, a sdk.Attempt, now time.Time) (bool, error) {
	f.mu.Lock()
	f.runningN++
	n := f.runningN
	f.mu.Unlock()
	if f.runningErr != nil {
		if err := f.runningErr(n); err != nil {
			return false, err
		}
	}
	return f.memReporter.Running(ctx, a, now)
}

func (f *flakyReporter) Report(ctx context.Context, a sdk.Attempt, o Outcome, now time.Time) (bool, error) {
	f.mu.Lock()
	if f.seenAtReport == nil && f.msgPath != "" {
		data, _ := os.ReadFile(f.msgPath)
		s := string(data)
		f.seenAtReport = &s
	}
	f.mu.Unlock()
	if f.reportErr != nil {
		return false, f.reportErr
	}
	return f.memReporter.Report(ctx, a, o, now)
}

type podBundle struct {
	*bundle
	rep     *flakyReporter
	msgPath string
	fake    *clock.Fake
}

func setupPod(t *testing.T, command string) *podBundle {
	t.Helper()
	b := setup(t, command)
	msgPath := filepath.Join(b.work, "termination-log")
	return &podBundle{bundle: b, rep: &flakyReporter{msgPath: msgPath}, msgPath: msgPath}
}

// run runs the agent in pod mode to its end. With a fake clock it keeps
// advancing the clock a second at a time while the agent waits on it.
func (p *podBundle) run(t *testing.T, ctx context.Context) result {
	t.Helper()
	done := make(chan result, 1)
	go func() {
		out, err := RunInPod(ctx, p.cfg, p.rep, p.msgPath)
		done <- result{out, err, time.Now()}
	}()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case r := <-done:
			return r
		case <-deadline:
			t.Fatal("the agent did not finish")
		case <-time.After(2 * time.Millisecond):
			if p.fake != nil && p.fake.Waiters() > 0 {
				p.fake.Advance(time.Second)
			}
		}
	}
}

// record reads the termination message as a record; ok is false when
// there is none.
func (p *podBundle) record(t *testing.T) (podrecord.Record, bool) {
	t.Helper()
	data, err := os.ReadFile(p.msgPath)
	if errors.Is(err, os.ErrNotExist) {
		return podrecord.Record{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	rec, ok := podrecord.Parse(string(data))
	if !ok {
		t.Fatalf("termination message %q is no record", data)
	}
	return rec, true
}

func wantRecord(t *testing.T, rec podrecord.Record, outcome podrecord.Outcome, exit int32, a sdk.Attempt) {
	t.Helper()
	if rec.Outcome != outcome || rec.Attempt() != a || rec.ExitCode == nil || *rec.ExitCode != exit {
		t.Fatalf("record %+v; want %s exit %d of %s", rec, outcome, exit, a)
	}
}

func TestPodModeSuccessRecordWrittenBeforeTheReport(t *testing.T) {
	p := setupPod(t, `echo done`)
	r := p.run(t, context.Background())
	if r.err != nil || r.out.State != sdk.StateSuccess {
		t.Fatalf("%+v, %v", r.out, r.err)
	}
	rec, ok := p.record(t)
	if !ok {
		t.Fatal("no record")
	}
	wantRecord(t, rec, podrecord.Success, 0, p.cfg.Attempt)
	if p.rep.seenAtReport == nil || !strings.Contains(*p.rep.seenAtReport, `"SUCCESS"`) {
		t.Fatalf("at the report the termination message was %v", p.rep.seenAtReport)
	}
}

func TestPodModeFailedTaskWritesFailedRecordWithItsExitCode(t *testing.T) {
	p := setupPod(t, `exit 3`)
	r := p.run(t, context.Background())
	if r.err != nil || r.out.State != sdk.StateFailed {
		t.Fatalf("%+v, %v", r.out, r.err)
	}
	rec, _ := p.record(t)
	wantRecord(t, rec, podrecord.Failed, 3, p.cfg.Attempt)
	if rec.Reason != "exit_code: task exited with code 3" {
		t.Fatalf("reason %q", rec.Reason)
	}
}

func TestPodModeRescheduleExitCodeWritesRescheduleRecord(t *testing.T) {
	p := setupPod(t, `exit 99`)
	p.cfg.RescheduleExitCode = 99
	r := p.run(t, context.Background())
	if r.err != nil || r.out.State != sdk.StateUpForReschedule {
		t.Fatalf("%+v, %v", r.out, r.err)
	}
	rec, _ := p.record(t)
	wantRecord(t, rec, podrecord.Reschedule, 99, p.cfg.Attempt)
	if got := p.rep.reported(); len(got) != 1 || got[0].State != sdk.StateUpForReschedule {
		t.Fatalf("reported %+v", got)
	}
}

func TestPodModeLostReportKeepsTheDurableSuccessRecord(t *testing.T) {
	p := setupPod(t, `true`)
	p.fake = clock.NewFake(time.Unix(1_700_000_000, 0))
	p.cfg.Clock = p.fake
	p.rep.reportErr = fmt.Errorf("%w: control plane down", ErrUnanswered)
	r := p.run(t, context.Background())
	if !errors.Is(r.err, ErrNotReported) || r.out.State != sdk.StateSuccess {
		t.Fatalf("%+v, %v", r.out, r.err)
	}
	rec, _ := p.record(t)
	wantRecord(t, rec, podrecord.Success, 0, p.cfg.Attempt)
}

// The infra marker: RUNNING unanswered for 2 minutes (fake clock).
func TestPodModePreStartUnansweredFor2MinutesWritesInfraMarker(t *testing.T) {
	for name, unanswered := range map[string]error{
		"IsErrUnanswered":    ErrUnanswered,
		"WrapsErrUnanswered": fmt.Errorf("%w: no answer", ErrUnanswered),
		"WrapsItDeeper":      fmt.Errorf("running report: %w", fmt.Errorf("%w: 503 Service Unavailable", ErrUnanswered)),
	} {
		t.Run(name, func(t *testing.T) {
			p := setupPod(t, `touch "$WORK/ran"`)
			start := time.Unix(1_700_000_000, 0)
			p.fake = clock.NewFake(start)
			p.cfg.Clock = p.fake
			p.rep.runningErr = func(int) error { return unanswered }
			r := p.run(t, context.Background())
			if !errors.Is(r.err, ErrStartUnanswered) {
				t.Fatalf("err %v; want ErrStartUnanswered", r.err)
			}
			if waited := p.fake.Now().Sub(start); waited < StartRetryDefault {
				t.Fatalf("gave up after %s, before the 2-minute pre-start retry", waited)
			}
			rec, ok := p.record(t)
			if !ok || rec.Outcome != podrecord.Infra || rec.ExitCode != nil || !rec.HonoredInfra() || rec.Attempt() != p.cfg.Attempt {
				t.Fatalf("record %+v (%v); want the agent's infra marker", rec, ok)
			}
			if len(p.rep.calls) != 0 {
				t.Fatalf("reported %v; want nothing", p.rep.calls)
			}
			if _, err := os.Stat(filepath.Join(p.work, "ran")); err == nil {
				t.Fatal("the task's code ran")
			}
		})
	}
}

// On Lite the same unanswered start ends differently: the agent gives up
// after its 2-minute pre-start retry (fake clock) without running the task,
// reporting anything or writing a record, so its attempt stays queued for
// the dispatch-lost reaper (test/reapers proves that settle, on the infra
// rail).
func TestLiteModePreStartUnansweredFor2MinutesGivesUpReportingNothing(t *testing.T) {
	p := setupPod(t, `touch "$WORK/ran"`)
	start := time.Unix(1_700_000_000, 0)
	p.fake = clock.NewFake(start)
	p.cfg.Clock = p.fake
	p.rep.runningErr = func(int) error { return fmt.Errorf("%w: no answer", ErrUnanswered) }
	done := make(chan result, 1)
	go func() {
		out, err := Run(context.Background(), p.cfg, p.rep)
		done <- result{out, err, time.Now()}
	}()
	var r result
	deadline := time.After(30 * time.Second)
	for running := true; running; {
		select {
		case r = <-done:
			running = false
		case <-deadline:
			t.Fatal("the agent did not give up")
		case <-time.After(2 * time.Millisecond):
			if p.fake.Waiters() > 0 {
				p.fake.Advance(time.Second)
			}
		}
	}
	if !errors.Is(r.err, ErrStartUnanswered) {
		t.Fatalf("err %v; want ErrStartUnanswered", r.err)
	}
	if waited := p.fake.Now().Sub(start); waited < StartRetryDefault {
		t.Fatalf("gave up after %s, before the 2-minute pre-start retry", waited)
	}
	if len(p.rep.calls) != 0 {
		t.Fatalf("reported %v; want nothing", p.rep.calls)
	}
	if _, err := os.Stat(p.msgPath); err == nil {
		t.Fatal("a Lite agent wrote an outcome record")
	}
	if _, err := os.Stat(filepath.Join(p.work, "ran")); err == nil {
		t.Fatal("the task's code ran")
	}
}

// A pre-start call whose answer was lost for good (it applied, and cannot
// be made again) is an answer that never came, and waiting cannot bring it:
// the agent gives up at once, long before StartRetry, and writes the infra
// marker without running the task or reporting anything.
func TestPodModePreStartAnswerLostGivesUpAtOnceWithTheInfraMarker(t *testing.T) {
	p := setupPod(t, `touch "$WORK/ran"`)
	start := time.Unix(1_700_000_000, 0)
	p.fake = clock.NewFake(start)
	p.cfg.Clock = p.fake
	p.rep.runningErr = func(n int) error {
		if n == 1 {
			return fmt.Errorf("%w: connection reset", ErrUnanswered)
		}
		return fmt.Errorf("%w: %w: spent", ErrUnanswered, ErrAnswerLost)
	}
	r := p.run(t, context.Background())
	if !errors.Is(r.err, ErrStartUnanswered) || !errors.Is(r.err, ErrAnswerLost) {
		t.Fatalf("err %v; want ErrStartUnanswered for the lost answer", r.err)
	}
	if waited := p.fake.Now().Sub(start); waited >= StartRetryDefault/2 {
		t.Fatalf("gave up after %s; want at once", waited)
	}
	if p.rep.runningN != 2 {
		t.Fatalf("RUNNING tried %d times; want 2 (no retry after the answer was lost)", p.rep.runningN)
	}
	rec, ok := p.record(t)
	if !ok || !rec.HonoredInfra() || rec.Attempt() != p.cfg.Attempt || rec.Reason != AnswerLostReason {
		t.Fatalf("record %+v (%v); want the agent's infra marker for a lost answer", rec, ok)
	}
	if len(p.rep.calls) != 0 {
		t.Fatalf("reported %v; want nothing", p.rep.calls)
	}
	if _, err := os.Stat(filepath.Join(p.work, "ran")); err == nil {
		t.Fatal("the task's code ran")
	}
}

func TestPodModePreStartAnsweredWithinTheWindowRunsTheTask(t *testing.T) {
	p := setupPod(t, `true`)
	p.fake = clock.NewFake(time.Unix(1_700_000_000, 0))
	p.cfg.Clock = p.fake
	p.rep.runningErr = func(n int) error {
		if n < 4 {
			return fmt.Errorf("%w: restarting", ErrUnanswered)
		}
		return nil
	}
	r := p.run(t, context.Background())
	if r.err != nil || r.out.State != sdk.StateSuccess {
		t.Fatalf("%+v, %v", r.out, r.err)
	}
	rec, _ := p.record(t)
	wantRecord(t, rec, podrecord.Success, 0, p.cfg.Attempt)
}

func TestPodModePreStartRefusalIsNoInfraMarker(t *testing.T) {
	for name, errFor := range map[string]func(n int) error{
		"Refused": func(int) error { return fmt.Errorf("%w: superseded", ErrRefused) },
		"OneAnswerAmongUnanswered": func(n int) error {
			if n == 2 {
				return errors.New("an answer: permission denied")
			}
			return fmt.Errorf("%w: down", ErrUnanswered)
		},
		"NotUnanswered": func(int) error { return errors.New("some other failure") },
		"AnswerLostAfterAnAnswer": func(n int) error {
			if n == 1 {
				return errors.New("an answer: permission denied")
			}
			return fmt.Errorf("%w: %w: spent", ErrUnanswered, ErrAnswerLost)
		},
	} {
		t.Run(name, func(t *testing.T) {
			p := setupPod(t, `true`)
			p.fake = clock.NewFake(time.Unix(1_700_000_000, 0))
			p.cfg.Clock = p.fake
			p.rep.runningErr = errFor
			r := p.run(t, context.Background())
			if r.err == nil || errors.Is(r.err, ErrStartUnanswered) {
				t.Fatalf("err %v; want a plain start failure", r.err)
			}
			if rec, ok := p.record(t); ok {
				t.Fatalf("wrote record %+v; want none", rec)
			}
		})
	}
}

func TestPodModeSupersededAtRunningWritesNoRecord(t *testing.T) {
	p := setupPod(t, `true`)
	p.rep.terminateRunning = true
	r := p.run(t, context.Background())
	if !errors.Is(r.err, ErrSuperseded) {
		t.Fatalf("err %v", r.err)
	}
	if rec, ok := p.record(t); ok {
		t.Fatalf("wrote record %+v; want none", rec)
	}
}

func TestPodModeShouldTerminateStopsTaskGroupAndWritesFailed(t *testing.T) {
	p := setupPod(t, `sleep 1000 & sleep 1000`)
	p.fake = clock.NewFake(time.Unix(1_700_000_000, 0))
	p.cfg.Clock = p.fake
	p.rep.terminateHeartbeat = true
	var pgid int
	p.cfg.OnTaskStarted = func(g int) { pgid = g }
	r := p.run(t, context.Background())
	if r.err != nil || r.out.Reason != ReasonTerminated {
		t.Fatalf("%+v, %v", r.out, r.err)
	}
	assertGroupGone(t, pgid)
	rec, ok := p.record(t)
	if !ok || rec.Outcome != podrecord.Failed || !strings.HasPrefix(rec.Reason, ReasonTerminated+":") {
		t.Fatalf("record %+v", rec)
	}
}

func TestPodModeNeedsAMessagePath(t *testing.T) {
	p := setupPod(t, `true`)
	if _, err := RunInPod(context.Background(), p.cfg, p.rep, ""); err == nil {
		t.Fatal("pod mode ran without a termination message path")
	}
}

// An agent stopped from outside in a pod (the kubelet's SIGTERM: the pod
// deleted, evicted, preempted) stops its task and writes a FAILED record,
// but reports nothing: the pod's end settles the attempt, on the infra rail
// when the cluster disrupted it, and no retry of the task is spent.
func TestPodModeStoppedAgentStopsTheTaskButReportsNothing(t *testing.T) {
	p := setupPod(t, `sleep 1000 & sleep 1000`)
	ctx, cancel := context.WithCancel(context.Background())
	var pgid int
	p.cfg.OnTaskStarted = func(g int) { pgid = g; cancel() }
	r := p.run(t, ctx)
	if !errors.Is(r.err, ErrStopUnreported) || r.out.Reason != ReasonAgentStopped {
		t.Fatalf("%+v, %v", r.out, r.err)
	}
	assertGroupGone(t, pgid)
	p.rep.mu.Lock()
	reported := len(p.rep.outcomes)
	p.rep.mu.Unlock()
	if reported != 0 {
		t.Fatalf("the stopped agent reported %d outcomes, want none", reported)
	}
	rec, ok := p.record(t)
	if !ok || rec.Outcome != podrecord.Failed || !strings.HasPrefix(rec.Reason, ReasonAgentStopped+":") {
		t.Fatalf("record %+v", rec)
	}
}

// A task that traps the stop's SIGTERM and exits 0 (or leaves the group
// with a status of its own) does not give the stopped agent's record an
// exit code: the record keeps the "stopped from outside" shape the sweep
// reads (no exit code), so a deleted pod settles on the infra rail and no
// retry is spent (found by the soak on the real node).
func TestPodModeStoppedRecordHasNoExitCodeWhateverTheTaskExitedWith(t *testing.T) {
	ready := filepath.Join(t.TempDir(), "trapped")
	p := setupPod(t, `trap 'exit 0' TERM; touch '`+ready+`'; sleep 1000 & wait`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Stopped once the task has set its trap: the stop's SIGTERM then
	// ends it with status 0.
	p.cfg.OnTaskStarted = func(int) {
		go func() {
			// Off the test's goroutine: a miss shows as the task's status.
			eventually.Until(10*time.Second, func() bool {
				_, err := os.Stat(ready)
				return err == nil
			})
			cancel()
		}()
	}
	r := p.run(t, ctx)
	if !errors.Is(r.err, ErrStopUnreported) || r.out.Reason != ReasonAgentStopped || r.out.ExitCode != 0 {
		t.Fatalf("%+v, %v: want the agent stopped and the task's own status 0", r.out, r.err)
	}
	rec, ok := p.record(t)
	if !ok || rec.Outcome != podrecord.Failed || rec.ExitCode != nil || !rec.StoppedFromOutside() {
		t.Fatalf("record %+v (exit code %v): want FAILED, agent_stopped, no exit code", rec, rec.ExitCode)
	}
}

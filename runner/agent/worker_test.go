package agent

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
)

// claims is a scripted claim: each call hands out the next batch.
type claims struct {
	mu      sync.Mutex
	batches [][]Claimed
	calls   int
	err     error
	running [][]sdk.Attempt // what each call said the worker runs
}

func (c *claims) claim(_ context.Context, _ int, running []sdk.Attempt) ([]Claimed, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	c.running = append(c.running, running)
	if c.err != nil {
		return nil, c.err
	}
	if len(c.batches) == 0 {
		return nil, nil
	}
	b := c.batches[0]
	c.batches = c.batches[1:]
	return b, nil
}

func (c *claims) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

// TestWorkerDrainFinishesWhatItStartedAndClaimsNothingMore: stopping a
// worker (its pod's SIGTERM) does not stop or fail the attempt it runs:
// the attempt runs to its end and reports success, the worker claims
// nothing more, and returns once the attempt has ended.
func TestWorkerDrainFinishesWhatItStartedAndClaimsNothingMore(t *testing.T) {
	b := setup(t, "")
	gate := filepath.Join(b.work, "go")
	b.cfg.Command = `while [ ! -f "` + gate + `" ]; do sleep 0.05; done`
	a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}
	cl := &claims{batches: [][]Claimed{{{Attempt: a, Command: b.cfg.Command, Reporter: b.rep}}}}
	tmpl := b.cfg
	fake := clock.NewFake(time.Unix(1_700_000_000, 0))
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- RunWorker(ctx, WorkerConfig{Name: "w", Claim: cl.claim, Attempt: tmpl, Clock: fake, Poll: time.Second})
	}()
	b.pgid(t)
	stop() // the drain
	select {
	case err := <-done:
		t.Fatalf("the worker returned (%v) while its attempt ran", err)
	case <-time.After(200 * time.Millisecond):
	}
	calls := cl.count()
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the drained worker did not return")
	}
	if rep := b.rep.reported(); len(rep) != 1 || rep[0].State != sdk.StateSuccess {
		t.Fatalf("reported %+v: want the attempt's success", rep)
	}
	if cl.count() != calls {
		t.Fatalf("%d claims after the drain began", cl.count()-calls)
	}
}

// TestWorkerClaimSaysWhatItRuns: every claim lists the attempts whose Run
// has not returned, never "unknown": the claim after the one that handed
// an attempt over lists it while its task runs, and once the task has ended
// the next claim no longer does (the positive signal the kube sweep
// confirms a warm mark from).
func TestWorkerClaimSaysWhatItRuns(t *testing.T) {
	b := setup(t, "")
	gate := filepath.Join(b.work, "go")
	b.cfg.Command = `while [ ! -f "` + gate + `" ]; do sleep 0.05; done`
	a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1, Epoch: 2}
	cl := &claims{batches: [][]Claimed{{{Attempt: a, Command: b.cfg.Command, Reporter: b.rep}}}}
	fake := clock.NewFake(time.Unix(1_700_000_000, 0))
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	wc := WorkerConfig{Name: "w", Slots: 2, Claim: cl.claim, Attempt: b.cfg, Clock: fake, Poll: time.Second}
	wc.testSignals.polled.Init(t)
	wc.testSignals.ended.Init(t)
	go func() { done <- RunWorker(ctx, wc) }()
	b.pgid(t)
	wc.testSignals.polled.WaitOrTimeout() // the first poll, at start
	// said moves the clock one poll at a time, each once the worker waits
	// for it, until n claims were made.
	said := func(n int) [][]sdk.Attempt {
		t.Helper()
		for cl.count() < n {
			fake.Advance(time.Second)
			wc.testSignals.polled.WaitOrTimeout()
		}
		cl.mu.Lock()
		defer cl.mu.Unlock()
		return slices.Clone(cl.running)
	}
	got := said(2)
	if got[0] == nil || len(got[0]) != 0 {
		t.Fatalf("first claim said %v: want an empty list (runs nothing), not unknown", got[0])
	}
	if len(got[1]) != 1 || got[1][0] != a {
		t.Fatalf("claim while %s runs said %v", a, got[1])
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if ended := wc.testSignals.ended.WaitOrTimeout(); ended != a {
		t.Fatalf("attempt %s ended, want %s", ended, a)
	}
	if len(b.rep.reported()) == 0 {
		t.Fatal("the attempt never reported")
	}
	deadline := time.Now().Add(10 * time.Second)
	for n := cl.count() + 2; ; n++ {
		got = said(n)
		if last := got[len(got)-1]; len(last) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("claims after the attempt ended still list it: %v", got)
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestWorkerRefusedClaimStopsTheWorker: a claim refused for good (a lapsed
// worker credential) stops the worker with ErrWorkerRefused; a passing
// failure is retried at the next poll.
func TestWorkerRefusedClaimStopsTheWorker(t *testing.T) {
	b := setup(t, "true")
	cl := &claims{err: errors.New("connection refused")}
	fake := clock.NewFake(time.Unix(1_700_000_000, 0))
	done := make(chan error, 1)
	wc := WorkerConfig{Name: "w", Claim: cl.claim, Attempt: b.cfg, Clock: fake, Poll: time.Second}
	wc.testSignals.polled.Init(t)
	go func() { done <- RunWorker(context.Background(), wc) }()
	wc.testSignals.polled.WaitOrTimeout() // the first claim failed
	// The next two polls claim again.
	for range 2 {
		fake.Advance(time.Second)
		wc.testSignals.polled.WaitOrTimeout()
	}
	if n := cl.count(); n != 3 {
		t.Fatalf("%d claims: a passing failure was not retried", n)
	}
	cl.mu.Lock()
	cl.err = ErrRefused
	cl.mu.Unlock()
	fake.Advance(time.Second) // the worker waits for this tick: its claim is refused
	select {
	case err := <-done:
		if !errors.Is(err, ErrWorkerRefused) {
			t.Fatalf("worker ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the refused worker did not stop")
	}
}

func TestWorkerInvocationRoundTrip(t *testing.T) {
	in := Invocation{Mode: ModeWorker, Worker: "reaper-warm-default-0a1b2c3d4e", Reporter: ReporterAPI, Slots: 2,
		Poll: 500 * time.Millisecond, Watchdog: time.Hour, Heartbeat: 15 * time.Second, TerminateGrace: 3 * time.Second,
		KillWait: 4 * time.Second, LogLevel: "debug"}
	out := Invocation{}
	flags := flag.NewFlagSet("reaper-agent", flag.ContinueOnError)
	out.Bind(flags)
	if err := flags.Parse(in.WorkerArgs()); err != nil {
		t.Fatal(err)
	}
	out.TerminationMessagePath, out.Shell, out.DrainBound = "", "", 0 // defaults of the other modes
	if out != in {
		t.Fatalf("round trip:\n got %+v\nwant %+v", out, in)
	}
	if err := out.Validate(); err != nil {
		t.Fatalf("a worker invocation without attempt flags: %v", err)
	}
	for _, bad := range []Invocation{
		{Mode: ModeWorker, Reporter: ReporterAPI},                         // no name
		{Mode: ModeWorker, Worker: "w", Reporter: ReporterFile},           // not the API
		{Mode: ModeWorker, Worker: "w", Reporter: ReporterAPI, Slots: -1}, // negative
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v validated", bad)
		}
	}
}

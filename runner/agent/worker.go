package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/internal/testsignal"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
)

// Worker mode: the agent as a warm pool worker, a long-lived pod of the
// kube edition that runs attempts one after another (or a few at once).
//
// Every Poll, while it has a free slot, the worker claims the attempts the
// runner bound to it (Claim, authorised by the worker's own credential),
// and each claim says which attempts it runs at that moment: an attempt
// counts from the claim that handed it over until its Run has returned
// (its task's group gone), and the claims are made one after another, so
// a claim that does not list an attempt proves the worker no longer runs
// it (the kube sweep confirms a warm mark on it).
// Each claimed attempt comes with the attempt's own credential, and the
// worker runs it exactly as a dedicated agent runs its one attempt (Run):
// RUNNING first (an answer of should_terminate means another execution has
// it or it moved on: it never starts), heartbeats, the whole-group kill at
// the declared timeout, and the outcome reported through the API, failures
// included. A warm attempt writes no outcome record: its pod serves other
// attempts and no reconciler reads one for it.
//
// Its wall-clock bound is the watchdog (WorkerConfig.Watchdog, the
// credential ceiling): at it the task's group is SIGKILLed and the attempt
// is reported failed as credential_ceiling.
//
// Stopping the worker (ctx done: the pod's SIGTERM) drains it: it claims
// nothing more and returns once the attempts it started have ended and
// reported. Attempts bound to it that it never started stay queued: the
// runner requeues them on the warm requeue rail once the worker's pod is
// going or gone. If the grace runs out first, the container's end kills
// the rest; those attempts go silent, and the warm-worker-lost reaper
// fails them on the infra rail once the pod is gone.

// Claimed is one attempt a worker claimed: what it runs and its own line
// to the control plane.
type Claimed struct {
	Attempt          sdk.Attempt
	Command          string
	ExecutionTimeout time.Duration
	// Reporter makes the attempt's own calls, with the attempt's own
	// credential.
	Reporter Reporter
	// Close releases Reporter once the attempt has ended; may be nil.
	Close func()
	// Refuse, when set, says why the worker must not run the attempt (its
	// command was withheld as over the limit): it is failed
	// (ReasonCommandTooLarge) instead.
	Refuse string
}

// Defaults of WorkerConfig.
const (
	WorkerPollDefault  = time.Second
	WorkerSlotsDefault = 1
)

// WorkerConfig configures RunWorker.
type WorkerConfig struct {
	// Name is the worker's name (its pod's). Required.
	Name string
	// Slots is how many attempts it runs at once; default
	// WorkerSlotsDefault.
	Slots int
	// Poll is how often it claims while it has a free slot; default
	// WorkerPollDefault.
	Poll time.Duration
	// Watchdog is each attempt's wall-clock bound (Config.Watchdog); 0:
	// none.
	Watchdog time.Duration
	// Claim asks for at most slots attempts bound to the worker, saying
	// which attempts the worker runs at that moment (running: every
	// attempt it took and whose Run has not returned, none an empty list).
	// An error wrapping ErrRefused (the worker's credential lapsed or was
	// refused) stops the worker; any other is retried at the next poll.
	// Required.
	Claim func(ctx context.Context, slots int, running []sdk.Attempt) ([]Claimed, error)
	// Attempt is the template of every attempt's Config: the record
	// directory, output, heartbeat, graces (its Attempt, Command,
	// ExecutionTimeout and Watchdog are set per attempt).
	Attempt Config
	// Subreaper makes the worker a child subreaper that ends, at each
	// attempt's end, the processes that escaped it (see warm.go). The
	// reaper-agent binary sets it; a test running the worker inside its own
	// process leaves it off.
	Subreaper bool
	// ScratchDir is where each attempt's scratch directory is made;
	// default the worker's temporary directory.
	ScratchDir string
	// Clock times the polls; default clock.Real.
	Clock clock.Clock
	// Logger is the worker's log; default a null logger.
	Logger hclog.Logger

	// testSignals are the points tests wait for; no-ops unless a test
	// initialised them.
	testSignals workerTestSignals
}

// workerTestSignals are the points of RunWorker a test can wait for.
type workerTestSignals struct {
	// polled: a poll is done (its claim made, the attempts it handed over
	// started) and the worker waits for the next tick.
	polled testsignal.TestSignal[struct{}]
	// ended: a claimed attempt's Run has returned and the worker no longer
	// counts it as running.
	ended testsignal.TestSignal[sdk.Attempt]
}

func compareAttempts(a, b sdk.Attempt) int {
	return cmp.Or(cmp.Compare(a.RunID, b.RunID), cmp.Compare(a.TaskID, b.TaskID),
		cmp.Compare(a.Try, b.Try), cmp.Compare(a.Epoch, b.Epoch))
}

// ErrClaimTooLarge, wrapped by a Claim's error, says the answer was over
// what the worker reads: nothing of it was used. The worker asks for half
// as many attempts at its next claim (down to one), and back up by doubling
// once claims are answered again.
var ErrClaimTooLarge = errors.New("the claim's answer was over what the worker reads")

// ErrWorkerRefused: the worker's claim was refused (its credential lapsed,
// say): it can claim nothing more and stopped.
var ErrWorkerRefused = errors.New("the control plane refused the warm worker's claim")

// RunWorker runs the worker until ctx is done, then drains it (see the
// worker-mode notes above). It returns nil after a drain, or an error
// wrapping ErrWorkerRefused once its claims are refused (after the
// attempts it runs have ended).
func RunWorker(ctx context.Context, cfg WorkerConfig) error {
	if err := cfg.withDefaults(); err != nil {
		return err
	}
	log := cfg.Logger.With("worker", cfg.Name)
	w := &worker{cfg: cfg, log: log, tree: &warmTree{},
		// The attempts outlive the worker's ctx: a drain lets them end.
		runCtx:  context.WithoutCancel(ctx),
		running: map[sdk.Attempt]bool{},
		ask:     cfg.Slots,
	}
	if cfg.Subreaper {
		if err := becomeSubreaper(); err != nil {
			log.Warn("the worker cannot end its attempts' escaped processes", "error", err)
		} else {
			w.tree.enabled = true
		}
	}
	defer w.wg.Wait()
	ticker := cfg.Clock.NewTicker(cfg.Poll)
	defer ticker.Stop()
	log.Info("warm worker started", "slots", cfg.Slots, "watchdog", cfg.Watchdog)
	for {
		if err := w.poll(ctx); err != nil {
			return err
		}
		cfg.testSignals.polled.Signal(struct{}{})
		select {
		case <-ctx.Done():
			w.mu.Lock()
			n := len(w.running)
			w.mu.Unlock()
			log.Info("warm worker stopping: claiming nothing more, waiting for the attempts it runs", "running", n)
			return nil
		case <-ticker.C():
		}
	}
}

// withDefaults checks the configuration and fills in its defaults.
func (cfg *WorkerConfig) withDefaults() error {
	if cfg.Name == "" || cfg.Claim == nil {
		return errors.New("warm worker: a name and a claim are required")
	}
	if cfg.Slots <= 0 {
		cfg.Slots = WorkerSlotsDefault
	}
	if cfg.Poll <= 0 {
		cfg.Poll = WorkerPollDefault
	}
	if cfg.Watchdog < 0 {
		return fmt.Errorf("warm worker: negative watchdog %s", cfg.Watchdog)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	return nil
}

// worker is a running warm worker: the attempts it runs, each on a
// goroutine of its own that wg waits for.
type worker struct {
	cfg    WorkerConfig
	log    hclog.Logger
	tree   *warmTree
	runCtx context.Context
	wg     sync.WaitGroup
	mu     sync.Mutex
	// running are the attempts the worker runs (guarded by mu).
	running map[sdk.Attempt]bool
	// ask is the most one claim asks for: halved by an answer too large.
	ask int
}

// poll claims attempts for the worker's free slots, if it has any, and
// starts those handed over. Its error, once the claims are refused, wraps
// ErrWorkerRefused (returned after the attempts it runs have ended).
func (w *worker) poll(ctx context.Context) error {
	w.mu.Lock()
	free := w.cfg.Slots - len(w.running)
	holds := make([]sdk.Attempt, 0, len(w.running))
	for a := range w.running {
		holds = append(holds, a)
	}
	w.mu.Unlock()
	if free <= 0 {
		return nil
	}
	slices.SortFunc(holds, compareAttempts)
	slots := min(free, w.ask)
	claimed, err := w.cfg.Claim(ctx, slots, holds)
	switch {
	case ctx.Err() != nil:
	case errors.Is(err, ErrClaimTooLarge):
		w.ask = max(1, slots/2)
		w.log.Error("a claim's answer was too large to read: refused, asking for fewer attempts next",
			"slots", slots, "next", w.ask, "error", err)
	case err == nil:
		w.ask = min(w.cfg.Slots, w.ask*2)
	case errors.Is(err, ErrRefused):
		w.log.Error("the warm worker's claim was refused: claiming nothing more", "error", err)
		w.wg.Wait()
		return fmt.Errorf("%w: %w", ErrWorkerRefused, err)
	case err != nil:
		w.log.Warn("claiming failed; trying again at the next poll", "error", err)
	}
	for _, c := range claimed {
		w.start(c)
	}
	return nil
}

// start runs a claimed attempt on a goroutine of its own, unless the
// worker runs it already or has no slot left for it (then its credential
// is closed and it is left alone).
func (w *worker) start(c Claimed) {
	w.mu.Lock()
	dup := w.running[c.Attempt] || len(w.running) >= w.cfg.Slots
	if !dup {
		w.running[c.Attempt] = true
	}
	w.mu.Unlock()
	if dup {
		if c.Close != nil {
			c.Close()
		}
		return
	}
	log := w.log
	acfg := w.cfg.Attempt
	acfg.Attempt, acfg.Command, acfg.ExecutionTimeout, acfg.Watchdog =
		c.Attempt, c.Command, c.ExecutionTimeout, w.cfg.Watchdog
	if acfg.Logger == nil {
		acfg.Logger = log
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		out, err := w.tree.run(w.runCtx, acfg, c, w.cfg.ScratchDir, log)
		switch {
		case errors.Is(err, ErrSuperseded):
			log.Info("claimed attempt not started: it moved on or another execution has it", "attempt", c.Attempt.String())
		case err != nil:
			log.Error("claimed attempt ended with an error", "attempt", c.Attempt.String(), "error", err)
		default:
			log.Info("claimed attempt ended", "attempt", c.Attempt.String(), "state", out.State)
		}
		if c.Close != nil {
			c.Close()
		}
		w.mu.Lock()
		delete(w.running, c.Attempt)
		w.mu.Unlock()
		w.cfg.testSignals.ended.Signal(c.Attempt)
	}()
}

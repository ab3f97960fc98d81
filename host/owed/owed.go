// Package owed keeps the teardowns owed until done: a leader component of
// its own, beside the maintenance loop (host/cycle).
//
// A reaper tears down what it reaped once its mark is on the board. The
// loop hands each (non-dry-run) pass executions wrapped by Service.Wrap, so
// that a teardown that does not complete is written to the board
// (owed_teardowns): the whole call failed, or an object's outcome carries
// an error other than "it was gone". The reaper's own *_pod_delete_error
// decision meters the first failure; the row is the memory. Every interval
// the leader tries the owed teardowns that are due again, through the
// substrate, under a budget of their own (Budget), so that they never take
// time from the sweep or the reapers. A retry that completes removes the
// row (reap_teardown_retried); one that fails again is its reaper's
// *_pod_delete_error decision, and the row's next try backs off. A mark is
// never touched.
package owed

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/host/audit"
	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/host/metrics"
	"github.com/dexaflow/reaper/internal/testsignal"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// Teardowns is the board's memory of teardowns that did not complete
// (board.Store).
type Teardowns interface {
	OweTeardown(ctx context.Context, f board.TeardownFailure, b board.TeardownBackoff) (board.OwedTeardown, error)
	DueTeardowns(ctx context.Context, term int64, now time.Time, limit int) ([]board.OwedTeardown, error)
	TeardownDone(ctx context.Context, id, term int64, now time.Time) (bool, error)
	TeardownFailed(ctx context.Context, id, term int64, now time.Time, failure string, b board.TeardownBackoff) (board.OwedTeardown, error)
	OwedTeardownCount(ctx context.Context) (int, error)
}

// Leadership tells whether this replica leads at a moment.
type Leadership interface {
	Status(now time.Time) leader.Status
}

// Substrate hands out the substrate, (re)starting it when it is down
// (host/supervise).
type Substrate interface {
	Get(ctx context.Context, now time.Time) (sdk.Substrate, error)
}

// Defaults of the owed teardowns' retries.
const (
	// BackoffCapDefault is the longest wait between two tries of an owed
	// teardown (Config.Backoff.Cap's default); the first wait is one
	// interval.
	BackoffCapDefault = 5 * time.Minute
	// Page is the most owed teardowns a run tries again; the rest (the
	// longest due first) wait for the next run.
	Page = 100
	// MaxUnrecorded bounds the failed teardowns kept in memory while the
	// board cannot record them.
	MaxUnrecorded = 10_000
	// writeTimeout bounds the write of one owed teardown from inside a
	// pass (its share may be spent: the write outlives it).
	writeTimeout = 5 * time.Second
)

// Budget is the time a run gives the retries of owed teardowns: a quarter
// of the interval, so that an overrun never takes from the sweep's or the
// reapers' budgets.
func Budget(interval time.Duration) time.Duration { return interval / 4 }

// Config configures the owed teardowns' service.
type Config struct {
	// Interval is the time between two runs. Default the ladder's
	// maintenance interval (ladder.Defaults).
	Interval time.Duration
	// Backoff spaces an owed teardown's tries. Default: Base one interval,
	// Cap BackoffCapDefault (or Base when longer).
	Backoff board.TeardownBackoff
	// DryRun is the global dry run: nothing is retried.
	DryRun bool
	// Declared are the decision labels each reaper's Info declared, by
	// name: a failed teardown of a reaper whose mark the sdk does not know
	// is metered under the one *_pod_delete_error label it declared
	// (DeleteErrLabel).
	Declared map[string][]string
	Clock    clock.Clock
	Logger   hclog.Logger
	Metrics  *metrics.Metrics
	// Decisions is the host's decision pipeline (host/audit), shared with
	// its other producers: every retry's decision is metered, logged,
	// audited and retried there. nil: the service's own, over its
	// auditor, Metrics and Logger.
	Decisions *audit.Pipeline
}

// withDefaults fills in every default: the one place the service's
// defaults are decided.
func (c Config) withDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = ladder.Defaults().MaintenanceInterval
	}
	if c.Backoff.Base <= 0 {
		c.Backoff.Base = c.Interval
	}
	if c.Backoff.Cap <= 0 {
		c.Backoff.Cap = max(BackoffCapDefault, c.Backoff.Base)
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.Metrics == nil {
		c.Metrics = metrics.New()
	}
	return c
}

// TestSignals are the points a test can wait for (internal/testsignal).
type TestSignals struct {
	// Paid carries what every run of a leader decided.
	Paid testsignal.TestSignal[Result]
	// Owed carries every failed teardown of a pass once it is written to
	// the board, or kept for the next run when the board could not take it.
	Owed testsignal.TestSignal[board.TeardownFailure]
}

// Init makes every signal record (tests only).
func (s *TestSignals) Init(tb testsignal.TB) {
	s.Paid.Init(tb)
	s.Owed.Init(tb)
}

// Result reports one run, for tests and logs.
type Result struct {
	// Decisions are the run's decisions: each retry's.
	Decisions []sdk.Decision
	// Overran says the retries outlived their budget.
	Overran bool
}

// Service remembers the teardowns that did not complete and tries them
// again on the leader.
type Service struct {
	cfg       Config
	lead      Leadership
	board     Teardowns
	substrate Substrate
	// decisions meters, logs and audits the retries' decisions, and keeps
	// what a write failed to put in the audit, writing it again at the
	// next run.
	decisions *audit.Pipeline
	owing     owing // failed teardowns the board could not record yet

	// TestSignals are for tests; production leaves them alone.
	TestSignals TestSignals
}

// New returns the owed teardowns' service.
func New(cfg Config, lead Leadership, teardowns Teardowns, substrate Substrate, auditor audit.Writer) *Service {
	cfg = cfg.withDefaults()
	decisions := audit.NewPipeline(auditor, cfg.Metrics, cfg.Logger)
	if cfg.Decisions != nil {
		decisions = cfg.Decisions.With(cfg.Logger)
	}
	return &Service{cfg: cfg, lead: lead, board: teardowns, substrate: substrate, decisions: decisions}
}

// NeedsLeadership is true: its retries are fenced by the elector's term.
func (s *Service) NeedsLeadership() bool { return true }

// Run tries the owed teardowns due every interval until ctx is done, then
// returns nil. Ticks that fall due while a run is still under way are
// coalesced into one.
func (s *Service) Run(ctx context.Context) error {
	tk := s.cfg.Clock.NewTicker(s.cfg.Interval)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			// A last try for what the audit still lacks.
			s.decisions.Retry(context.WithoutCancel(ctx))
			return nil
		case <-tk.C():
			s.RunOnce(ctx)
		}
	}
}

// teardownOwed classifies a teardown: it is owed (not complete) when the
// whole call failed, or when an object's outcome carries an error that is
// not sdk.TeardownGone's. Stopped in place, deleted (the fallback too),
// skipped as terminal, nothing found, and gone are complete. why says what
// failed.
func teardownOwed(out []sdk.TeardownOutcome, err error) (why string, owed bool) {
	if err != nil {
		return err.Error(), true
	}
	var parts []string
	for _, o := range out {
		if o.Incomplete() {
			parts = append(parts, o.Object+": "+o.Error)
		}
	}
	return strings.Join(parts, "; "), len(parts) > 0
}

// deleteErrSuffix ends every label a failed teardown is metered under.
const deleteErrSuffix = "_pod_delete_error"

// DeleteErrLabel is the *_pod_delete_error label a failed teardown of a
// reaper's, for reason, is metered under: by its mark when the sdk knows
// it, else the one *_pod_delete_error label the reaper declared (its
// Info's, when sdk.CheckDeclared takes them), else
// reap_teardown_owed_error. The label is written on the owed
// row, and every retry of the row reads it there.
func DeleteErrLabel(declared []string, reason string) string {
	switch reason {
	case sdk.LabelAgentLost, sdk.LabelCredentialCeiling:
		return sdk.LabelAgentLostPodDeleteErr
	case sdk.LabelDispatchLost, sdk.LabelStartExpired:
		return sdk.LabelDispatchLostPodDeleteErr
	case sdk.LabelPodLost:
		return sdk.LabelPodLostPodDeleteErr
	case sdk.LabelOrphanRun:
		return sdk.LabelOrphanRunPodDeleteErr
	}
	if sdk.CheckDeclared(sdk.Info{DecisionLabels: declared}) != nil {
		declared = nil // refused by the loop too: only the sdk's labels are taken
	}
	label := ""
	for _, l := range declared {
		if strings.HasSuffix(l, deleteErrSuffix) && l != label {
			if label != "" {
				return sdk.LabelTeardownOwedError // two: none is the reaper's own
			}
			label = l
		}
	}
	if label == "" {
		return sdk.LabelTeardownOwedError
	}
	return label
}

// owing is the memory of failed teardowns between the passes that fail
// them and the board: what the board could not record yet.
type owing struct {
	mu         sync.Mutex
	unrecorded []board.TeardownFailure
}

func (o *owing) keep(f board.TeardownFailure) (dropped bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.unrecorded = append(o.unrecorded, f)
	if len(o.unrecorded) > MaxUnrecorded {
		o.unrecorded = o.unrecorded[1:]
		return true
	}
	return false
}

func (o *owing) take() []board.TeardownFailure {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := o.unrecorded
	o.unrecorded = nil
	return out
}

func (o *owing) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.unrecorded)
}

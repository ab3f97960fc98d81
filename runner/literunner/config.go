package literunner

import (
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/runner/cyclemeter"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/substrate/lite/records"
)

// Defaults of Config.
const (
	// IntervalDefault is how often Run runs a cycle: the scheduler's tick,
	// not the maintenance interval (the reapers' cadence).
	IntervalDefault = time.Second
	// MaxParallelDefault: no bound on live agents.
	MaxParallelDefault = 0
	// DispatchUnavailableWindowDefault is how long a task whose agent cannot
	// be started for a passing reason (no process slot, no memory, no file
	// descriptor, a full disk) is offered again before it fails for good: the
	// window the specification gives a pod create refused as unavailable.
	DispatchUnavailableWindowDefault = 15 * time.Minute
	// LogLevelDefault is the agents' log level.
	LogLevelDefault = "info"
)

// Minter mints an attempt's credential: attempttoken.Issuer.
type Minter interface {
	Mint(a sdk.Attempt, now time.Time) (attempttoken.Credential, error)
}

// Meter is told what each cycle of the runner measured (host/metrics is
// one), as the attempt API meters its calls.
type Meter = cyclemeter.Meter

// Config configures a Runner. Zero values take the defaults (withDefaults).
type Config struct {
	// AgentPath is the reaper-agent executable. Default: reaper-agent next
	// to the running executable, else on PATH (SpawnerConfig).
	AgentPath string
	// Records is the verified record directory the spawner writes each
	// agent's .pid record into. It must be the one the Lite substrate (and
	// so the reapers) reads. When nil, RecordDir is opened, and the Runner
	// owns it (Close releases it).
	Records *records.Dir
	// RecordDir is the record directory opened when Records is nil.
	// Default: $TMPDIR/dexaflow-agent-pids-<uid> (records.DefaultPath).
	RecordDir string
	// LogDir receives each attempt's task output (<attempt>.out) and agent
	// log (<attempt>.agent.log). Default: the record directory.
	LogDir string
	// RunAs, when set, is the user every task runs as (runner.run_as): see
	// SpawnerConfig.RunAs. "": the tasks run as reaperd's user.
	RunAs string
	// Credentials mints each attempt's credential at dispatch
	// (attempttoken.Issuer): the agent reports RUNNING, heartbeats and its
	// outcome to reaperd's attempt API with it, and never receives the
	// board's connection string. Required.
	Credentials Minter
	// Heartbeat is the agents' heartbeat interval. Default: Ladder.Heartbeat.
	Heartbeat time.Duration
	// Pools are the pools' slots, by name: a task instance starts only into
	// open slots of its pool. A pool named nowhere has none, but for the
	// default pool (lifecycle.DefaultPool), unbounded unless named. Nil or
	// empty: every pool is unbounded.
	Pools map[string]int
	// Recovery is the recovery budget: every recovery dispatch (a retry,
	// an infra re-place, any later execution of a task that ran) spends a
	// token of its pool's, and one the budget refuses waits scheduled for
	// a later cycle. The zero value: unbounded.
	Recovery lifecycle.RecoveryBudget
	// MaxActiveRuns is the run start cap: queued runs are started, oldest
	// first, while fewer than this many runs are running. 0: no cap (every
	// queued run is started at the next tick). Negative is refused.
	MaxActiveRuns int
	// MaxParallel bounds the attempts of the Lite executor handed out and
	// not yet ended (queued plus running, as the board counts them). 0: no
	// bound. Negative is refused.
	MaxParallel int
	// DispatchUnavailableWindow is how long, from the first failure, a task
	// whose agent could not be started for a passing reason is offered
	// again before it fails as dispatch_failed. Default
	// DispatchUnavailableWindowDefault.
	DispatchUnavailableWindow time.Duration
	// Interval is Run's period. Default IntervalDefault.
	Interval time.Duration
	// Ladder gives the thresholds the runner judges by (the infra
	// confirmation valve, the heartbeat). Default: ladder.Defaults(); a
	// partly filled ladder is used as given.
	Ladder ladder.Ladder
	// AgentLogLevel is the agents' log level. Default LogLevelDefault.
	AgentLogLevel string
	// Leading is the host's leadership at now: the term that fences the
	// cycle's writes, and whether this replica leads. Run needs it; RunOnce
	// does not.
	Leading func(now time.Time) (term int64, leading bool)
	// Meter is told what every cycle Run runs measured (host/metrics is
	// one). Default: nothing is told.
	Meter Meter
	// OnResult, when set, receives the result of every cycle Run runs (the
	// host meters and audits its decisions), after Meter. It is called on
	// Run's goroutine and must not block for long.
	OnResult func(Result)
	// Clock is the only time the runner reads. Default clock.Real{}.
	Clock clock.Clock
	// Logger logs what changed. Default: a null logger.
	Logger hclog.Logger
}

// withDefaults fills in every default and validates the result: the one
// place defaults are decided.
func (c Config) withDefaults() (Config, error) {
	if c.Ladder == (ladder.Ladder{}) {
		c.Ladder = ladder.Defaults()
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = c.Ladder.Heartbeat
	}
	if c.DispatchUnavailableWindow == 0 {
		c.DispatchUnavailableWindow = DispatchUnavailableWindowDefault
	}
	if c.Interval == 0 {
		c.Interval = IntervalDefault
	}
	if c.AgentLogLevel == "" {
		c.AgentLogLevel = LogLevelDefault
	}
	if c.Meter == nil {
		c.Meter = cyclemeter.None{}
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}

	var errs []error
	if c.Credentials == nil {
		errs = append(errs, errors.New("no credential minter: the agents could not report to the attempt API"))
	}
	if c.MaxActiveRuns < 0 {
		errs = append(errs, fmt.Errorf("max_active_runs %d: must be 0 (no cap) or more", c.MaxActiveRuns))
	}
	if c.MaxParallel < 0 {
		errs = append(errs, fmt.Errorf("max_parallel %d: must be 0 (no bound) or more", c.MaxParallel))
	}
	if c.Heartbeat <= 0 {
		errs = append(errs, fmt.Errorf("heartbeat %s: must be positive", c.Heartbeat))
	}
	if c.Interval <= 0 {
		errs = append(errs, fmt.Errorf("interval %s: must be positive", c.Interval))
	}
	if c.DispatchUnavailableWindow < 0 {
		errs = append(errs, fmt.Errorf("dispatch unavailable window %s: must not be negative", c.DispatchUnavailableWindow))
	}
	if c.Ladder.InfraConfirmValve <= 0 {
		errs = append(errs, fmt.Errorf("infra_confirm_valve %s: must be positive", c.Ladder.InfraConfirmValve))
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, fmt.Errorf("lite runner: %w", err)
	}
	return c, nil
}

package literunner

import (
	"fmt"
	"math"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/internal/runas"
	"github.com/dexaflow/reaper/internal/settingrule"
)

// PoolSlotsMax bounds a pool block's slots, and a recovery_burst.
const PoolSlotsMax = 1 << 30

// Settings is the runner block of reaperd's configuration (its kube block
// and the edition's rules apart, which host/config keeps): the runner's
// tick, caps, pools and recovery budget, which the kube runner takes too,
// and where and as whom the Lite runner starts its agents. host/config
// decodes it (Block, PoolBlock); the daemon makes a Runner of it.
type Settings struct {
	Interval      time.Duration // the runner's tick; 0: IntervalDefault
	MaxParallel   int           // bound on queued plus running Lite attempts; 0: none
	MaxActiveRuns int           // the run start cap: most runs running at once; 0: none
	Agent         string        // the reaper-agent binary; default <plugin_dir>/reaper-agent
	LogDir        string        // where task output and agent logs go; default: the record directory
	// RunAs is run_as (Lite only): the user every task runs as, another
	// than reaperd's, which must be able to switch to it (root, or
	// CAP_SETUID and CAP_SETGID); "": reaperd's own user (CheckRunAs).
	RunAs string
	// Pools are the pool blocks' slots, by pool name; nil when none.
	Pools map[string]int
	// Recovery is the recovery budget: recovery_rate and recovery_burst of
	// the runner block for every pool, and of the pool blocks that set
	// their own.
	Recovery lifecycle.RecoveryBudget
}

// Block is the runner block as written (its kube and pool blocks apart).
// Numbers are read as numbers, not ints, so that Settings words the
// refusal of -1 or 1.5 itself.
type Block struct {
	Interval      time.Duration `reaper:"interval"`
	RecoveryRate  float64       `reaper:"recovery_rate"`
	RecoveryBurst float64       `reaper:"recovery_burst"`
	MaxParallel   float64       `reaper:"max_parallel"`
	MaxActiveRuns float64       `reaper:"max_active_runs"`
	Agent         string        `reaper:"agent"`
	LogDir        string        `reaper:"log_dir"`
	RunAs         string        `reaper:"run_as"`
}

// DefaultBlock is the runner block's defaults: what a block that leaves a
// key out has.
func DefaultBlock() Block {
	return Block{RecoveryRate: lifecycle.RecoveryRateDefault, RecoveryBurst: lifecycle.RecoveryBurstDefault}
}

// CheckRunAs says why the Lite runner cannot start its tasks as user, or
// nil: user must be another than reaperd's, not root, and reaperd must be
// able to switch to it.
func CheckRunAs(user string) error {
	if _, err := runas.Lookup(user); err != nil {
		return err
	}
	return runas.CheckCanSwitch()
}

// Settings holds the block to its rules: the settings it makes (Pools
// and the pools' own budgets are the pool blocks', PoolBlock; RunAs is
// checked by CheckRunAs, on the Lite edition; Agent as written), and each
// value refused, in the order of the block's rules.
func (b Block) Settings() (Settings, []settingrule.Problem) {
	s := Settings{Interval: b.Interval, Agent: b.Agent, LogDir: b.LogDir, RunAs: b.RunAs}
	var problems []settingrule.Problem
	if n := b.MaxParallel; n < 0 || n != float64(int(n)) {
		problems = append(problems, settingrule.At("max_parallel", "max_parallel must be a whole number, 0 or more."))
	}
	s.MaxParallel = int(b.MaxParallel)
	if n := b.MaxActiveRuns; n < 0 || n != float64(int(n)) {
		problems = append(problems, settingrule.At("max_active_runs", "max_active_runs must be a whole number, 0 (no cap) or more."))
	}
	s.MaxActiveRuns = int(b.MaxActiveRuns)
	var p []settingrule.Problem
	s.Recovery.Default, p = recoveryLimit(b.RecoveryRate, b.RecoveryBurst, "")
	return s, append(problems, p...)
}

// PoolBlock is a pool block of the runner block, as written. Its recovery
// budget defaults to the runner block's (DefaultPoolBlock).
type PoolBlock struct {
	Slots         float64 `reaper:"slots,required"`
	RecoveryRate  float64 `reaper:"recovery_rate"`
	RecoveryBurst float64 `reaper:"recovery_burst"`
}

// DefaultPoolBlock is a pool block's defaults under a runner block whose
// recovery budget is def.
func DefaultPoolBlock(def lifecycle.RecoveryLimit) PoolBlock {
	return PoolBlock{RecoveryRate: def.Rate, RecoveryBurst: float64(def.Burst)}
}

// Pool holds the block of pool name to its rules: its slots, a whole
// number from 1 to PoolSlotsMax, and its recovery budget, and each value
// refused. A pool whose slots are refused is not read further (ok false).
func (b PoolBlock) Pool(name string) (slots int, limit lifecycle.RecoveryLimit, ok bool, problems []settingrule.Problem) {
	if n := b.Slots; n < 1 || n > PoolSlotsMax || n != float64(int(n)) {
		return 0, limit, false, []settingrule.Problem{settingrule.At("slots",
			fmt.Sprintf("slots of pool %q must be a whole number from 1 to %d.", name, PoolSlotsMax))}
	}
	limit, problems = recoveryLimit(b.RecoveryRate, b.RecoveryBurst, name)
	return int(b.Slots), limit, true, problems
}

// recoveryLimit checks a recovery_rate (0: unbounded) and recovery_burst
// (0: a second of the rate) of the runner block (pool "") or of a pool
// block.
func recoveryLimit(rate, burst float64, pool string) (lifecycle.RecoveryLimit, []settingrule.Problem) {
	var problems []settingrule.Problem
	of := ""
	if pool != "" {
		of = fmt.Sprintf(" of pool %q", pool)
	}
	if rate < 0 || math.IsInf(rate, 0) || math.IsNaN(rate) {
		problems = append(problems, settingrule.At("recovery_rate",
			"recovery_rate"+of+" is recovery dispatches a second: 0 (unbounded) or more."))
	}
	if burst < 0 || burst > PoolSlotsMax || burst != float64(int(burst)) {
		problems = append(problems, settingrule.At("recovery_burst",
			"recovery_burst"+of+fmt.Sprintf(" must be a whole number from 0 (one second of the rate) to %d.", PoolSlotsMax)))
	}
	return lifecycle.RecoveryLimit{Rate: rate, Burst: int(burst)}, problems
}

// Package cyclemeter is how a runner (the Lite runner, the kube runner)
// has each of its cycles metered: what the cycle measured, handed to a
// Meter the host gives it (host/metrics is one), as the attempt API meters
// its calls through its own Meter.
package cyclemeter

import (
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
)

// Cycle is what one runner cycle measured.
type Cycle struct {
	// Took is how long the cycle took (the runner's clock).
	Took time.Duration
	// RunsStarted counts the queued runs the cycle started under the run
	// start cap; RunsWaiting those still waiting on it.
	RunsStarted, RunsWaiting int
	// DispatchLatencies are the times from queueing to the running report
	// of the attempts the cycle found running; FinalizeLatencies the times
	// from each finished run's last task end to its finalization.
	DispatchLatencies, FinalizeLatencies []time.Duration
	// Slots are the runner's configured pools' slots, by pool name (the
	// runner's pool blocks); nil: none.
	Slots map[string]int
	// Pools is every pool's use at the end of the cycle; nil: not read.
	Pools []lifecycle.PoolUse
	// Recovery counts, by pool, the recovery dispatches the recovery
	// budget admitted and deferred in the cycle.
	Recovery map[string]*lifecycle.RecoveryCount
}

// Meter is told of every cycle a runner's Run runs, on Run's goroutine:
// it must not block for long.
type Meter interface {
	RunnerCycle(Cycle)
}

// None meters nothing: a runner's Meter when its host gives none.
type None struct{}

// RunnerCycle does nothing.
func (None) RunnerCycle(Cycle) {}

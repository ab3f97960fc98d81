package sdktest

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/dexaflow/reaper/sdk"
)

type stopScript struct {
	res sdk.StopResult
	err error
}

type teardownScript struct {
	outcomes []sdk.TeardownOutcome
	err      error
}

// Executions is a scripted sdk.Executions. Each attempt answers liveness as
// scripted; an attempt with no script answers the default state (dead, as a
// Lite attempt with no record does, unless SetDefault says otherwise). A
// stop succeeds unless scripted otherwise, and a successful stop leaves the
// attempt dead. A teardown reports one deleted object unless scripted.
// Every call is recorded. It is safe for concurrent use.
type Executions struct {
	mu         sync.Mutex
	def        sdk.Liveness
	live       map[sdk.Attempt]sdk.AttemptLiveness
	liveRead   map[sdk.Attempt]sdk.AttemptLiveness // answers to authoritative reads only
	liveErr    error
	stops      map[sdk.Attempt]stopScript
	teardowns  map[string]teardownScript // by attempt string or run id
	warm       []sdk.WarmWorker
	warmErr    error
	livenessRq []sdk.LivenessRequest
	stopRq     []sdk.StopRequest
	teardownRq []sdk.TeardownRequest
	feed       *Feed // nil: Changes errors, as a substrate without a feed
}

var _ sdk.Executions = (*Executions)(nil)

// NewExecutions returns a substrate where every attempt reads dead.
func NewExecutions() *Executions {
	return &Executions{
		def:       sdk.Dead,
		live:      map[sdk.Attempt]sdk.AttemptLiveness{},
		liveRead:  map[sdk.Attempt]sdk.AttemptLiveness{},
		stops:     map[sdk.Attempt]stopScript{},
		teardowns: map[string]teardownScript{},
	}
}

// SetDefault sets the state of attempts with no script.
func (e *Executions) SetDefault(state sdk.Liveness) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.def = state
}

// Set scripts an attempt's liveness answer verbatim.
func (e *Executions) Set(a sdk.Attempt, l sdk.AttemptLiveness) {
	e.mu.Lock()
	defer e.mu.Unlock()
	l.Attempt = a
	e.live[a] = l
}

// SetLiveRead scripts the answer an authoritative read (LivenessRequest.Live)
// gives for a, where it differs from the cached one Set scripts: a cache
// that still shows a pod the API server no longer has, say.
func (e *Executions) SetLiveRead(a sdk.Attempt, l sdk.AttemptLiveness) {
	e.mu.Lock()
	defer e.mu.Unlock()
	l.Attempt = a
	e.liveRead[a] = l
}

// Alive: the agent (or pod) and its task group live.
func (e *Executions) Alive(a sdk.Attempt) {
	e.Set(a, sdk.AttemptLiveness{State: sdk.Alive, Agent: sdk.Alive, Group: sdk.Alive, Detail: "agent alive"})
}

// Dead: nothing of the attempt lives.
func (e *Executions) Dead(a sdk.Attempt) {
	e.Set(a, sdk.AttemptLiveness{State: sdk.Dead, Agent: sdk.Dead, Group: sdk.Dead, Detail: "agent and group gone"})
}

// Unknown: liveness could not be determined (a probe or read error).
func (e *Executions) Unknown(a sdk.Attempt, detail string) {
	e.Set(a, sdk.AttemptLiveness{State: sdk.Unknown, Agent: sdk.Unknown, Group: sdk.Unknown, Detail: detail})
}

// Orphaned: the agent is confirmed dead while its recorded, verified task
// group lives on.
func (e *Executions) Orphaned(a sdk.Attempt) {
	e.Set(a, sdk.AttemptLiveness{State: sdk.Alive, Agent: sdk.Dead, Group: sdk.Alive, Orphan: true,
		Detail: "agent dead, task group alive"})
}

// Pending: only a Pending pod of the attempt exists (kube).
func (e *Executions) Pending(a sdk.Attempt) {
	e.Set(a, sdk.AttemptLiveness{State: sdk.Alive, Agent: sdk.Alive, Pending: true, Detail: "pod Pending"})
}

// FailLiveness makes every later Liveness call fail with err (nil clears).
func (e *Executions) FailLiveness(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.liveErr = err
}

// ScriptStop scripts the outcome of stopping a's task group.
func (e *Executions) ScriptStop(a sdk.Attempt, res sdk.StopResult, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stops[a] = stopScript{res, err}
}

// ScriptTeardown scripts the outcome of tearing down a.
func (e *Executions) ScriptTeardown(a sdk.Attempt, outcomes []sdk.TeardownOutcome, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.teardowns[a.String()] = teardownScript{outcomes, err}
}

// ScriptRunTeardown scripts the outcome of tearing down a whole run.
func (e *Executions) ScriptRunTeardown(runID string, outcomes []sdk.TeardownOutcome, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.teardowns["run:"+runID] = teardownScript{outcomes, err}
}

// ScriptWarmWorkers scripts the warm pool listing.
func (e *Executions) ScriptWarmWorkers(ws []sdk.WarmWorker, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.warm, e.warmErr = ws, err
}

// LivenessCalls returns the liveness requests received.
func (e *Executions) LivenessCalls() []sdk.LivenessRequest {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.livenessRq)
}

// Stops returns the stop requests received.
func (e *Executions) Stops() []sdk.StopRequest {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.stopRq)
}

// Teardowns returns the teardown requests received.
func (e *Executions) Teardowns() []sdk.TeardownRequest {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.teardownRq)
}

// Actions counts the calls that act on executions (stops and teardowns).
func (e *Executions) Actions() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.stopRq) + len(e.teardownRq)
}

// Liveness answers each attempt as scripted.
func (e *Executions) Liveness(ctx context.Context, req sdk.LivenessRequest) ([]sdk.AttemptLiveness, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("liveness: %w", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	req.Attempts = slices.Clone(req.Attempts)
	e.livenessRq = append(e.livenessRq, req)
	if e.liveErr != nil {
		return nil, fmt.Errorf("liveness: %w", e.liveErr)
	}
	out := make([]sdk.AttemptLiveness, 0, len(req.Attempts))
	for _, a := range req.Attempts {
		l, ok := e.live[a]
		if lr, live := e.liveRead[a]; live && req.Live {
			l, ok = lr, true
		}
		if !ok {
			l = sdk.AttemptLiveness{Attempt: a, State: e.def, Agent: e.def, Group: e.def, Detail: "unscripted"}
		}
		out = append(out, l)
	}
	return out, nil
}

// Teardown reports the scripted outcome (by default one deleted object).
func (e *Executions) Teardown(ctx context.Context, req sdk.TeardownRequest) ([]sdk.TeardownOutcome, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("teardown: %w", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.teardownRq = append(e.teardownRq, req)
	key, object := "run:"+req.RunID, "run/"+req.RunID
	if req.Attempt != nil {
		key, object = req.Attempt.String(), "pod/"+req.Attempt.String()
	}
	if s, ok := e.teardowns[key]; ok {
		return slices.Clone(s.outcomes), s.err
	}
	return []sdk.TeardownOutcome{{Object: object, Action: sdk.TeardownDeleted}}, nil
}

// StopOrphan reports the scripted outcome (by default stopped); a stop that
// reports stopped leaves the attempt reading dead.
func (e *Executions) StopOrphan(ctx context.Context, req sdk.StopRequest) (sdk.StopResult, error) {
	if err := ctx.Err(); err != nil {
		return sdk.StopResult{}, fmt.Errorf("stop orphan: %w", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stopRq = append(e.stopRq, req)
	s, ok := e.stops[req.Attempt]
	if !ok {
		s = stopScript{res: sdk.StopResult{Stopped: true, Detail: "group gone after SIGTERM"}}
	}
	if s.err == nil && s.res.Stopped {
		delete(e.liveRead, req.Attempt)
		e.live[req.Attempt] = sdk.AttemptLiveness{Attempt: req.Attempt, State: sdk.Dead, Agent: sdk.Dead, Group: sdk.Dead, Detail: "stopped"}
	}
	return s.res, s.err
}

// WarmWorkers returns the scripted warm pool.
func (e *Executions) WarmWorkers(ctx context.Context) ([]sdk.WarmWorker, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("warm workers: %w", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.warm), e.warmErr
}

// Package steps holds the steps every runner's cycle shares, whatever its
// executor: releasing the task instances that wait for a decision (the
// retry, reschedule and infra re-place rails, acting on confirmed infra
// marks and on the confirmation valve), starting queued runs under the run
// start cap, scheduling new task instances, settling a failed dispatch
// (offered again on the backoff rail, or dispatch_failed), and finishing
// settled runs. The Lite runner and the kube runner differ only in how
// they start an execution; everything here goes through the board's rails
// (package board/lifecycle).
package steps

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/cyclemeter"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// Tally is what the shared steps of one cycle did. A runner's result
// embeds it.
type Tally struct {
	Scheduled    int // none -> scheduled
	Retried      int // retry rail
	Rescheduled  int // reschedule rail
	Replaced     int // infra re-place rail
	OfferedAgain int // dispatch-failure backoff rail
	// Failed counts attempts the runner failed for good: infra budget
	// spent, dispatch failed, up_for_retry without retries.
	Failed    int
	Finalized int // runs finished
	// UpstreamSettled counts the task instances settled upstream_failed or
	// skipped by their upstreams.
	UpstreamSettled int
	// Waiting counts unconfirmed infra marks still inside their valve.
	Waiting int
	// RunsStarted lists the queued runs started under the run start cap;
	// RunsWaiting counts the queued runs still waiting on it.
	RunsStarted []string
	RunsWaiting int
	// FinalizeLatencies are the times from each finished run's last task
	// end to its finalization.
	FinalizeLatencies []time.Duration
	// DispatchLatencies are the times from queueing to the running report
	// of the attempts this cycle found running (see Dispatches).
	DispatchLatencies []time.Duration
	// Finished lists the runs finished, by run id.
	Finished []lifecycle.FinishedRun
	// Decisions are the judgments made, for the host to meter and audit.
	Decisions []sdk.Decision
	// Pools is every pool's use at the end of the cycle (ReadPools).
	Pools []lifecycle.PoolUse
	// Recovery counts, by pool, the recovery dispatches the recovery budget
	// admitted and those it deferred to a later cycle.
	Recovery map[string]*lifecycle.RecoveryCount
}

// Cycle is what a cycle that took took measured, as a runner's Meter is
// told (slots: the runner's configured pools).
func (t *Tally) Cycle(took time.Duration, slots map[string]int) cyclemeter.Cycle {
	return cyclemeter.Cycle{Took: took, RunsStarted: len(t.RunsStarted), RunsWaiting: t.RunsWaiting,
		DispatchLatencies: t.DispatchLatencies, FinalizeLatencies: t.FinalizeLatencies,
		Slots: slots, Pools: t.Pools, Recovery: t.Recovery}
}

func (t *Tally) recovery(pool string) *lifecycle.RecoveryCount {
	if t.Recovery == nil {
		t.Recovery = map[string]*lifecycle.RecoveryCount{}
	}
	c, ok := t.Recovery[pool]
	if !ok {
		c = &lifecycle.RecoveryCount{}
		t.Recovery[pool] = c
	}
	return c
}

// Driver runs the shared steps for one executor.
type Driver struct {
	W        *lifecycle.Writer
	Executor string // sdk.ExecutorLite, sdk.ExecutorKube
	Name     string // the runner's name in its decisions (sdk.Decision.Reaper)
	// Valve is the infra confirmation valve: an unconfirmed mark is acted
	// on once it has passed since the mark.
	Valve time.Duration
	// MaxActiveRuns is the run start cap; 0: none.
	MaxActiveRuns int
	// DispatchUnavailableWindow is how long a passing dispatch failure is
	// offered again, from the task's first one, before it fails.
	DispatchUnavailableWindow time.Duration
	Log                       hclog.Logger
	// Pools are the configured pools' slots, by name. A task instance of
	// a pool named here starts only into its open slots; one of a pool
	// named nowhere waits (it is counted, never started), but for
	// DefaultPool, which is unbounded unless named. With no pool named,
	// every pool is unbounded.
	Pools map[string]int
	// Recovery is the recovery budget every recovery dispatch spends from
	// (IsRecovery); nil: none, recovery is dispatched as fast as slots
	// allow. It is the runner's, carried over from cycle to cycle.
	Recovery *Recovery
	// PoolReads spaces the reads of the pools' use for the gauges
	// (ReadPools); nil: every cycle. The runner's, like Recovery.
	PoolReads *PoolReads
	// Heartbeat is the agents' heartbeat period: the pools' silent slots
	// are those of attempts silent for lifecycle.SilentHeartbeats of them.
	Heartbeat time.Duration
	// ValveHold, when set, is asked before an unconfirmed mark is acted on
	// past the valve (see ValveHold).
	ValveHold func(ctx context.Context, ti board.TaskInstance, now time.Time) ValveHold
}

// ValveHold is an executor's answer before the valve acts on an
// unconfirmed mark. The valve is there for a reconciler that cannot
// confirm anything; an executor that can read, live, that something of the
// attempt may still run where no teardown reaches it (its pod on a node
// that is not Ready: a partition, a hung machine), or that its teardown is
// still owed and its pod has not ended, holds the mark instead, because
// acting on it would start the task again beside an execution that carries
// on. What the executor cannot read is the executor's to judge: on a node
// it does not hold (the valve opens, as it would without it); with a
// teardown owed it does (the board already says something was left
// running).
type ValveHold struct {
	Hold bool
	// Note: record the decision this time (the executor throttles its
	// own notes: a held mark is asked every cycle).
	Note     bool
	Detail   string
	Evidence map[string]string
}

// Decide records one decision and logs it at level.
func (d Driver) Decide(t *Tally, level hclog.Level, dec sdk.Decision) {
	dec.Reaper = d.Name
	t.Decisions = append(t.Decisions, dec)
	args := []any{"decision", dec.Label, "applied", dec.Applied}
	if dec.Attempt.TaskID != "" {
		args = append(args, "attempt", dec.Attempt.String())
	}
	for k, v := range dec.Evidence {
		args = append(args, k, v)
	}
	d.Log.Log(level, dec.Detail, args...)
}

// CycleFailed logs a cycle that ended on err: at WARN when its term was
// deposed mid-cycle (lifecycle.ErrDeposed: the new leader's runner carries
// on from the board), at ERROR otherwise.
func (d Driver) CycleFailed(err error) {
	if errors.Is(err, lifecycle.ErrDeposed) {
		d.Log.Warn(d.Executor+" runner cycle stopped: its leadership term was deposed; the new leader's runner carries on",
			"error", err)
		return
	}
	d.Log.Error(d.Executor+" runner cycle failed; the next cycle tries again", "error", err)
}

// Release walks the task instances waiting for a decision.
func (d Driver) Release(ctx context.Context, now time.Time, t *Tally) error {
	var after *lifecycle.Key
	for {
		page, err := d.W.ListReleasable(ctx, d.Executor, after, ladder.PageSize)
		if err != nil {
			return err
		}
		for _, ti := range page {
			if err := d.releaseOne(ctx, ti, now, t); err != nil {
				return err
			}
		}
		if len(page) < ladder.PageSize {
			return nil
		}
		last := page[len(page)-1]
		after = &lifecycle.Key{RunID: last.RunID, TaskID: last.TaskID}
	}
}

func (d Driver) releaseOne(ctx context.Context, ti board.TaskInstance, now time.Time, t *Tally) error {
	v := DecideRelease(ti, now, d.Valve)
	if v.ValveOpen && d.ValveHold != nil && d.valveHeld(ctx, ti, now, t) {
		return nil
	}
	var (
		r   *released
		err error
	)
	switch v.Move {
	case MoveNone:
		if v.Wait > 0 {
			t.Waiting++
		}
		return nil
	case MoveRetry:
		r, err = d.retry(ctx, ti, now, t)
	case MoveReschedule:
		r, err = d.reschedule(ctx, ti, now, t)
	case MoveRetriesSpent:
		return d.failRetriesSpent(ctx, ti, now, t)
	case MoveReplace:
		r, err = d.replace(ctx, ti, now, t)
	case MoveBudgetSpent:
		r, err = d.failBudgetSpent(ctx, ti, now, t)
	default:
		r = &released{level: hclog.Info, ev: map[string]string{}}
	}
	if err != nil || r == nil {
		return err
	}

	a := ti.Attempt
	if v.ValveOpen {
		d.Decide(t, hclog.Warn, sdk.Decision{
			Label: sdk.LabelInfraConfirmValveOpen, Attempt: a, Applied: r.applied,
			Detail: "infra mark still unconfirmed past the confirmation valve: acted on anyway",
			Evidence: map[string]string{
				"marked_at": ti.InfraMarkedAt.UTC().Format(time.RFC3339),
				"valve":     ladder.Format(d.Valve),
			},
		})
	}
	d.Decide(t, r.level, sdk.Decision{Label: r.label, Attempt: a, Applied: r.applied, Detail: r.detail, Evidence: r.ev})
	return nil
}

// released is what a release move did, for its decision.
type released struct {
	applied bool
	label   string
	detail  string
	level   hclog.Level
	ev      map[string]string
}

// valveHeld asks ValveHold whether an infra mark past the confirmation
// valve is held a while longer, noting the hold when it says so.
func (d Driver) valveHeld(ctx context.Context, ti board.TaskInstance, now time.Time, t *Tally) bool {
	h := d.ValveHold(ctx, ti, now)
	if !h.Hold {
		return false
	}
	t.Waiting++
	if h.Note {
		ev := map[string]string{"marked_at": ti.InfraMarkedAt.UTC().Format(time.RFC3339), "valve": ladder.Format(d.Valve)}
		for k, val := range h.Evidence {
			ev[k] = val
		}
		d.Decide(t, hclog.Warn, sdk.Decision{Label: sdk.LabelInfraConfirmValveHeld, Attempt: ti.Attempt,
			Detail: "infra mark past the confirmation valve held: " + h.Detail, Evidence: ev})
	}
	return true
}

// retry starts the next try of a task failure with retries left.
func (d Driver) retry(ctx context.Context, ti board.TaskInstance, now time.Time, t *Tally) (*released, error) {
	rel, err := d.W.Retry(ctx, ti.Attempt, now)
	if err != nil {
		return nil, err
	}
	r := &released{applied: rel.Applied, label: sdk.LabelTaskRetry, level: hclog.Info, ev: map[string]string{
		"retries_left": strconv.Itoa(int(ti.Retries)),
		"failure":      ti.FailureReason,
	}}
	r.detail = "task failure with retries left: next try"
	if rel.Applied {
		t.Retried++
		r.ev["next"] = rel.Attempt.String()
	} else {
		r.detail += " not started: " + rel.Reason
	}
	return r, nil
}

// reschedule parks a sensor for its next poke. The next poke is a
// sensor's, within its bounds; past them (or for a task that is not a
// sensor at all) the parked attempt is failed with the reason instead,
// which is the only outcome with a decision (nil otherwise).
func (d Driver) reschedule(ctx context.Context, ti board.TaskInstance, now time.Time, t *Tally) (*released, error) {
	a := ti.Attempt
	if refused := ti.Sensor.RescheduleRefusal(now, d.W.CredentialCeiling()); refused != "" {
		ok, err := d.W.Fail(ctx, a, []string{sdk.StateUpForReschedule}, lifecycle.Failure{
			Kind: sdk.MarkTask, Reason: refused, Message: sdk.RescheduleFailure(refused),
			Terminal: sdk.RescheduleSpendsRetries(refused),
		}, now)
		if err != nil {
			return nil, err
		}
		r := &released{applied: ok, label: refused, level: hclog.Warn, ev: map[string]string{}}
		r.detail = "parked for another poke: " + sdk.RescheduleFailure(refused)
		r.ev["asked"] = sdk.StateUpForReschedule
		if !ti.Sensor.FirstPokeAt.IsZero() {
			r.ev["first_poke_at"] = ti.Sensor.FirstPokeAt.UTC().Format(time.RFC3339)
		}
		if !ti.Sensor.TryDispatchedAt.IsZero() {
			r.ev["try_dispatched_at"] = ti.Sensor.TryDispatchedAt.UTC().Format(time.RFC3339)
		}
		if ok {
			t.Failed++
		}
		return r, nil
	}
	rel, err := d.W.Reschedule(ctx, a, now)
	if err != nil {
		return nil, err
	}
	if rel.Applied {
		t.Rescheduled++
	}
	return nil, nil
}

// failRetriesSpent fails for good an attempt parked for a retry with no
// retries left.
func (d Driver) failRetriesSpent(ctx context.Context, ti board.TaskInstance, now time.Time, t *Tally) error {
	ok, err := d.W.Fail(ctx, ti.Attempt, []string{sdk.StateUpForRetry}, lifecycle.Failure{
		Kind: sdk.MarkTask, Reason: ti.FailureReason, Terminal: true,
		Message: "parked for a retry with no retries left: " + ti.ErrorMessage,
	}, now)
	if err != nil {
		return err
	}
	if ok {
		t.Failed++
		d.Log.Warn("an attempt parked for a retry had no retries left: failed for good", "attempt", ti.Attempt.String())
	}
	return nil
}

// replace re-places an infra failure on the infra budget.
func (d Driver) replace(ctx context.Context, ti board.TaskInstance, now time.Time, t *Tally) (*released, error) {
	rel, err := d.W.Replace(ctx, ti.Attempt, now)
	if err != nil {
		return nil, err
	}
	r := &released{applied: rel.Applied, label: sdk.LabelInfraReplace, level: hclog.Info, ev: map[string]string{
		"mark":         ti.FailureReason,
		"infra_used":   strconv.Itoa(int(ti.InfraUsed)),
		"infra_budget": strconv.Itoa(int(ti.InfraBudget)),
	}}
	r.detail = "infra failure re-placed on the infra budget"
	if rel.Applied {
		t.Replaced++
		r.ev["next"] = rel.Attempt.String()
	} else {
		r.detail += " not done: " + rel.Reason
	}
	return r, nil
}

// failBudgetSpent fails for good an infra failure with its infra budget
// spent.
func (d Driver) failBudgetSpent(ctx context.Context, ti board.TaskInstance, now time.Time, t *Tally) (*released, error) {
	ok, err := d.W.Fail(ctx, ti.Attempt, []string{sdk.StateFailed}, lifecycle.Failure{
		Kind: sdk.MarkInfra, Reason: sdk.LabelInfraBudgetSpent, Terminal: true, Confirm: true,
		Message: fmt.Sprintf("%s: %s with all %d infra re-places spent: %s",
			sdk.LabelInfraBudgetSpent, ti.FailureReason, ti.InfraBudget, ti.ErrorMessage),
	}, now)
	if err != nil {
		return nil, err
	}
	if ok {
		t.Failed++
	}
	return &released{applied: ok, label: sdk.LabelInfraBudgetSpent, level: hclog.Warn,
		detail: "infra failure with its budget spent: failed for good", ev: map[string]string{
			"mark":         ti.FailureReason,
			"infra_budget": strconv.Itoa(int(ti.InfraBudget)),
		}}, nil
}

// Schedule settles the task instances in state none of a running run that
// their upstreams will never let run (SettleBlocked: upstream_failed or
// skipped, each a decision), then moves every one whose upstreams all
// succeeded to scheduled.
func (d Driver) Schedule(ctx context.Context, now time.Time, t *Tally) error {
	if err := d.settleBlocked(ctx, now, t); err != nil {
		return err
	}
	for {
		as, err := d.W.EnqueueNew(ctx, d.Executor, ladder.PageSize, now)
		if err != nil {
			return err
		}
		t.Scheduled += len(as)
		if len(as) < ladder.PageSize {
			return nil
		}
	}
}

// Dispatch walks the scheduled task instances of the driver's executor,
// oldest first, and hands each to one (which queues it and starts its
// execution, reporting whether one was started), within maxParallel queued
// and running attempts (0: no bound).
func (d Driver) Dispatch(ctx context.Context, now time.Time, t *Tally, maxParallel int, one func(context.Context, board.TaskInstance) (bool, error)) error {
	slots := -1 // no bound
	if maxParallel > 0 {
		active, err := d.W.CountActive(ctx, d.Executor)
		if err != nil {
			return err
		}
		slots = max(maxParallel-active, 0)
	}
	return d.DispatchUpTo(ctx, now, t, slots, one)
}

// DispatchUpTo is Dispatch for at most slots started executions (a
// negative slots: no bound), whatever is active: the warm pool counts its
// free worker slots itself. Either way a task instance starts only into
// open slots of its pool (Pools) and under its run's max_active_tasks;
// the others stay scheduled for a later cycle.
func (d Driver) DispatchUpTo(ctx context.Context, now time.Time, t *Tally, slots int, one func(context.Context, board.TaskInstance) (bool, error)) error {
	g, err := d.newGate(ctx, now)
	if err != nil {
		return err
	}
	var after *lifecycle.Key
	for slots != 0 {
		limit := ladder.PageSize
		if slots > 0 {
			limit = min(limit, slots)
		}
		closedPools, closedRuns := g.closed()
		page, err := d.W.ListScheduledOpen(ctx, d.Executor, after, limit, closedPools, closedRuns,
			d.recoverySpent(g, now))
		if err != nil {
			return err
		}
		for _, ti := range page {
			if slots == 0 {
				return nil
			}
			if !d.fits(g, ti) {
				continue
			}
			if IsRecovery(ti) && d.Recovery != nil {
				pool := recoveryPool(ti)
				if !d.Recovery.Admit(pool, now) {
					t.recovery(pool).Deferred++
					continue
				}
				t.recovery(pool).Admitted++
			}
			started, err := one(ctx, ti)
			if err != nil {
				return err
			}
			if started {
				d.take(g, ti)
				if slots > 0 {
					slots--
				}
			}
		}
		if len(page) < limit {
			return nil
		}
		last := page[len(page)-1]
		after = &lifecycle.Key{RunID: last.RunID, TaskID: last.TaskID}
	}
	return nil
}

// StartRuns starts queued runs under the run start cap (MaxActiveRuns),
// oldest first, and counts those still waiting.
func (d Driver) StartRuns(ctx context.Context, now time.Time, t *Tally) error {
	for {
		started, waiting, err := d.W.StartQueuedRuns(ctx, d.MaxActiveRuns, ladder.PageSize, now)
		if err != nil {
			return err
		}
		t.RunsStarted = append(t.RunsStarted, started...)
		t.RunsWaiting = waiting
		for _, id := range started {
			d.Log.Info("run started", "run", id, "waiting", waiting)
		}
		if len(started) < ladder.PageSize {
			return nil
		}
	}
}

// settleBlocked settles, page by page, the task instances their upstreams
// will never let run.
func (d Driver) settleBlocked(ctx context.Context, now time.Time, t *Tally) error {
	for {
		bs, err := d.W.SettleBlocked(ctx, d.Executor, ladder.PageSize, now)
		if err != nil {
			return err
		}
		for _, b := range bs {
			t.UpstreamSettled++
			if b.State == sdk.StateUpstreamFailed {
				d.Decide(t, hclog.Info, sdk.Decision{Label: sdk.LabelUpstreamFailed, Attempt: b.Attempt, Applied: true,
					Detail:   "an upstream failed for good: the task will not run",
					Evidence: map[string]string{"upstreams_failed": strings.Join(b.Failed, ",")}})
				continue
			}
			d.Decide(t, hclog.Info, sdk.Decision{Label: sdk.LabelUpstreamSkipped, Attempt: b.Attempt, Applied: true,
				Detail:   "an upstream was skipped: the task is skipped",
				Evidence: map[string]string{"upstreams_skipped": strings.Join(b.Skipped, ",")}})
		}
		if len(bs) < ladder.PageSize {
			return nil
		}
	}
}

// Finalize finishes the running runs whose task instances are all settled,
// each a decision (run_finalized_success or run_finalized_failed, naming
// the unsuccessful tasks).
func (d Driver) Finalize(ctx context.Context, now time.Time, t *Tally) error {
	for {
		runs, err := d.W.FinishSettledRuns(ctx, ladder.PageSize, now)
		if err != nil {
			return err
		}
		for _, f := range runs {
			label, level := sdk.LabelRunFinalizedSuccess, hclog.Info
			ev := map[string]string{"state": f.State}
			if f.State != sdk.RunSuccess {
				label, level = sdk.LabelRunFinalizedFailed, hclog.Warn
				ev["unsuccessful"] = strings.Join(f.Unsuccessful, ",")
			}
			if !f.SettledAt.IsZero() {
				ev["settled_at"] = f.SettledAt.UTC().Format(time.RFC3339Nano)
			}
			d.Decide(t, level, sdk.Decision{Label: label, Attempt: sdk.Attempt{RunID: f.RunID}, Applied: true,
				Detail: "run finished " + f.State, Evidence: ev})
		}
		t.Finalized += len(runs)
		t.Finished = append(t.Finished, runs...)
		for _, f := range runs {
			if !f.SettledAt.IsZero() {
				t.FinalizeLatencies = append(t.FinalizeLatencies, now.Sub(f.SettledAt))
			}
		}
		if len(runs) < ladder.PageSize {
			return nil
		}
	}
}

// DispatchFailure is a queued attempt whose dispatch failed, as a runner
// judged it.
type DispatchFailure struct {
	TI   board.TaskInstance
	Err  error
	Move DispatchMove
	// What names the failed step in decisions and logs ("the agent could
	// not be started", "the pod create failed").
	What string
	// AgainDetail is the decision's detail when the task is offered again.
	AgainDetail string
}

// DispatchFailed settles a queued attempt whose dispatch failed: offered
// again under a new epoch (dispatch_unavailable, WARN), or failed for good
// as dispatch_failed (ERROR; dispatch_unavailable_exhausted when the window
// ran out). Neither spends a retry.
func (d Driver) DispatchFailed(ctx context.Context, f DispatchFailure, now time.Time, t *Tally) error {
	a := f.TI.Attempt
	ev := map[string]string{"error": f.Err.Error()}
	if since := f.TI.DispatchUnavailableSince; !since.IsZero() {
		ev["unavailable_since"] = since.UTC().Format(time.RFC3339)
	}
	if f.Move == DispatchOfferAgain {
		rel, err := d.W.DispatchBackoff(ctx, a, now)
		if err != nil {
			return err
		}
		if rel.Applied {
			t.OfferedAgain++
			ev["next"] = rel.Attempt.String()
		}
		d.Decide(t, hclog.Warn, sdk.Decision{
			Label: sdk.LabelDispatchUnavailable, Attempt: a, Applied: rel.Applied, Evidence: ev, Detail: f.AgainDetail,
		})
		return nil
	}
	label, detail := sdk.LabelDispatchFailed, f.What+": dispatch failed for good"
	if f.Move == DispatchExhausted {
		label = sdk.LabelDispatchUnavailableSpent
		detail = f.What + " for " + ladder.Format(d.DispatchUnavailableWindow) + ": dispatch failed for good"
	}
	ok, err := d.W.Fail(ctx, a, []string{sdk.StateQueued}, lifecycle.Failure{
		Kind: sdk.MarkInfra, Reason: sdk.LabelDispatchFailed, Terminal: true, Confirm: true,
		Message: sdk.LabelDispatchFailed + ": " + f.Err.Error(),
	}, now)
	if err != nil {
		return err
	}
	if ok {
		t.Failed++
	}
	d.Decide(t, hclog.Error, sdk.Decision{Label: label, Attempt: a, Applied: ok, Detail: detail, Evidence: ev})
	return nil
}

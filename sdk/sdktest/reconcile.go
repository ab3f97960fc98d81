package sdktest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// The reconciler's writes, with the guards of the Postgres board (the
// requests' own Refusal methods) and the same column effects.

// ListProvisional lists provisional infra marks (failed on the infra rail,
// not yet confirmed) of q.Executors, oldest mark first by (infra_marked_at,
// run, task), after the cursor. Next is nil on a short page.
func (b *Board) ListProvisional(ctx context.Context, q sdk.ProvisionalQuery) (sdk.CandidatePage, error) {
	if err := ctx.Err(); err != nil {
		return sdk.CandidatePage{}, fmt.Errorf("list provisional marks: %w", err)
	}
	limit := ladder.ListLimit(q.Limit)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lists++
	if err := b.errs[OpListProvisional]; err != nil {
		return sdk.CandidatePage{}, fmt.Errorf("list provisional marks: %w", err)
	}
	oldest := newOldest(limit)
	for _, t := range b.rows {
		if !t.guardRow("").Provisional() || t.InfraMarkedAt.IsZero() {
			continue
		}
		if len(q.Executors) > 0 && !slices.Contains(q.Executors, t.Executor) {
			continue
		}
		if q.After != nil && compareKey(t.InfraMarkedAt, t.RunID, t.TaskID, q.After.At, q.After.RunID, q.After.TaskID) <= 0 {
			continue
		}
		oldest.offer(row{t.InfraMarkedAt, t})
	}
	page := oldest.page()
	for i := range page.Candidates {
		c := &page.Candidates[i]
		if wc, ok := b.claims[c.WarmWorker]; ok && c.WarmWorker != "" && wc.Known {
			c.WarmClaimedAt, c.WarmClaimHolds = wc.At, slices.Contains(wc.Running, c.Attempt)
		}
	}
	return page, nil
}

// WarmClaim is a warm worker's last claim as the attempt API records it
// (the Postgres board's warm_worker_claims row): when it claimed and, when
// Known, which attempts it said it runs.
type WarmClaim struct {
	At      time.Time
	Known   bool
	Running []sdk.Attempt
}

// RecordWarmClaim records worker's claim, as an accepted claim of the
// attempt API does; a claim older than the recorded one changes nothing.
// ListProvisional then carries it on the worker's warm candidates.
func (b *Board) RecordWarmClaim(worker string, c WarmClaim) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if old, ok := b.claims[worker]; ok && c.At.Before(old.At) {
		return
	}
	c.Running = slices.Clone(c.Running)
	b.claims[worker] = c
}

// ConfirmInfra confirms provisional infra marks of exactly their attempts.
func (b *Board) ConfirmInfra(ctx context.Context, cs []sdk.Confirm) ([]sdk.MarkResult, error) {
	return guardedBatch(ctx, b, "confirm infra", OpConfirmInfra, cs,
		func(c sdk.Confirm) (sdk.Attempt, int64, time.Time) { return c.Attempt, c.Term, c.At },
		func(c sdk.Confirm) error { return nil },
		func(c sdk.Confirm, row sdk.TaskRow) string { return c.Refusal(row) },
		func(c sdk.Confirm, t *TaskInstance) string { t.InfraConfirmedAt = c.At; return "" })
}

// OverrideInfra settles attempts as successes over their provisional infra
// marks and appends the override line to each one's log.
func (b *Board) OverrideInfra(ctx context.Context, os []sdk.Override) ([]sdk.MarkResult, error) {
	return guardedBatch(ctx, b, "override infra mark", OpOverrideInfra, os,
		func(o sdk.Override) (sdk.Attempt, int64, time.Time) { return o.Attempt, o.Term, o.At },
		func(o sdk.Override) error { return nil },
		func(o sdk.Override, row sdk.TaskRow) string { return o.Refusal(row) },
		func(o sdk.Override, t *TaskInstance) string {
			b.logs[o.Attempt] = append(b.logs[o.Attempt], sdk.OverrideLogLine(t.MarkReason))
			t.State, t.EndedAt = sdk.StateSuccess, sdk.EndOf(o.EndedAt, o.At)
			t.LastFailureKind, t.MarkReason, t.ErrorMessage = "", "", ""
			t.InfraMarkedAt, t.InfraConfirmedAt = time.Time{}, time.Time{}
			return ""
		})
}

// Settle settles finished attempts from their outcomes, as an agent's own
// report would (an infra outcome confirmed at once). A settlement read from
// a pod that names its task only by the lossy label (LossyPod) settles the
// task instance of its run that records the pod's UID, and only while it
// still does; none records it: NoopNotFound, nothing written.
func (b *Board) Settle(ctx context.Context, ss []sdk.Settlement) ([]sdk.MarkResult, error) {
	// A malformed batch is an error before anything is resolved or written.
	if err := checkBatch(ctx, "settle", ss, settlementFields, validSettlement); err != nil {
		return nil, err
	}
	resolved, unresolved := b.resolveLossy(ss)
	var (
		write []sdk.Settlement
		pos   []int
	)
	out := make([]sdk.MarkResult, len(ss))
	for i, s := range resolved {
		if unresolved[i] {
			out[i] = sdk.MarkResult{Attempt: s.Attempt, NoopReason: sdk.NoopNotFound}
			continue
		}
		write, pos = append(write, s), append(pos, i)
	}
	if len(write) == 0 {
		return out, nil
	}
	res, err := b.settle(ctx, write)
	if err != nil {
		return nil, err
	}
	for j, i := range pos {
		out[i] = res[j]
	}
	return out, nil
}

// resolveLossy returns the settlements with the task id of each LossyPod
// one replaced by the task of its run that records its pod's UID, and the
// positions of those no task instance records (exactly one must).
func (b *Board) resolveLossy(ss []sdk.Settlement) ([]sdk.Settlement, map[int]bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out, unresolved := slices.Clone(ss), map[int]bool{}
	for i, s := range ss {
		if !s.LossyPod {
			continue
		}
		var found []string
		for task, t := range b.tasks[s.RunID] {
			if s.PodUID != "" && t.PodUID == s.PodUID {
				found = append(found, task)
			}
		}
		if len(found) == 1 {
			out[i].TaskID = found[0]
		} else {
			unresolved[i] = true
		}
	}
	return out, unresolved
}

func settlementFields(s sdk.Settlement) (sdk.Attempt, int64, time.Time) {
	return s.Attempt, s.Term, s.At
}

// settle writes settlements whose task ids are resolved.
func (b *Board) settle(ctx context.Context, ss []sdk.Settlement) ([]sdk.MarkResult, error) {
	return guardedBatch(ctx, b, "settle", OpSettle, ss, settlementFields,
		validSettlement,
		func(s sdk.Settlement, row sdk.TaskRow) string { return s.Refusal(row) },
		func(s sdk.Settlement, t *TaskInstance) string {
			t.State, t.LastFailureKind, t.EndedAt = s.Outcome.State(), s.Outcome.FailureKind(), sdk.EndOf(s.EndedAt, s.At)
			t.MarkReason, t.ErrorMessage = "", ""
			t.InfraMarkedAt, t.InfraConfirmedAt = time.Time{}, time.Time{}
			if t.LastFailureKind != "" {
				// Made safe as the Postgres board makes them (sdk.SafeText).
				t.MarkReason, t.ErrorMessage = sdk.SafeText(s.Reason, sdk.MaxReasonBytes), sdk.SafeText(s.Message, sdk.MaxMessageBytes)
			}
			if t.LastFailureKind == sdk.FailureInfra {
				t.InfraMarkedAt, t.InfraConfirmedAt = s.At, s.At
			}
			// A reschedule is a sensor's, and bounded: any other is a task
			// failure with the reason.
			if s.Outcome != sdk.OutcomeReschedule {
				return ""
			}
			refused := t.Sensor.RescheduleRefusal(s.At, b.ceiling)
			if refused != "" {
				t.State, t.LastFailureKind = sdk.StateFailed, sdk.FailureTask
				t.MarkReason, t.ErrorMessage = refused, sdk.RescheduleFailure(refused)
				if sdk.RescheduleSpendsRetries(refused) {
					t.Retries = 0
				}
			}
			return refused
		})
}

// RecordPodSightings records what the pod cache saw of running kube
// attempts' pods, with the guards of the Postgres board
// (sdk.PodSighting.Refusal) and its column effects (PodMissing).
func (b *Board) RecordPodSightings(ctx context.Context, ss []sdk.PodSighting) ([]sdk.MarkResult, error) {
	if len(ss) > sdk.MaxPodSightings {
		return nil, fmt.Errorf("record pod sightings: %d in one call: at most %d", len(ss), sdk.MaxPodSightings)
	}
	return guardedBatch(ctx, b, "record pod sightings", OpRecordSightings, ss,
		func(p sdk.PodSighting) (sdk.Attempt, int64, time.Time) { return p.Attempt, p.Term, p.At },
		sdk.ValidSighting,
		func(p sdk.PodSighting, row sdk.TaskRow) string { return p.Refusal(row) },
		func(p sdk.PodSighting, t *TaskInstance) string {
			t.PodMissingMax, t.PodMissingSince = p.PodMissing(t.RunningAt, t.PodMissingMax, t.PodMissingSince)
			return ""
		})
}

func validSettlement(s sdk.Settlement) error {
	switch {
	case s.Outcome.State() == "":
		return fmt.Errorf("unknown outcome %q", s.Outcome)
	case s.Outcome == sdk.OutcomeInfra && s.Reason == "":
		return errors.New("an infra outcome names no reason")
	case len(s.FromStates) == 0:
		return errors.New("no source states named")
	case s.LossyPod && s.PodUID == "":
		return errors.New("a settlement from a lossy pod names no pod UID")
	}
	for _, st := range s.FromStates {
		if !sdk.IsTaskState(st) {
			return fmt.Errorf("unknown source state %q", st)
		}
	}
	return nil
}

// guardedBatch applies a batch of guarded writes: each request applies
// (apply, under the board's lock) only when its term leads, its row exists
// and refusal finds nothing wrong; one result per request, in order. A
// malformed request fails the whole batch before anything is written.
func guardedBatch[T any](ctx context.Context, b *Board, what string, op Op, reqs []T,
	fields func(T) (sdk.Attempt, int64, time.Time), valid func(T) error,
	refusal func(T, sdk.TaskRow) string, apply func(T, *TaskInstance) string) ([]sdk.MarkResult, error) {
	if err := checkBatch(ctx, what, reqs, fields, valid); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reconcile++
	if err := b.errs[op]; err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	results := make([]sdk.MarkResult, len(reqs))
	for i, r := range reqs {
		a, term, at := fields(r)
		results[i].Attempt = a
		t, ok := b.tasks[a.RunID][a.TaskID]
		switch {
		case b.deposedLocked(term, at):
			results[i].NoopReason = sdk.NoopDeposed
		case !ok:
			results[i].NoopReason = sdk.NoopNotFound
		default:
			results[i].NoopReason = refusal(r, t.guardRow(b.runStateLocked(a.RunID)))
		}
		if results[i].NoopReason == "" {
			results[i].RescheduleRefused = apply(r, t)
			results[i].Applied = true
		}
	}
	return results, nil
}

// checkBatch refuses a malformed batch (a request without an attempt, a
// term or a time, one its own check refuses, a task instance named twice)
// before anything is written.
func checkBatch[T any](ctx context.Context, what string, reqs []T, fields func(T) (sdk.Attempt, int64, time.Time),
	valid func(T) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	for _, r := range reqs {
		a, term, at := fields(r)
		switch {
		case a.RunID == "" || a.TaskID == "":
			return fmt.Errorf("%s: no attempt named", what)
		case term <= 0:
			return fmt.Errorf("%s %s: no leadership term", what, a)
		case at.IsZero():
			return fmt.Errorf("%s %s: no time", what, a)
		}
		if err := valid(r); err != nil {
			return fmt.Errorf("%s %s: %w", what, a, err)
		}
	}
	return onceEach(what, reqs, func(r T) sdk.Attempt { a, _, _ := fields(r); return a })
}

// onceEach refuses a batch that names a task instance twice, as the real
// board does.
func onceEach[T any](what string, reqs []T, attempt func(T) sdk.Attempt) error {
	seen := make(map[[2]string]bool, len(reqs))
	for _, r := range reqs {
		a := attempt(r)
		key := [2]string{a.RunID, a.TaskID}
		if seen[key] {
			return fmt.Errorf("%s %s: task instance named twice in one batch", what, a)
		}
		seen[key] = true
	}
	return nil
}

// runStateLocked is the state of the run ("" when there is none).
func (b *Board) runStateLocked(runID string) string {
	if r, ok := b.runs[runID]; ok {
		return r.State
	}
	return ""
}

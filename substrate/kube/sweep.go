package kube

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// errDeposed ends a sweep whose term is no longer current.
var errDeposed = errors.New("the leadership term is no longer current")

// settleFrom are the states a finished pod's attempt is settled from: an
// attempt whose running report was lost is still queued.
var settleFrom = []string{sdk.StateQueued, sdk.StateRunning}

// Sweep is the reconcile phase. First it records what the presence cache
// missed of running attempts' pods since the last sweep (sightings.go), a
// history stamp written in a dry run too; then four steps over one
// snapshot of the presence cache: settle every finished pod's attempt
// from its durable outcome record (or the cluster's word); confirm or override each
// provisional infra mark of a kube attempt from a live read of its
// attempt's pods; confirm each provisional infra mark of a warm attempt
// from a live read of the warm pool; release the outcome record finalizer
// of the pods whose record has done its work, and apply the finalizer's
// leak bound; collect finished pods that are settled and older than
// CollectAfter. The sweep completes only on a synced cache: until then it
// fails, and the gate holds.
func (s *Substrate) Sweep(ctx context.Context, req sdk.SweepRequest, board sdk.Board) (res sdk.SweepResult, err error) {
	r, err := s.current()
	if err != nil {
		return sdk.SweepResult{}, err
	}
	if !r.presence.synced() {
		return sdk.SweepResult{}, errors.New("kube sweep: the presence cache has not synced yet")
	}
	sw := &sweep{s: s, r: r, req: req, board: board, res: sdk.SweepResult{Overrides: map[string]int64{}},
		marked: map[sdk.Attempt]bool{}, markedKeys: map[string]bool{}, provisional: map[sdk.Attempt]bool{},
		unrecorded: map[*pod]bool{}, foreign: map[*pod]bool{}}
	// The foreign pods seen since the last sweep (here, by the presence
	// check or by a teardown) become decisions, so they are metered and
	// audited.
	defer func() {
		ds := sw.foreignDecisions()
		if err != nil {
			// The host drops the decisions of a failed sweep: keep these
			// for the next one.
			r.foreign.putBack(ds)
			return
		}
		res.Decisions = append(res.Decisions, ds...)
	}()
	if err := sw.sightings(ctx); err != nil {
		return sw.res, err
	}
	// The tombstones are finished pods already deleted: settled like the
	// others, offered once, never collected.
	pods, tombs := r.presence.snapshot(), r.presence.tombs.take()
	settled, err := sw.settle(ctx, append(append(make([]*pod, 0, len(pods)+len(tombs)), pods...), tombs...))
	if err != nil {
		return sw.res, err
	}
	if !req.DryRun {
		r.presence.tombs.forget(tombs, settled)
	}
	if err := sw.marks(ctx); err != nil {
		return sw.res, err
	}
	if err := sw.warmMarks(ctx); err != nil {
		return sw.res, err
	}
	released, err := sw.finalizers(ctx, pods, settled)
	if err != nil {
		return sw.res, err
	}
	if err := sw.collect(ctx, pods, settled, released); err != nil {
		return sw.res, err
	}
	return sw.res, nil
}

// sweep is one sweep's working state.
type sweep struct {
	s     *Substrate
	r     *running
	req   sdk.SweepRequest
	board sdk.Board
	res   sdk.SweepResult
	// marked: attempts with a provisional infra mark seen by this sweep;
	// their pods are never collected while it stands. markedKeys holds
	// their attempts as the lossy labels spell them, for the pods that
	// carry no exact task id.
	marked     map[sdk.Attempt]bool
	markedKeys map[string]bool
	// provisional: those of them whose mark is inside the infra
	// confirmation valve, so a SUCCESS record may still override it.
	provisional map[sdk.Attempt]bool
	// unrecorded: finished pods whose settlement found no such task
	// instance on the board.
	unrecorded map[*pod]bool
	// foreign: finished pods the board refused because the attempt their
	// labels name records another pod's UID: never released, never
	// collected.
	foreign map[*pod]bool
}

// foreignDecisions are the decisions about foreign pods queued since the
// last sweep, this one's included.
func (sw *sweep) foreignDecisions() []sdk.Decision {
	ds := sw.r.foreign.take()
	for i := range ds {
		ds[i].DryRun = sw.req.DryRun
	}
	return ds
}

// heldByMark: the pod may belong to an attempt with a provisional infra
// mark. A pod without the exact task id is held by the mark of any task
// its lossy label could name.
func (sw *sweep) heldByMark(p *pod, a sdk.Attempt) bool {
	if p.labels.hasRaw {
		return sw.marked[a]
	}
	return sw.markedKeys[p.labels.indexKey()]
}

func (sw *sweep) decide(label string, a sdk.Attempt, applied bool, detail string, ev map[string]string) {
	sw.res.Decisions = append(sw.res.Decisions, sdk.Decision{Label: label, Attempt: a, Applied: applied,
		DryRun: sw.req.DryRun, Detail: detail, Evidence: ev})
}

// settle settles the attempt of every finished pod, a page at a time, and
// returns the pods whose attempt is settled (the settlement applied now,
// or the row had already moved on from it). A pod without the exact task
// id (from before the raw task id annotation) names its task only by the
// lossy label, which it may share with another task: its settlement
// carries the pod's UID and the board settles the task that recorded that
// pod as its own, never one found by the label.
func (sw *sweep) settle(ctx context.Context, pods []*pod) (map[*pod]bool, error) {
	settled := map[*pod]bool{}
	b := &settleBatch{inBatch: map[[2]string]bool{}}
	for _, p := range pods {
		a, ok := p.labels.attempt()
		if !ok {
			continue
		}
		v, ok := judgeFinished(p)
		if !ok {
			continue
		}
		key := [2]string{a.RunID, TaskIDLabel(a.TaskID)}
		if b.inBatch[key] {
			if err := sw.flushSettle(ctx, b, settled); err != nil {
				return settled, err
			}
		}
		b.inBatch[key] = true
		b.batch = append(b.batch, sdk.Settlement{Attempt: a, Outcome: v.outcome, FromStates: settleFrom,
			Reason: v.reason, Message: v.message, EndedAt: p.endedAt(sw.req.Now),
			PodUID: string(p.UID), LossyPod: !p.labels.hasRaw, Term: sw.req.Term, At: sw.req.Now})
		b.owner, b.rules = append(b.owner, p), append(b.rules, v.rule)
		if len(b.batch) == ladder.PageSize {
			if err := sw.flushSettle(ctx, b, settled); err != nil {
				return settled, err
			}
		}
	}
	return settled, sw.flushSettle(ctx, b, settled)
}

// settleBatch is one batch of settlements: each with the pod it comes
// from and the rule that judged it. The board takes each task instance at
// most once a batch, and a task that ran again (a retry, a re-place)
// leaves a finished pod per attempt: a second pod of one task instance
// starts the next batch. Pods are told apart by the lossy label, so a pod
// without the exact task id never shares a batch with one it could
// resolve to.
type settleBatch struct {
	batch   []sdk.Settlement
	owner   []*pod
	rules   []string
	inBatch map[[2]string]bool // run id and task id label
}

func (b *settleBatch) reset() {
	b.batch, b.owner, b.rules = b.batch[:0], b.owner[:0], b.rules[:0]
	clear(b.inBatch)
}

// flushSettle settles the batch (in a dry run, says what it would settle)
// and empties it, noting in settled each pod whose attempt is settled.
func (sw *sweep) flushSettle(ctx context.Context, b *settleBatch, settled map[*pod]bool) error {
	if len(b.batch) == 0 {
		return nil
	}
	defer b.reset()
	if sw.req.DryRun {
		for i, st := range b.batch {
			sw.decide(sdk.LabelReconcileSettled, st.Attempt, false, "would settle "+string(st.Outcome)+" from "+b.owner[i].ref(),
				settleEvidence(b.owner[i], b.rules[i], ""))
		}
		return nil
	}
	res, err := sw.board.Settle(ctx, b.batch)
	if err != nil {
		return fmt.Errorf("kube sweep: settling %d finished pods: %w", len(b.batch), err)
	}
	for i, mr := range res {
		if i >= len(b.owner) {
			break
		}
		if mr.NoopReason == sdk.NoopDeposed {
			return errDeposed
		}
		settled[b.owner[i]] = mr.Applied || mr.NoopReason == sdk.NoopMovedOn || mr.NoopReason == sdk.NoopNotFound ||
			mr.NoopReason == sdk.NoopRunFinished
		if mr.NoopReason == sdk.NoopNotFound {
			sw.unrecorded[b.owner[i]] = true
		}
		if mr.NoopReason == sdk.NoopPodNotRecorded {
			sw.foreign[b.owner[i]] = true
			sw.r.foreign.saw(b.owner[i], b.batch[i].Attempt, "", "sweep")
		}
		if mr.Applied {
			sw.settledApplied(b.batch[i], mr, b.owner[i], b.rules[i])
		}
	}
	return nil
}

// settledApplied decides, and records an Event for, a settlement the
// board applied to the attempt it names (for a pod without the exact task
// id, the one that recorded the pod).
func (sw *sweep) settledApplied(st sdk.Settlement, mr sdk.MarkResult, p *pod, rule string) {
	if mr.RescheduleRefused != "" {
		// A RESCHEDULE record the task may not take (the task can write
		// its own termination message): the board failed the attempt with
		// the reason instead.
		ev := settleEvidence(p, rule, string(st.Outcome))
		ev["asked"] = sdk.StateUpForReschedule
		sw.decide(mr.RescheduleRefused, mr.Attempt, true, sdk.RescheduleFailure(mr.RescheduleRefused)+
			" (a RESCHEDULE record on "+p.ref()+")", ev)
		sw.r.events.record(p, true, mr.RescheduleRefused, EventActionSettle,
			"Settled "+attemptNote(mr.Attempt)+" as failed: "+sdk.RescheduleFailure(mr.RescheduleRefused))
		return
	}
	detail := "settled " + string(st.Outcome) + " from " + p.ref()
	if st.LossyPod {
		detail += " (no exact task id on the pod: the attempt recorded its UID)"
	}
	if st.Message != "" {
		detail += ": " + st.Message
	}
	sw.decide(sdk.LabelReconcileSettled, mr.Attempt, true, detail, settleEvidence(p, rule, string(st.Outcome)))
	sw.r.events.record(p, settleWarns(st.Outcome), sdk.LabelReconcileSettled, EventActionSettle,
		settleNote(mr.Attempt, st, rule))
}

// sightings writes the pod cache's misses taken from the presence
// informer, in one board call. A write that fails (an older host answers
// Unimplemented) is logged and its sightings kept for the next sweep: the
// history is not the reconcile's to hold up. A deposed term ends the sweep.
// A sighting the board refuses because the attempt records another pod is
// of a foreign pod: reported as one (a decision, metered and audited),
// nothing written.
func (sw *sweep) sightings(ctx context.Context) error {
	ps, pods, dropped := sw.r.presence.seen.take(sw.req.Term, sw.req.Now)
	if dropped > 0 {
		sw.s.log.Warn("kube sweep: pod cache sightings dropped by their bound before a sweep could record them",
			"dropped", dropped, "bound", maxPendingSightings)
	}
	if len(ps) == 0 {
		return nil
	}
	res, err := sw.board.RecordPodSightings(ctx, ps)
	if err != nil {
		sw.r.presence.seen.putBack(ps, pods)
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("kube sweep: recording %d pod cache sightings: %w", len(ps), cerr)
		}
		sw.s.log.Warn("kube sweep: recording pod cache sightings failed: kept for the next sweep",
			"sightings", len(ps), "error", err)
		return nil
	}
	for i, mr := range res {
		switch {
		case i >= len(ps):
		case mr.NoopReason == sdk.NoopDeposed:
			sw.r.presence.seen.putBack(ps, pods)
			return errDeposed
		case mr.NoopReason == sdk.NoopPodNotRecorded:
			sw.r.foreign.saw(pods[i], ps[i].Attempt, "", "sweep")
		}
	}
	return nil
}

// marks pages through the provisional infra marks of kube attempts and
// confirms or overrides each from a live read of its attempt's pods.
func (sw *sweep) marks(ctx context.Context) error {
	q := sdk.ProvisionalQuery{Executors: []string{sdk.ExecutorKube}, Limit: ladder.PageSize}
	for {
		page, err := sw.board.ListProvisional(ctx, q)
		if err != nil {
			return fmt.Errorf("kube sweep: listing provisional infra marks: %w", err)
		}
		if err := sw.markPage(ctx, page.Candidates); err != nil {
			return err
		}
		if page.Next == nil {
			return nil
		}
		q.After = page.Next
	}
}

func (sw *sweep) markPage(ctx context.Context, cs []sdk.Candidate) error {
	if len(cs) == 0 {
		return nil
	}
	as := make([]sdk.Attempt, len(cs))
	for i, c := range cs {
		as[i] = c.Attempt
		sw.marked[c.Attempt] = true
		sw.markedKeys[attemptIndexKey(c.Attempt)] = true
		if insideValve(c, sw.req.Now, sw.req.Ladder) {
			sw.provisional[c.Attempt] = true
		}
	}
	pods, err := sw.r.listAttempts(ctx, as)
	if err != nil {
		return fmt.Errorf("kube sweep: reading the pods of %d provisional marks: %w", len(as), err)
	}
	var (
		confirms  []sdk.Confirm
		overrides []sdk.Override
		cDetail   []string
		oCand     []sdk.Candidate
		oDetail   []string
		oPod      []*pod // the pod whose record overrides
	)
	for _, c := range cs {
		// Only the attempt's recorded pod (when it records one) decides:
		// a foreign pod neither overrides nor holds the mark back.
		pods[c.Attempt] = sw.r.ownPods(c.Attempt, c.PodUID, pods[c.Attempt], "sweep")
		act, detail := judgeMark(c, pods[c.Attempt], sw.req.Now, sw.req.Ladder)
		switch act {
		case markConfirm:
			confirms = append(confirms, sdk.Confirm{Attempt: c.Attempt, Term: sw.req.Term, At: sw.req.Now})
			cDetail = append(cDetail, detail)
		case markOverride:
			rec := successPod(pods[c.Attempt])
			overrides = append(overrides, sdk.Override{Attempt: c.Attempt,
				MarkedAfter: sw.req.Now.Add(-sw.req.Ladder.InfraConfirmValve), EndedAt: rec.endedAt(sw.req.Now),
				PodUID: string(rec.UID), LossyPod: !rec.labels.hasRaw, Term: sw.req.Term, At: sw.req.Now})
			oCand, oDetail, oPod = append(oCand, c), append(oDetail, detail), append(oPod, rec)
		}
	}
	if sw.req.DryRun {
		for i, c := range confirms {
			sw.decide(sdk.LabelReconcileInfraConfirmed, c.Attempt, false, cDetail[i], nil)
		}
		for i, c := range oCand {
			sw.decide(sdk.LabelReconcileInfraOverride, c.Attempt, false, oDetail[i], map[string]string{"mark": c.FailureReason})
		}
		return nil
	}
	if len(confirms) > 0 {
		res, err := sw.board.ConfirmInfra(ctx, confirms)
		if err := sw.applied(res, err, "confirming", len(confirms), func(i int) {
			sw.decide(sdk.LabelReconcileInfraConfirmed, confirms[i].Attempt, true, cDetail[i], nil)
		}); err != nil {
			return err
		}
	}
	if len(overrides) > 0 {
		res, err := sw.board.OverrideInfra(ctx, overrides)
		if err == nil {
			sw.refusedOverrides(res, oCand)
		}
		return sw.applied(res, err, "overriding", len(overrides), func(i int) {
			mark := oCand[i].FailureReason
			sw.res.Overrides[mark]++
			sw.decide(sdk.LabelReconcileInfraOverride, oCand[i].Attempt, true,
				sdk.OverrideLogLine(mark)+": "+oDetail[i], map[string]string{"mark": mark})
			sw.r.events.record(oPod[i], false, sdk.LabelReconcileInfraOverride, EventActionSettle,
				"Settled "+attemptNote(oCand[i].Attempt)+" as success from its outcome record, over the provisional mark "+mark)
		})
	}
	return nil
}

// refusedOverrides says out loud each override the board refused because
// its pod names its task only by the lossy label and the marked attempt
// never recorded that pod: a SUCCESS record in a pod anyone could have
// made. The mark stays as it was; the refusal is logged and is a decision
// (not applied), so it is metered and audited.
func (sw *sweep) refusedOverrides(res []sdk.MarkResult, cands []sdk.Candidate) {
	for i, mr := range res {
		if i >= len(cands) || mr.NoopReason != sdk.NoopPodNotRecorded {
			continue
		}
		c := cands[i]
		sw.s.log.Warn("kube sweep: refused a SUCCESS record over an infra mark from a pod the attempt never recorded",
			"attempt", c.Attempt.String(), "mark", c.FailureReason)
		sw.decide(sdk.LabelReconcileInfraOverride, c.Attempt, false,
			"refused: the SUCCESS record came from a pod without the exact task id that the attempt never recorded",
			map[string]string{"mark": c.FailureReason, "noop": sdk.NoopPodNotRecorded})
	}
}

// warmMarks pages through the provisional infra marks of warm attempts
// and confirms each whose worker can no longer run it or said, in a claim
// after the mark, that it no longer does (judgeWarmMark), from a live LIST
// of the warm pool made after the page was listed. A
// LIST that fails confirms nothing (warm_worker_list_error): those marks
// stay provisional, and the rest of the sweep goes on.
func (sw *sweep) warmMarks(ctx context.Context) error {
	q := sdk.ProvisionalQuery{Executors: []string{sdk.ExecutorWarm}, Limit: ladder.PageSize}
	for {
		page, err := sw.board.ListProvisional(ctx, q)
		if err != nil {
			return fmt.Errorf("kube sweep: listing provisional infra marks of warm attempts: %w", err)
		}
		if len(page.Candidates) > 0 {
			ok, err := sw.warmPage(ctx, page.Candidates)
			if err != nil || !ok {
				return err
			}
		}
		if page.Next == nil {
			return nil
		}
		q.After = page.Next
	}
}

// warmPage judges one page of warm marks; ok is false when the warm pool
// could not be listed (the remaining pages are left for the next sweep).
func (sw *sweep) warmPage(ctx context.Context, cs []sdk.Candidate) (bool, error) {
	workers := map[string]*pod{}
	err := sw.r.list(ctx, sw.r.warm, func(p *pod) { workers[p.Name] = p })
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return false, fmt.Errorf("kube sweep: listing the warm pool: %w", cerr)
		}
		sw.s.log.Warn("kube sweep: listing the warm pool failed: no warm mark confirmed this sweep",
			"marks", len(cs), "error", err)
		sw.decide(sdk.LabelWarmWorkerListErr, sdk.Attempt{}, false,
			fmt.Sprintf("listing the warm pool failed; %d provisional warm marks left unconfirmed: %v", len(cs), err),
			map[string]string{"error": err.Error(), "marks": strconv.Itoa(len(cs))})
		return false, nil
	}
	var (
		confirms []sdk.Confirm
		details  []string
		evidence []map[string]string
	)
	for _, c := range cs {
		act, signal, detail := judgeWarmMark(c, workers)
		if act != markConfirm {
			continue
		}
		confirms = append(confirms, sdk.Confirm{Attempt: c.Attempt, Term: sw.req.Term, At: sw.req.Now})
		details = append(details, detail)
		ev := map[string]string{"mark": c.FailureReason, "warm_worker": c.WarmWorker,
			"warm_workers": strconv.Itoa(len(workers)), "warm_signal": string(signal)}
		if signal == warmWorkerClaim {
			ev["warm_claimed_at"] = c.WarmClaimedAt.UTC().Format(time.RFC3339Nano)
		}
		evidence = append(evidence, ev)
	}
	if len(confirms) == 0 {
		return true, nil
	}
	if sw.req.DryRun {
		for i, c := range confirms {
			sw.decide(sdk.LabelReconcileInfraConfirmed, c.Attempt, false, details[i], evidence[i])
		}
		return true, nil
	}
	res, err := sw.board.ConfirmInfra(ctx, confirms)
	return true, sw.applied(res, err, "confirming warm", len(confirms), func(i int) {
		sw.decide(sdk.LabelReconcileInfraConfirmed, confirms[i].Attempt, true, details[i], evidence[i])
	})
}

// applied walks the results of a batch of n writes, calling each for the
// index of every one that applied. A deposed no-op ends the sweep.
func (sw *sweep) applied(res []sdk.MarkResult, err error, doing string, n int, each func(int)) error {
	if err != nil {
		return fmt.Errorf("kube sweep: %s %d infra marks: %w", doing, n, err)
	}
	for i, mr := range res {
		if mr.NoopReason == sdk.NoopDeposed {
			return errDeposed
		}
		if mr.Applied && i < n {
			each(i)
		}
	}
	return nil
}

// collect deletes finished pods that are settled and have been finished
// for CollectAfter, each pinned by its UID. A pod whose attempt holds a
// provisional infra mark is kept: its record may still decide it. So is a
// pod that still carries the outcome record finalizer (this sweep's
// release step held it, or its release failed): a later sweep collects it
// once the finalizer is gone.
func (sw *sweep) collect(ctx context.Context, pods []*pod, settled map[*pod]bool, released map[types.UID]bool) error {
	if sw.req.DryRun {
		return nil
	}
	var n, failed int
	for _, p := range pods {
		a, ok := p.labels.attempt()
		if !ok || sw.heldByMark(p, a) || !collectible(p, settled[p], sw.req.Now) {
			continue
		}
		if _, held := p.recordFinalizer(); held && !released[p.UID] {
			continue
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("kube sweep: collecting finished pods: %w", err)
		}
		uid := p.UID
		sw.r.presence.tombs.collected(uid) // before the delete event can arrive
		err := sw.r.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
			Preconditions: &metav1.Preconditions{UID: &uid}})
		switch {
		case err == nil:
			n++
		case gone(err):
		default:
			failed++
			sw.s.log.Warn("kube sweep: collecting a finished pod failed", "pod", p.Name, "error", err)
		}
	}
	if n > 0 || failed > 0 {
		sw.s.log.Info("kube sweep: collected finished pods", "deleted", n, "failed", failed)
	}
	return nil
}

// settleNote is the note of the Event of settlement st, applied to
// attempt a by rule.
func settleNote(a sdk.Attempt, st sdk.Settlement, rule string) string {
	note := "Settled " + attemptNote(a) + " as " + string(st.Outcome)
	if st.Reason != "" {
		note += " (" + st.Reason + ")"
	}
	return note + ", by rule " + rule
}

// settleEvidence is the evidence of a settle decision.
func settleEvidence(p *pod, rule, outcome string) map[string]string {
	ev := map[string]string{"rule": rule, "pod": p.Name, "pod_uid": string(p.UID)}
	if outcome != "" {
		ev["outcome"] = outcome
	}
	if !p.labels.hasRaw {
		ev["task_id_label"] = p.labels.task
	}
	return ev
}

// successPod is the pod among the attempt's that holds a SUCCESS record
// (nil: none), one with the exact task id first: a pod without it is the
// attempt's only if the attempt recorded its UID, which the board checks.
func successPod(pods []*pod) *pod {
	var lossy *pod
	for _, p := range pods {
		if rec, ok := p.record(); ok && rec.Outcome == RecordSuccess {
			if p.labels.hasRaw {
				return p
			}
			if lossy == nil {
				lossy = p
			}
		}
	}
	return lossy
}

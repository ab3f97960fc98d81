package reap

import (
	"context"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// Planned is a mark a pass decided on, with the decision it becomes.
type Planned struct {
	Mark     sdk.Mark
	Label    string
	Detail   string
	Evidence Evidence
}

// FollowUp is a further decision about an attempt, recorded after the
// decision of its mark (a teardown that failed or fell back, say).
type FollowUp struct {
	Label    string
	Applied  bool
	Detail   string
	Evidence Evidence
}

// AfterMark runs for each applied mark before its decision is recorded; it
// may add to the planned evidence and returns the follow-up decisions.
type AfterMark func(ctx context.Context, p *Planned) []FollowUp

// Settle applies the planned marks (nothing in a dry run) and records one
// decision per mark: its own label when applied or in a dry run, and
// sdk.LabelMarkNoop with the board's reason when the guard turned it into a
// no-op. after runs only for applied marks. An error of the board ends the
// settle; the marks decided before it are recorded.
func Settle(ctx context.Context, board sdk.Board, rec *Recorder, planned []Planned, after AfterMark) error {
	if len(planned) == 0 {
		return nil
	}
	if rec.pass.DryRun {
		for _, p := range planned {
			rec.Add(p.Label, p.Mark.Attempt, false, p.Detail+" (dry run: not marked)", p.Evidence)
		}
		return rec.Flush(ctx)
	}
	results, err := ApplyMarks(ctx, board, marksOf(planned))
	return settled(ctx, rec, planned, results, err, after)
}

func marksOf(planned []Planned) []sdk.Mark {
	marks := make([]sdk.Mark, len(planned))
	for i, p := range planned {
		marks[i] = p.Mark
	}
	return marks
}

// settled records the decisions of planned marks from the board's results
// (ApplyMarks: the results of the batches before an error, and the error).
func settled(ctx context.Context, rec *Recorder, planned []Planned, results []sdk.MarkResult, err error, after AfterMark) error {
	for i, res := range results {
		p := &planned[i]
		if !res.Applied {
			p.Evidence[EvNoopReason] = res.NoopReason
			rec.Add(sdk.LabelMarkNoop, p.Mark.Attempt, false,
				p.Label+" not marked: the attempt "+noopWords(res.NoopReason), p.Evidence)
			continue
		}
		var more []FollowUp
		if after != nil {
			more = after(ctx, p)
		}
		rec.Add(p.Label, p.Mark.Attempt, true, p.Detail, p.Evidence)
		for _, f := range more {
			rec.Add(f.Label, p.Mark.Attempt, f.Applied, f.Detail, f.Evidence)
		}
	}
	if err != nil {
		return err
	}
	return rec.Flush(ctx)
}

// MarkBatch is the most marks a Backlog settles in one guarded write: a
// drain page (ladder.DrainPage). A drain that finds a backlog of dead
// attempts marks them in few, large writes, each mark guarded exactly as in
// a write of one.
const MarkBatch = ladder.DrainPage

// inFlight is how many batches a Backlog writes at once beside the drain:
// while the board works on one, the next is already on its way, so that a
// database on the same few cores as the reaper is not left idle while the
// drain records a batch and judges the next page.
const inFlight = 2

// Backlog holds planned marks across the pages of a drain and settles them
// once MarkBatch of them wait, and at the end of the drain. Every mark keeps
// its own guard (attempt, source state, heartbeat, term and lease), so a
// mark that waits a few pages is no less safe: a row that moved,
// heartbeated or changed leader in between makes it a no-op, recorded as
// such.
//
// A full batch is written while the drain goes on: the board's write runs
// on a goroutine of its own, inFlight of them at most, and their results
// are recorded (the decisions, and after for each applied mark) on the
// drain's own goroutine, in the order the batches were made, when a write
// slot is needed or when the backlog is settled. A pass hands its Backlog to
// Run (Spec.Backlog), which settles what is left after the drain, whether
// or not the drain failed: Settle waits for every write under way, so no
// write outlives the pass.
type Backlog struct {
	board   sdk.Board
	rec     *Recorder
	after   AfterMark
	pending []Planned
	flying  []*markWrite // the batches being written, oldest first
}

// markWrite is a batch of marks being written beside the drain.
type markWrite struct {
	planned []Planned
	done    chan struct{}
	results []sdk.MarkResult // set once done is closed
	err     error
}

// NewBacklog starts an empty backlog whose marks are settled on board, their
// decisions recorded in rec, after run for each applied mark.
func NewBacklog(board sdk.Board, rec *Recorder, after AfterMark) *Backlog {
	return &Backlog{board: board, rec: rec, after: after}
}

// Add queues planned marks. Once MarkBatch wait, it starts writing them,
// first recording the oldest write under way (waiting for it if need be)
// when inFlight are. A failed write ends the settle: the batch at hand is
// not written, and Add returns the error.
func (b *Backlog) Add(ctx context.Context, planned ...Planned) error {
	b.pending = append(b.pending, planned...)
	if len(b.pending) < MarkBatch {
		return nil
	}
	batch := b.pending
	b.pending = nil
	if len(b.flying) >= inFlight {
		if err := b.land(ctx); err != nil {
			return err // this batch is not written: an error ends the settle
		}
	}
	if b.rec.pass.DryRun {
		return Settle(ctx, b.board, b.rec, batch, b.after)
	}
	w := &markWrite{planned: batch, done: make(chan struct{})}
	b.flying = append(b.flying, w)
	marks := marksOf(batch)
	go func() {
		defer close(w.done)
		w.results, w.err = ApplyMarks(ctx, b.board, marks)
	}()
	return nil
}

// land waits for the oldest batch being written, if any, and records its
// decisions.
func (b *Backlog) land(ctx context.Context) error {
	if len(b.flying) == 0 {
		return nil
	}
	w := b.flying[0]
	b.flying = b.flying[1:]
	<-w.done
	return settled(ctx, b.rec, w.planned, w.results, w.err, b.after)
}

// Settle waits for every batch being written and settles every mark
// waiting (none after a failed write).
func (b *Backlog) Settle(ctx context.Context) error {
	var err error
	for len(b.flying) > 0 {
		// Every write under way is waited for and recorded, even after
		// one failed: what it applied must reach the sink.
		if lerr := b.land(ctx); err == nil {
			err = lerr
		}
	}
	planned := b.pending
	b.pending = nil
	if err != nil {
		return err // the marks left are not written: an error ends the settle
	}
	return Settle(ctx, b.board, b.rec, planned, b.after)
}

func noopWords(reason string) string {
	switch reason {
	case sdk.NoopMovedOn:
		return "moved on (another try, epoch or state) since it was listed"
	case sdk.NoopHeartbeated:
		return "heartbeated since it was listed"
	case sdk.NoopDeposed:
		return "was not touched: this leadership term is no longer current"
	case sdk.NoopNotFound:
		return "no longer exists"
	}
	return "was left alone by the board (" + reason + ")"
}

// TeardownAttempt tears down one marked attempt (kube) and returns the
// follow-ups: deleteErrLabel when the teardown failed (the mark stays), and
// sdk.LabelTeardownDeleteFallback when the stop in place was refused and the
// object was deleted instead. What happened goes into ev. The pod UID
// recorded on the attempt, when ev names one (EvPodUID, from
// CandidateEvidence), pins the teardown to that pod.
func TeardownAttempt(ctx context.Context, exec sdk.Executions, pass sdk.Pass, a sdk.Attempt, reason, deleteErrLabel string, ev Evidence) []FollowUp {
	out, err := exec.Teardown(ctx, sdk.TeardownRequest{Attempt: &a, Reason: reason, Term: pass.Term, PodUID: ev[EvPodUID]})
	return TeardownFollowUps(out, err, deleteErrLabel, ev)
}

// TeardownFollowUps turns what a teardown did into follow-up decisions:
// deleteErrLabel when it failed (whatever was marked stays marked), then
// sdk.LabelTeardownDeleteFallback when a stop in place was refused and the
// object deleted instead. The summary goes into ev.
func TeardownFollowUps(out []sdk.TeardownOutcome, err error, deleteErrLabel string, ev Evidence) []FollowUp {
	failed, fallback, summary := TeardownTrouble(out, err)
	ev[EvTeardown] = summary
	var more []FollowUp
	if failed {
		more = append(more, FollowUp{Label: deleteErrLabel, Detail: "teardown failed, the mark stays: " + summary,
			Evidence: ev.Clone()})
	}
	if fallback {
		more = append(more, FollowUp{Label: sdk.LabelTeardownDeleteFallback, Applied: true,
			Detail: "stopping in place was refused; deleted instead: " + summary, Evidence: ev.Clone()})
	}
	return more
}

// OwedOrphanStop is the kind, in the pass state, of attempts whose orphan
// stop was still in flight when their pass ended: the pass that later finds
// them dead marks them under the orphan-stopped label.
const OwedOrphanStop = "orphan_stop"

// OrphanStopLabels name the decisions of an orphan stop that did not end
// in a mark: one still in flight (the attempt reads alive meanwhile), one
// that failed or could not confirm the group gone.
type OrphanStopLabels struct {
	InFlight string
	Failed   string
}

// StopOrphanGroup stops the orphaned task group of an attempt whose agent is
// dead, before the attempt is marked, so that a re-placed attempt never runs
// beside the old copy. It reports whether the group is gone. When it is
// not, it has recorded a deferral and the attempt must not be marked: under
// labels.InFlight when the stop goes on in the substrate (the attempt is
// then kept in stopping, so the pass that finds it dead marks it as
// stopped), or
// under labels.Failed when the stop failed or could not confirm the group
// gone. What happened goes into ev.
func StopOrphanGroup(ctx context.Context, exec sdk.Executions, rec *Recorder, stopping Stopping, a sdk.Attempt, labels OrphanStopLabels, ev Evidence) bool {
	res, err := exec.StopOrphan(ctx, sdk.StopRequest{Attempt: a, Reason: sdk.StopOrphan})
	switch {
	case err != nil:
		ev[EvStop] = "error: " + err.Error()
		rec.Add(labels.Failed, a, false, "stopping the orphaned task group failed: "+err.Error(), ev)
		return false
	case res.InFlight:
		ev[EvStop] = "in flight: " + res.Detail
		stopping[a] = true
		rec.Add(labels.InFlight, a, false, "the orphaned task group is being stopped; the mark waits until it is gone: "+res.Detail, ev)
		return false
	case !res.Stopped:
		ev[EvStop] = "not stopped: " + res.Detail
		rec.Add(labels.Failed, a, false, "the orphaned task group is not gone: "+res.Detail, ev)
		return false
	}
	ev[EvStop] = "stopped: " + res.Detail
	return true
}

// Stopping is the set of attempts whose orphan stop is in flight. A pass
// takes it from its state at the start (TakeStopping), asks Settled for
// each attempt it marks, and hands it back at the end (Keep). An attempt
// whose stop this pass found in flight is kept; one the pass did not reach
// is kept while the listings were not drained to their end, and forgotten
// once they were (it is no longer a candidate). The value says whether this
// pass found the stop in flight.
type Stopping map[sdk.Attempt]bool

// TakeStopping takes the attempts owed an orphan-stopped mark from st.
func TakeStopping(st *State) Stopping {
	out := Stopping{}
	for _, a := range st.TakeOwed(OwedOrphanStop) {
		out[a] = false
	}
	return out
}

// Settled reports whether a was stopping, and forgets it.
func (s Stopping) Settled(a sdk.Attempt) bool {
	if _, ok := s[a]; !ok {
		return false
	}
	delete(s, a)
	return true
}

// Keep hands what is left back to st, unless the pass drained every
// listing to its end.
func (s Stopping) Keep(st *State, stats DrainStats) {
	for a, inFlight := range s {
		if inFlight || !stats.Exhausted {
			st.Owe(OwedOrphanStop, a)
		}
	}
}

package audit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// ErrPassOver refuses a write that a pass's plugin makes after the host
// closed the pass (its share ran out, or the loop stopped): nothing it
// writes then could still be audited with the pass.
var ErrPassOver = errors.New("the pass is over: the host takes no more writes from it")

// writeBound bounds one write of a pass once the pass's own context has
// ended: the write was sent, and the host waits for its answer (the store
// has its own, shorter, query timeout).
const writeBound = 30 * time.Second

// Ledger is the board as the host hands it to one pass (a reaper's pass, or
// the reconcile sweep). Reads go through unchanged; each write (marks, a run
// reap, the sweep's settlements, confirmations and overrides) is made whole
// even when the pass's context ends while it is under way — the host, not
// the plugin, learns what it applied — and every write that applied is kept.
// After the pass, Close ends it (a later write is refused) and Unaudited
// names the applied writes that no applied decision of the pass covers: a
// plugin cut off by its budget, stopped with the loop, or dead between its
// write and its decision. The host audits those itself, so that no applied
// write goes without its decision.
type Ledger struct {
	sdk.Board

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
	// The attempts that an applied decision of the pass is about, as the
	// host received them (Cover); the writes about them are dropped from
	// the lists below from time to time (compact), so that a long pass
	// whose decisions stream in does not keep every write it made.
	covered   map[sdk.Attempt]bool
	compactAt int // compact once this many writes are kept
	// What applied, as it was asked (the decisions are made only for
	// what Unaudited finds uncovered).
	marks     []sdk.Mark
	runs      []sdk.RunReap
	settled   []sdk.Settlement
	confirmed []sdk.Confirm
	overrides []sdk.Override

	// The refusals of the pass (Refusals): writes the board refused as
	// no plugin may ask (a source state its kind may not come from, a
	// mark on a finished run) and writes that came after Close. reaper
	// names the plugin in their decisions; late takes those made after
	// Close (nil: they are only refused).
	reaper   string
	late     func([]sdk.Decision)
	refused  []sdk.Decision
	nRefused int // refusals audited so far, to MaxRefusals
}

var _ sdk.Board = (*Ledger)(nil)

// NewLedger starts the ledger of one pass over board.
func NewLedger(board sdk.Board) *Ledger {
	return &Ledger{Board: board, covered: map[sdk.Attempt]bool{}, compactAt: compactFloor}
}

// compactFloor is the fewest kept writes worth compacting.
const compactFloor = 1024

// Cover notes the applied decisions among ds (received from the pass while
// it goes on): Unaudited finds no write about their attempts uncovered.
func (l *Ledger) Cover(ds []sdk.Decision) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.coverLocked(ds)
	if l.keptLocked() >= l.compactAt {
		l.marks = uncovered(l.covered, l.marks, func(m sdk.Mark) sdk.Attempt { return m.Attempt })
		l.runs = uncovered(l.covered, l.runs, func(r sdk.RunReap) sdk.Attempt { return sdk.Attempt{RunID: r.RunID} })
		l.settled = uncovered(l.covered, l.settled, func(s sdk.Settlement) sdk.Attempt { return s.Attempt })
		l.confirmed = uncovered(l.covered, l.confirmed, func(c sdk.Confirm) sdk.Attempt { return c.Attempt })
		l.overrides = uncovered(l.covered, l.overrides, func(o sdk.Override) sdk.Attempt { return o.Attempt })
		// Twice what is left: compacting costs a walk of the kept writes,
		// paid once for as many new ones.
		l.compactAt = max(compactFloor, 2*l.keptLocked())
	}
}

// coverLocked notes the attempts of the applied decisions among ds; l.mu
// is held.
func (l *Ledger) coverLocked(ds []sdk.Decision) {
	for _, d := range ds {
		if d.Applied {
			l.covered[d.Attempt] = true
		}
	}
}

// keptLocked is how many writes the ledger keeps; l.mu is held.
func (l *Ledger) keptLocked() int {
	return len(l.marks) + len(l.runs) + len(l.settled) + len(l.confirmed) + len(l.overrides)
}

// uncovered filters ws, in place, down to the writes whose attempt is not
// covered.
func uncovered[W any](covered map[sdk.Attempt]bool, ws []W, about func(W) sdk.Attempt) []W {
	kept := ws[:0]
	for _, w := range ws {
		if !covered[about(w)] {
			kept = append(kept, w)
		}
	}
	clear(ws[len(kept):]) // what was dropped is not held by the backing array
	return kept
}

// MaxRefusals bounds the refusals one ledger audits one by one: a plugin
// that floods the board with writes it may not make must not flood the
// audit too. Past it, refusals are still refused, and one more decision
// says how many went unaudited.
const MaxRefusals = 1000

// OnRefusal names the plugin whose pass the ledger serves (its refusals'
// Reaper) and gives the function that takes the refusals made after Close,
// when the pass's own flow is over: the host meters, logs and audits them
// there. Call it before the pass starts.
func (l *Ledger) OnRefusal(reaper string, late func(ds []sdk.Decision)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reaper, l.late = reaper, late
}

// Refusals returns the refusals of the pass so far and forgets them (call
// it after Close, and record what it returns).
func (l *Ledger) Refusals() []sdk.Decision {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.refused
	l.refused = nil
	return out
}

// refuseLocked notes refusals, up to MaxRefusals (the one past it is a
// summary), and returns those to hand to late: every one once the pass is
// closed. l.mu is held.
func (l *Ledger) refuseLocked(ds []sdk.Decision) (late []sdk.Decision) {
	for _, d := range ds {
		l.nRefused++
		switch {
		case l.nRefused > MaxRefusals+1:
			continue
		case l.nRefused == MaxRefusals+1:
			d = sdk.Decision{Label: d.Label, Detail: fmt.Sprintf("more than %d refused writes in one pass: "+
				"the rest are refused without a decision each", MaxRefusals)}
		}
		d.Reaper = l.reaper
		if l.closed {
			late = append(late, d)
		} else {
			l.refused = append(l.refused, d)
		}
	}
	if l.late == nil {
		return nil
	}
	return late
}

// begin admits a write, unless the pass is over: then the write is refused
// (one decision for the call, about its first request's attempt), and the
// refusal goes to late.
func (l *Ledger) begin(what string, n int, first sdk.Attempt) error {
	l.mu.Lock()
	if !l.closed {
		l.wg.Add(1)
		l.mu.Unlock()
		return nil
	}
	late := l.refuseLocked([]sdk.Decision{{Label: sdk.LabelBoardRefusedPassClosed, Attempt: first,
		Detail:   "a write that reached the host after its pass was closed: nothing written",
		Evidence: map[string]string{EvWrite: what, EvRequests: strconv.Itoa(n), EvRefusal: sdk.NoopPassClosed}}})
	fn := l.late
	l.mu.Unlock()
	if len(late) > 0 {
		fn(late)
	}
	return ErrPassOver
}

// refusalOf says whether the board's answer to one request of a write is a
// refusal the host audits (NoopSourceRefused; for a mark, NoopRunFinished
// too), and the decision's label.
func refusalOf(res sdk.MarkResult, mark bool) (string, bool) {
	switch {
	case res.Applied:
		return "", false
	case res.NoopReason == sdk.NoopSourceRefused:
		return sdk.LabelBoardRefusedSourceState, true
	case mark && res.NoopReason == sdk.NoopRunFinished:
		return sdk.LabelBoardRefusedRunFinished, true
	}
	return "", false
}

// detached is ctx without its cancellation, bounded by writeBound.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), writeBound)
}

// batch makes one batched write through the ledger, adds the requests
// that applied to *kept, and notes the refusals among the answers (asked
// gives a refused request's evidence; mark: the requests are marks).
func batch[R any](ctx context.Context, l *Ledger, what string, reqs []R, attempt func(R) sdk.Attempt,
	asked func(R) map[string]string, mark bool,
	write func(context.Context, []R) ([]sdk.MarkResult, error), kept *[]R) ([]sdk.MarkResult, error) {
	var first sdk.Attempt
	if len(reqs) > 0 {
		first = attempt(reqs[0])
	}
	if err := l.begin(what, len(reqs), first); err != nil {
		return nil, fmt.Errorf("%s (%d): %w", what, len(reqs), err)
	}
	defer l.wg.Done()
	wctx, cancel := detached(ctx)
	defer cancel()
	res, err := write(wctx, reqs)
	if err != nil {
		return res, err
	}
	var refused []sdk.Decision
	for i, r := range res {
		if i >= len(reqs) {
			break
		}
		if label, ok := refusalOf(r, mark); ok {
			ev := asked(reqs[i])
			ev[EvWrite], ev[EvRefusal] = what, r.NoopReason
			refused = append(refused, sdk.Decision{Label: label, Attempt: attempt(reqs[i]),
				Detail: "the board refused a write no plugin may make: nothing written", Evidence: ev})
		}
	}
	l.mu.Lock()
	for i, r := range res {
		if r.Applied && i < len(reqs) {
			*kept = append(*kept, reqs[i])
		}
	}
	// The pass is open (begin admitted the write and Close waits for it).
	l.refuseLocked(refused)
	l.mu.Unlock()
	return res, nil
}

func markAsked(m sdk.Mark) map[string]string {
	return map[string]string{EvMarkKind: string(m.Kind), EvMarkReason: m.Reason,
		EvMarkFrom: strings.Join(m.FromStates, ","), EvConfirm: strconv.FormatBool(m.Confirm)}
}

func settleAsked(s sdk.Settlement) map[string]string {
	return map[string]string{EvOutcome: string(s.Outcome), EvMarkReason: s.Reason,
		EvMarkFrom: strings.Join(s.FromStates, ",")}
}

func noneAsked[R any](R) map[string]string { return map[string]string{} }

// Mark applies the marks and keeps those that applied.
func (l *Ledger) Mark(ctx context.Context, marks []sdk.Mark) ([]sdk.MarkResult, error) {
	return batch(ctx, l, "mark attempts", marks, func(m sdk.Mark) sdk.Attempt { return m.Attempt }, markAsked, true,
		l.Board.Mark, &l.marks)
}

// AppendLog appends try log lines while the pass is open; after Close it
// is refused like every other write.
func (l *Ledger) AppendLog(ctx context.Context, term int64, lines []sdk.LogLine) error {
	var first sdk.Attempt
	if len(lines) > 0 {
		first = lines[0].Attempt
	}
	if err := l.begin("append try log lines", len(lines), first); err != nil {
		return fmt.Errorf("append %d try log lines: %w", len(lines), err)
	}
	defer l.wg.Done()
	wctx, cancel := detached(ctx)
	defer cancel()
	return l.Board.AppendLog(wctx, term, lines)
}

// Settle settles finished attempts and keeps those settled, each under the
// attempt the board settled (a settlement read from a pod that names its
// task only by the lossy label is resolved by the board).
func (l *Ledger) Settle(ctx context.Context, ss []sdk.Settlement) ([]sdk.MarkResult, error) {
	// The ledger's own copy: it is kept under the resolved attempts, never
	// the caller's.
	ss = slices.Clone(ss)
	return batch(ctx, l, "settle attempts", ss, func(s sdk.Settlement) sdk.Attempt { return s.Attempt }, settleAsked, false,
		func(ctx context.Context, ss []sdk.Settlement) ([]sdk.MarkResult, error) {
			res, err := l.Board.Settle(ctx, ss)
			for i, r := range res {
				if i < len(ss) && r.Applied {
					ss[i].Attempt, ss[i].LossyPod = r.Attempt, false
				}
			}
			return res, err
		}, &l.settled)
}

// ConfirmInfra confirms infra marks and keeps those confirmed.
func (l *Ledger) ConfirmInfra(ctx context.Context, cs []sdk.Confirm) ([]sdk.MarkResult, error) {
	return batch(ctx, l, "confirm infra marks", cs, func(c sdk.Confirm) sdk.Attempt { return c.Attempt }, noneAsked, false,
		l.Board.ConfirmInfra, &l.confirmed)
}

// OverrideInfra overrides infra marks and keeps those overridden.
func (l *Ledger) OverrideInfra(ctx context.Context, overrides []sdk.Override) ([]sdk.MarkResult, error) {
	return batch(ctx, l, "override infra marks", overrides, func(o sdk.Override) sdk.Attempt { return o.Attempt }, noneAsked, false,
		l.Board.OverrideInfra, &l.overrides)
}

// RecordPodSightings records the pod cache's history while the pass is
// open; after Close it is refused like every other write. Nothing of it is
// kept: it is history, no write a decision covers.
func (l *Ledger) RecordPodSightings(ctx context.Context, ss []sdk.PodSighting) ([]sdk.MarkResult, error) {
	var first sdk.Attempt
	if len(ss) > 0 {
		first = ss[0].Attempt
	}
	if err := l.begin("record pod sightings", len(ss), first); err != nil {
		return nil, fmt.Errorf("record %d pod sightings: %w", len(ss), err)
	}
	defer l.wg.Done()
	wctx, cancel := detached(ctx)
	defer cancel()
	return l.Board.RecordPodSightings(wctx, ss)
}

// ReapRun reaps the run and keeps the reap if it applied.
func (l *Ledger) ReapRun(ctx context.Context, r sdk.RunReap) (sdk.RunReapResult, error) {
	if err := l.begin("reap a run", 1, sdk.Attempt{RunID: r.RunID}); err != nil {
		return sdk.RunReapResult{}, fmt.Errorf("reap run %s: %w", r.RunID, err)
	}
	defer l.wg.Done()
	wctx, cancel := detached(ctx)
	defer cancel()
	res, err := l.Board.ReapRun(wctx, r)
	if err == nil && res.Applied {
		l.mu.Lock()
		l.runs = append(l.runs, r)
		l.mu.Unlock()
	}
	return res, err
}

// Close ends the pass: it waits for the writes under way and refuses any
// later one.
func (l *Ledger) Close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.wg.Wait()
}

// Evidence keys of a decision the host audits for a write whose own
// decision never reached it.
const (
	EvRecovered  = "recovered"
	EvMarkKind   = "mark_kind"
	EvMarkReason = "mark_reason"
	EvMarkFrom   = "mark_from_states"
	EvMessage    = "message"
	EvOutcome    = "outcome"
	EvTerm       = "term"
	// The evidence of a refused write: which write, the board's (or the
	// host's) no-op reason, how many requests the call carried, and
	// whether a mark asked to be confirmed as made.
	EvWrite    = "write"
	EvRefusal  = "refusal"
	EvRequests = "requests"
	EvConfirm  = "confirm"
)

// Unaudited returns a decision for each applied write of the pass that no
// applied decision in ds nor in what Cover was given (the pass's, as the
// host received them) is about:
// labelled as the write says (a mark's reason, orphan_run for a run reap,
// the reconcile labels for the sweep's writes), applied, with what the
// board was asked as its evidence. why says how the pass ended. Call it
// after Close.
func (l *Ledger) Unaudited(reaper string, ds []sdk.Decision, why string) []sdk.Decision {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.keptLocked() == 0 {
		return nil
	}
	l.coverLocked(ds)
	audited := map[sdk.Attempt]bool{} // the attempts decided here, once each
	detail := "applied on the board, but its decision never reached the host (" + why +
		"): audited by the host from the write"
	var out []sdk.Decision
	add := func(label string, a sdk.Attempt, term int64, ev func() map[string]string) {
		if l.covered[a] || audited[a] {
			return
		}
		audited[a] = true
		e := ev()
		e[EvRecovered], e[EvTerm] = "host", strconv.FormatInt(term, 10)
		out = append(out, sdk.Decision{Reaper: reaper, Label: label, Attempt: a, Applied: true, Detail: detail, Evidence: e})
	}
	for _, m := range l.marks {
		label := m.Reason
		if label == "" {
			label = sdk.LabelPassError // a mark must name its reason; this one did not
		}
		add(label, m.Attempt, m.Term, func() map[string]string {
			return map[string]string{EvMarkKind: string(m.Kind), EvMarkReason: m.Reason,
				EvMarkFrom: strings.Join(m.FromStates, ","), EvMessage: m.Message}
		})
	}
	for _, r := range l.runs {
		add(sdk.LabelOrphanRun, sdk.Attempt{RunID: r.RunID}, r.Term, func() map[string]string {
			return map[string]string{EvMessage: r.Message}
		})
	}
	for _, st := range l.settled {
		add(sdk.LabelReconcileSettled, st.Attempt, st.Term, func() map[string]string {
			return map[string]string{EvOutcome: string(st.Outcome), EvMarkReason: st.Reason, EvMessage: st.Message}
		})
	}
	none := func() map[string]string { return map[string]string{} }
	for _, c := range l.confirmed {
		add(sdk.LabelReconcileInfraConfirmed, c.Attempt, c.Term, none)
	}
	for _, o := range l.overrides {
		add(sdk.LabelReconcileInfraOverride, o.Attempt, o.Term, none)
	}
	return out
}

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
	"github.com/dexaflow/reaper/sdk/clock"
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

	// The board's edge (Guard): the clock every write is fenced at, the
	// start of the pass, whether it is a reaper's (whose marks may not
	// confirm themselves) and the labels the host audits its writes
	// under. clk nil: writes go through as asked.
	clk      clock.Clock
	start    time.Time
	byReaper bool
	allowed  map[string]bool
	// substrate, when set (ConfirmDead), is asked before a mark is written
	// whether its attempt reads dead: then the host confirms it as made.
	substrate sdk.Executions
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

// Guard makes the ledger the board's edge for a pass (or sweep) that
// began at start: every write is fenced at clk's time at the call, and a
// write whose At is not the pass's (further than sdk.AtTolerance before
// start or after the call) is refused whole (NoopTimeRefused); for a
// reaper's pass (byReaper), a mark that asks to be confirmed as it is made
// is refused too (NoopConfirmRefused). Each refusal is audited under the
// ledger's reaper (OnRefusal). allowed is the labels the plugin declared
// (sdk.AllowedLabels; nil: any): a write the host audits itself
// (Unaudited) is filed under its mark's reason only when it is one of
// them. Call it before the pass starts.
func (l *Ledger) Guard(clk clock.Clock, start time.Time, byReaper bool, allowed map[string]bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.clk, l.start, l.byReaper, l.allowed = clk, start, byReaper, allowed
}

// ConfirmDead makes the host confirm an infra mark of the pass as it is
// made when the substrate, asked by the host at the call, reads the
// attempt dead (nothing of it runs): on Lite, where no sweep reads an
// outcome, the substrate's word confirms, never the plugin's (which Guard
// refuses). A mark whose attempt reads alive or unknown, or whose read
// fails, is made provisional: the valve applies to it. Call it before the
// pass starts.
func (l *Ledger) ConfirmDead(substrate sdk.Executions) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.substrate = substrate
}

// confirmDead sets Confirm on the infra marks among ms whose attempts the
// substrate reads dead now (ConfirmDead; none without it).
func (l *Ledger) confirmDead(ctx context.Context, ms []sdk.Mark) {
	l.mu.Lock()
	sub, clk := l.substrate, l.clk
	l.mu.Unlock()
	if sub == nil || clk == nil {
		return
	}
	var attempts []sdk.Attempt
	var at []int
	for i, m := range ms {
		if m.Kind == sdk.MarkInfra {
			attempts, at = append(attempts, m.Attempt), append(at, i)
		}
	}
	if len(attempts) == 0 {
		return
	}
	live, err := sub.Liveness(ctx, sdk.LivenessRequest{Attempts: attempts, Live: true, Now: clk.Now()})
	if err != nil {
		return // provisional: the valve applies
	}
	for j, lv := range live {
		// An answer names its attempt, or leaves it to its position.
		if j < len(at) && lv.State == sdk.Dead && (lv.Attempt == attempts[j] || lv.Attempt == sdk.Attempt{}) {
			ms[at[j]].Confirm = true
		}
	}
}

// fenceAt is the time a write admitted now is fenced at, and whether the
// plugin's at may stand beside it: zero, or the pass's time within
// sdk.AtTolerance. Without Guard, the plugin's at is kept.
func (l *Ledger) fenceAt(at time.Time) (time.Time, bool) {
	l.mu.Lock()
	clk, start := l.clk, l.start
	l.mu.Unlock()
	if clk == nil {
		return at, true
	}
	now := clk.Now()
	if at.IsZero() {
		return now, true
	}
	ok := !at.Before(start.Add(-sdk.AtTolerance)) && !at.After(now.Add(sdk.AtTolerance))
	return now, ok
}

// screen is the host's own check of one request of a write, before the
// board sees it: it sets the request's fence time (fenceAt) and returns
// the no-op reason of a refusal ("" when admitted).
func (l *Ledger) screenMark(m *sdk.Mark) string {
	at, ok := l.fenceAt(m.At)
	if !ok {
		return sdk.NoopTimeRefused
	}
	l.mu.Lock()
	byReaper := l.byReaper
	l.mu.Unlock()
	if byReaper && m.Confirm {
		return sdk.NoopConfirmRefused
	}
	m.At = at
	return ""
}

// screenAt admits a request whose only choice the host takes back is its
// At (a reconciler's write): it sets the fence time, or returns
// NoopTimeRefused.
func screenAt(l *Ledger, at *time.Time) string {
	t, ok := l.fenceAt(*at)
	if !ok {
		return sdk.NoopTimeRefused
	}
	*at = t
	return ""
}

// screenLabel is the label of the host's refusal of a request it screened
// (screenMark, screenAt).
func screenLabel(noop string) string {
	if noop == sdk.NoopConfirmRefused {
		return sdk.LabelBoardRefusedConfirm
	}
	return sdk.LabelBoardRefusedFenceTime
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

// batch makes one batched write through the ledger: it screens each
// request (screen: the host's own refusal, or "" to send it on with the
// fence time it set), sends the rest to the board, adds the requests that
// applied to *kept, and notes the refusals, the host's and the board's
// (asked gives a refused request's evidence; mark: the requests are marks).
// The answers are the requests', in order.
func batch[R any](ctx context.Context, l *Ledger, what string, reqs []R, attempt func(R) sdk.Attempt,
	asked func(R) map[string]string, mark bool, screen func(*R) string,
	write func(context.Context, []R) ([]sdk.MarkResult, error), kept *[]R) ([]sdk.MarkResult, error) {
	var first sdk.Attempt
	if len(reqs) > 0 {
		first = attempt(reqs[0])
	}
	if err := l.begin(what, len(reqs), first); err != nil {
		return nil, fmt.Errorf("%s (%d): %w", what, len(reqs), err)
	}
	defer l.wg.Done()
	res := make([]sdk.MarkResult, len(reqs))
	sent, at := make([]R, 0, len(reqs)), make([]int, 0, len(reqs))
	var refused []sdk.Decision
	refuse := func(i int, label, noop, detail string) {
		ev := asked(reqs[i])
		ev[EvWrite], ev[EvRefusal] = what, noop
		refused = append(refused, sdk.Decision{Label: label, Attempt: attempt(reqs[i]), Detail: detail, Evidence: ev})
	}
	for i, r := range reqs {
		if noop := screen(&r); noop != "" {
			res[i] = sdk.MarkResult{Attempt: attempt(r), NoopReason: noop}
			refuse(i, screenLabel(noop), noop, "the host refused a write no plugin may make: nothing written")
			continue
		}
		sent, at = append(sent, r), append(at, i)
	}
	// The host's refusals stand whatever becomes of the rest.
	l.mu.Lock()
	l.refuseLocked(refused) // the pass is open: begin admitted the write and Close waits for it
	l.mu.Unlock()
	refused = refused[:0]
	if len(sent) == 0 {
		return res, nil
	}
	wctx, cancel := detached(ctx)
	defer cancel()
	got, err := write(wctx, sent)
	if err != nil {
		return nil, err
	}
	for j, r := range got {
		if j >= len(sent) {
			break
		}
		res[at[j]] = r
		if label, ok := refusalOf(r, mark); ok {
			refuse(at[j], label, r.NoopReason, "the board refused a write no plugin may make: nothing written")
		}
	}
	l.mu.Lock()
	for j, r := range got {
		if r.Applied && j < len(sent) {
			*kept = append(*kept, sent[j])
		}
	}
	l.refuseLocked(refused)
	l.mu.Unlock()
	return res, nil
}

func markAsked(m sdk.Mark) map[string]string {
	return map[string]string{EvMarkKind: string(m.Kind), EvMarkReason: m.Reason,
		EvMarkFrom: strings.Join(m.FromStates, ","), EvConfirm: strconv.FormatBool(m.Confirm), EvAt: atWord(m.At)}
}

func settleAsked(s sdk.Settlement) map[string]string {
	return map[string]string{EvOutcome: string(s.Outcome), EvMarkReason: s.Reason,
		EvMarkFrom: strings.Join(s.FromStates, ","), EvAt: atWord(s.At)}
}

func confirmAsked(c sdk.Confirm) map[string]string { return map[string]string{EvAt: atWord(c.At)} }

func overrideAsked(o sdk.Override) map[string]string { return map[string]string{EvAt: atWord(o.At)} }

// atWord is a write's asked At for its refusal's evidence.
func atWord(at time.Time) string {
	if at.IsZero() {
		return ""
	}
	return at.UTC().Format(time.RFC3339Nano)
}

// Mark applies the marks and keeps those that applied.
func (l *Ledger) Mark(ctx context.Context, marks []sdk.Mark) ([]sdk.MarkResult, error) {
	return batch(ctx, l, "mark attempts", marks, func(m sdk.Mark) sdk.Attempt { return m.Attempt }, markAsked, true,
		l.screenMark, func(ctx context.Context, ms []sdk.Mark) ([]sdk.MarkResult, error) {
			l.confirmDead(ctx, ms) // ms is the ledger's own copy
			return l.Board.Mark(ctx, ms)
		}, &l.marks)
}

// AppendLog appends try log lines while the pass is open; after Close it
// is refused like every other write. Each line is stamped with the host's
// time at the call; a line whose own time is not the pass's refuses the
// whole call.
func (l *Ledger) AppendLog(ctx context.Context, term int64, lines []sdk.LogLine) error {
	const what = "append try log lines"
	var first sdk.Attempt
	if len(lines) > 0 {
		first = lines[0].Attempt
	}
	if err := l.begin(what, len(lines), first); err != nil {
		return fmt.Errorf("append %d try log lines: %w", len(lines), err)
	}
	defer l.wg.Done()
	lines = slices.Clone(lines)
	for i := range lines {
		asked := lines[i].At
		if noop := screenAt(l, &lines[i].At); noop != "" {
			l.refuseOne(what, len(lines), lines[i].Attempt, noop, map[string]string{EvAt: atWord(asked)})
			return fmt.Errorf("append %d try log lines: line %d: %s", len(lines), i, noop)
		}
	}
	wctx, cancel := detached(ctx)
	defer cancel()
	return l.Board.AppendLog(wctx, term, lines)
}

// refuseOne notes the host's refusal of a whole call (what, of n
// requests) about a, with noop's label and ev as its evidence; the pass is
// open (begin admitted the call).
func (l *Ledger) refuseOne(what string, n int, a sdk.Attempt, noop string, ev map[string]string) {
	ev[EvWrite], ev[EvRefusal], ev[EvRequests] = what, noop, strconv.Itoa(n)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refuseLocked([]sdk.Decision{{Label: screenLabel(noop), Attempt: a,
		Detail: "the host refused a write no plugin may make: nothing written", Evidence: ev}})
}

// Settle settles finished attempts and keeps those settled, each under the
// attempt the board settled (a settlement read from a pod that names its
// task only by the lossy label is resolved by the board).
func (l *Ledger) Settle(ctx context.Context, ss []sdk.Settlement) ([]sdk.MarkResult, error) {
	// The ledger's own copy: it is kept under the resolved attempts, never
	// the caller's.
	ss = slices.Clone(ss)
	return batch(ctx, l, "settle attempts", ss, func(s sdk.Settlement) sdk.Attempt { return s.Attempt }, settleAsked, false,
		func(s *sdk.Settlement) string { return screenAt(l, &s.At) },
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
	return batch(ctx, l, "confirm infra marks", cs, func(c sdk.Confirm) sdk.Attempt { return c.Attempt }, confirmAsked, false,
		func(c *sdk.Confirm) string { return screenAt(l, &c.At) }, l.Board.ConfirmInfra, &l.confirmed)
}

// OverrideInfra overrides infra marks and keeps those overridden.
func (l *Ledger) OverrideInfra(ctx context.Context, overrides []sdk.Override) ([]sdk.MarkResult, error) {
	return batch(ctx, l, "override infra marks", overrides, func(o sdk.Override) sdk.Attempt { return o.Attempt }, overrideAsked, false,
		func(o *sdk.Override) string { return screenAt(l, &o.At) }, l.Board.OverrideInfra, &l.overrides)
}

// RecordPodSightings records the pod cache's history while the pass is
// open; after Close it is refused like every other write. Nothing of it is
// kept: it is history, no write a decision covers.
func (l *Ledger) RecordPodSightings(ctx context.Context, ss []sdk.PodSighting) ([]sdk.MarkResult, error) {
	var applied []sdk.PodSighting // dropped with the call
	return batch(ctx, l, "record pod sightings", ss, func(s sdk.PodSighting) sdk.Attempt { return s.Attempt },
		func(s sdk.PodSighting) map[string]string { return map[string]string{EvAt: atWord(s.At)} }, false,
		func(s *sdk.PodSighting) string { return screenAt(l, &s.At) }, l.Board.RecordPodSightings, &applied)
}

// ReapRun reaps the run and keeps the reap if it applied.
func (l *Ledger) ReapRun(ctx context.Context, r sdk.RunReap) (sdk.RunReapResult, error) {
	const what = "reap a run"
	if err := l.begin(what, 1, sdk.Attempt{RunID: r.RunID}); err != nil {
		return sdk.RunReapResult{}, fmt.Errorf("reap run %s: %w", r.RunID, err)
	}
	defer l.wg.Done()
	asked := r.At
	if noop := screenAt(l, &r.At); noop != "" {
		l.refuseOne(what, 1, sdk.Attempt{RunID: r.RunID}, noop, map[string]string{EvAt: atWord(asked)})
		return sdk.RunReapResult{NoopReason: noop}, nil
	}
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
	// EvAt is the At the plugin asked a write to be fenced at (RFC 3339;
	// "" for none): the host fences at its own clock.
	EvAt = "asked_at"
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
		if label == "" || (l.allowed != nil && !l.allowed[label]) {
			// A mark must name its reason, one its plugin declared (the
			// label it is metered and audited under); this one did not.
			label = sdk.LabelPassError
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

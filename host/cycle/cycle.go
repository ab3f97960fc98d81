// Package cycle is reaperd's maintenance loop: every interval, on the leader
// only, the reconcile phase (the substrate's sweep) and then the reap phase
// (each configured reaper in order), each phase under its own budget of one
// interval, behind the leader-settling gate. Every decision of every pass,
// and of the gate, is metered, logged and audited through the host's one
// decision pipeline (host/audit.Pipeline). The retries of the
// teardowns still owed (host/owed), the shadow scorer (host/shadow) and the
// retentions (host/prune) are leader components of their own, beside the
// loop.
package cycle

import (
	"context"
	"errors"
	"fmt"
	"github.com/dexaflow/reaper/sdk/plugin"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/host/audit"
	"github.com/dexaflow/reaper/host/gate"
	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/host/metrics"
	"github.com/dexaflow/reaper/internal/testsignal"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// Leadership tells whether this replica leads at a moment.
type Leadership interface {
	Status(now time.Time) leader.Status
}

// Auditor keeps decision audit rows.
type Auditor = audit.Writer

// MarkFinder finds the reapers' writes that the board shows with no
// applied decision in the audit (board.Store). An Auditor that is one too
// lets the loop audit, once a term, what a leader that died between its
// writes and their audit left behind.
// declared adds the failure reasons the configured reapers' Info declares
// (those markSearchable admits) to the built-in ones.
type MarkFinder interface {
	UnauditedMarks(ctx context.Context, since time.Time, declared ...string) ([]board.UnauditedMark, error)
}

// Owing wraps a pass's executions under term so that its teardowns that
// do not complete are owed (host/owed.Service).
type Owing interface {
	Wrap(exec sdk.Executions, reaper string, term int64) sdk.Executions
}

// Supervised hands out a plugin that may have to be (re)started.
type Supervised[T any] interface {
	// Get returns the running plugin, restarting it first when it exited
	// (subject to the supervisor's backoff).
	Get(ctx context.Context, now time.Time) (T, error)
	// Down reports whether the plugin process has exited.
	Down() bool
	// Recycle stops a plugin that misbehaved (a pass that outlived its
	// budget may still be running inside it), so that the next Get starts
	// a fresh one. A no-op for an in-process plugin.
	Recycle()
}

// Reaper is one configured reaper.
type Reaper struct {
	Name   string
	DryRun bool
	Plugin Supervised[sdk.Reaper]
	// MarkReasons are the failure reasons its writes leave on the board
	// (its Info's): a write found there without its decision is audited
	// under its name.
	MarkReasons []string
	// Labels are the decision labels its Info declared when it was
	// launched (sdk.Info.DecisionLabels). The loop meters and audits its
	// decisions only under these, its MarkReasons and sdk.CommonLabels,
	// and refuses any other (sdk.LabelBoardRefusedUndeclaredLabel).
	Labels []string
}

// Config configures the loop.
type Config struct {
	Ladder  ladder.Ladder // the interval is Ladder.MaintenanceInterval
	Edition string
	DryRun  bool // the global dry-run (applies to the sweep)
	Clock   clock.Clock
	Logger  hclog.Logger
	Metrics *metrics.Metrics
	// Owed wraps the executions of every pass that is no dry run, so that
	// a teardown that did not complete is owed (host/owed); nil: a failed
	// teardown is only its reaper's decision, and nothing is retried.
	Owed Owing
	// SubstrateLabels are the decision labels the substrate's Info
	// declared when it was launched: its sweep's decisions are taken under
	// these, sdk.SweepLabels and sdk.CommonLabels only.
	SubstrateLabels []string
	// Decisions is the host's decision pipeline (host/audit), shared with
	// its other producers: every decision of the loop is metered, logged,
	// audited and retried there. nil: the loop's own, over its Auditor,
	// Metrics and Logger.
	Decisions *audit.Pipeline
}

// withDefaults fills in every default: the one place the loop's defaults
// are decided.
func (c Config) withDefaults() Config {
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.Metrics == nil {
		c.Metrics = metrics.New()
	}
	return c
}

// Loop is the maintenance loop.
type Loop struct {
	cfg       Config
	lead      Leadership
	board     sdk.Board
	audit     Auditor
	substrate Supervised[sdk.Substrate]
	reapers   []Reaper
	gate      *gate.Gate

	mu       sync.Mutex
	states   map[string][]byte // each reaper's opaque state between passes
	lastTick time.Time
	term     int64
	since    time.Time
	checked  int64 // the term whose board was checked for unaudited marks

	// decisions meters, logs and audits the loop's decisions, and keeps
	// what a write failed to put in the audit, writing it again at the
	// next cycle.
	decisions *audit.Pipeline
	// searchable are the reapers' declared mark reasons the board is
	// searched for, beside the built-in ones (searchableReasons).
	searchable []string
	// allowed are the labels each reaper's decisions may carry, by name
	// (sdk.AllowedLabels of its declaration); sweepAllowed, the sweep's.
	allowed      map[string]map[string]bool
	sweepAllowed map[string]bool
	// marks are the failure reasons an override may be metered under:
	// the built-in mark reasons and the reapers' declared ones.
	marks map[string]bool

	// TestSignals are for tests; production leaves them alone.
	TestSignals TestSignals
}

// TestSignals are the points a test can wait for (internal/testsignal).
type TestSignals struct {
	// Cycled carries the start of every cycle once it ended.
	Cycled testsignal.TestSignal[time.Time]
}

// Init makes every signal record (tests only).
func (s *TestSignals) Init(tb testsignal.TB) { s.Cycled.Init(tb) }

// New returns a loop.
func New(cfg Config, lead Leadership, board sdk.Board, auditor Auditor, substrate Supervised[sdk.Substrate], reapers []Reaper) *Loop {
	cfg = cfg.withDefaults()
	l := &Loop{
		cfg: cfg, lead: lead, board: board, audit: auditor, substrate: substrate, reapers: reapers,
		decisions: pipeline(cfg, auditor), searchable: searchableReasons(reapers, cfg.Logger),
		gate: gate.New(cfg.Ladder.SettlingGrace), states: map[string][]byte{},
		allowed: map[string]map[string]bool{},
	}
	for _, r := range reapers {
		declared := sdk.Info{DecisionLabels: r.Labels, MarkReasons: r.MarkReasons}
		if err := sdk.CheckDeclared(declared); err != nil {
			cfg.Logger.Warn("a reaper's declared labels are refused: only the sdk's common labels are taken from it",
				"reaper", r.Name, "error", err)
		}
		l.allowed[r.Name] = sdk.AllowedLabels(declared)
	}
	l.sweepAllowed = sdk.AllowedLabels(sdk.Info{DecisionLabels: cfg.SubstrateLabels})
	for _, s := range sdk.SweepLabels() {
		l.sweepAllowed[s] = true
	}
	l.marks = knownMarks(reapers)
	return l
}

// pipeline is the loop's view of the host's decision pipeline, logging to
// the loop's logger: cfg's, or one of its own over auditor.
func pipeline(cfg Config, auditor Auditor) *audit.Pipeline {
	if cfg.Decisions != nil {
		return cfg.Decisions.With(cfg.Logger)
	}
	return audit.NewPipeline(auditor, cfg.Metrics, cfg.Logger)
}

// ResultDecisions is how many of a cycle's decisions its Result keeps: a
// mass recovery's are metered, logged and audited, not all held.
const ResultDecisions = 1000

// Result reports one cycle, for tests and logs.
type Result struct {
	Started time.Time
	Leading bool
	Term    int64
	Swept   bool
	Gate    gate.Verdict
	Reaped  []string // reapers whose pass ran
	// Decisions are the cycle's first ResultDecisions decisions, in the
	// order noted; DecisionCount counts them all.
	Decisions     []sdk.Decision
	DecisionCount int
	Overruns      []string // phases that overran their budget
}

// LastTick is when the loop last started a cycle (zero before the first).
func (l *Loop) LastTick() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastTick
}

// NeedsLeadership is true: the loop's passes write under the elector's
// term, so the host stops it before the elector resigns.
func (l *Loop) NeedsLeadership() bool { return true }

// Run runs a cycle every interval until ctx is done, then returns nil.
// Ticks that fall due while a cycle is still running are coalesced into
// one.
func (l *Loop) Run(ctx context.Context) error {
	tk := l.cfg.Clock.NewTicker(l.cfg.Ladder.MaintenanceInterval)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			// A last try for what the audit still lacks.
			l.decisions.Retry(context.WithoutCancel(ctx))
			return nil
		case <-tk.C():
			l.RunOnce(ctx)
		}
	}
}

// RunOnce runs one cycle now.
func (l *Loop) RunOnce(ctx context.Context) (res Result) {
	now := l.cfg.Clock.Now()
	l.mu.Lock()
	l.lastTick = now
	l.mu.Unlock()
	l.cfg.Metrics.Cycle(now)

	res = Result{Started: now}
	defer l.TestSignals.Cycled.Signal(now)
	l.decisions.Retry(ctx)
	st := l.lead.Status(now)
	l.cfg.Metrics.Leader(st.Leading, st.Term)
	if !st.Leading {
		return res
	}
	res.Leading, res.Term = true, st.Term
	if st.Term != l.term || !st.Since.Equal(l.since) {
		l.term, l.since = st.Term, st.Since
		l.gate.Lead(st.Term, st.Since)
		l.cfg.Logger.Info("leading: the settling gate starts", "term", st.Term, "grace", l.cfg.Ladder.SettlingGrace)
	}

	sub, subErr := l.substrate.Get(ctx, now)
	res.Swept = l.reconcile(ctx, st.Term, sub, subErr, &res)
	if ctx.Err() != nil {
		return res
	}
	synced := false
	if subErr == nil {
		var err error
		synced, err = sub.Synced(ctx)
		if err != nil {
			l.cfg.Logger.Warn("substrate could not say whether it is synced", "error", err)
			synced = false
		}
	}
	now = l.cfg.Clock.Now()
	v := l.gate.Check(now, synced)
	res.Gate = v
	if v.Label != "" {
		d := sdk.Decision{Reaper: "gate", Label: v.Label, Detail: "waiting for: " + joinWaiting(v.Waiting),
			Evidence: map[string]string{"since_leadership": ladder.Format(v.Since.Truncate(time.Second)),
				"grace": ladder.Format(l.cfg.Ladder.SettlingGrace), "term": strconv.FormatInt(st.Term, 10)}}
		if v.Valve {
			l.cfg.Logger.Warn("settling valve open: reaping although the leader has not settled",
				"waiting_for", v.Waiting, "since_leadership", v.Since, "term", st.Term)
		}
		l.record(ctx, st.Term, now, []sdk.Decision{d}, &res)
	}
	if !v.Open {
		return res
	}
	l.recoverMarks(ctx, st.Term, st.Since, &res)
	l.reap(ctx, st.Term, sub, subErr, &res)
	return res
}

func joinWaiting(w []string) string {
	out := ""
	for i, s := range w {
		if i > 0 {
			out += ", "
		}
		out += s
	}
	return out
}

// reconcile runs the sweep under its budget and reports whether it
// completed.
func (l *Loop) reconcile(ctx context.Context, term int64, sub sdk.Substrate, subErr error, res *Result) bool {
	budget := l.cfg.Ladder.MaintenanceInterval
	start := l.cfg.Clock.Now()
	if subErr != nil {
		l.cfg.Logger.Error("substrate unavailable: no reconcile sweep this cycle", "error", subErr)
		l.record(ctx, term, start, []sdk.Decision{{Reaper: "substrate", Label: sdk.LabelPluginUnavailable,
			Detail: subErr.Error()}}, res)
		return false
	}
	pctx, cancel := clock.WithTimeout(ctx, l.cfg.Clock, budget)
	// The sweep's writes go through a ledger too: its decisions come back
	// only with its result, so a sweep cut off after a write would
	// otherwise leave the write unaudited.
	sweep := l.decisions.NewPass(ctx, l.boardFor(l.cfg.DryRun), audit.PassSpec{Term: term, At: start,
		Name: "substrate", DryRun: l.cfg.DryRun})
	ledger := sweep.Ledger
	ledger.Guard(l.cfg.Clock, start, false, nil)
	sw, err := sub.Sweep(pctx, sdk.SweepRequest{Now: start, Term: term, DryRun: l.cfg.DryRun, Ladder: l.cfg.Ladder}, ledger)
	overran := pctx.Err() != nil && ctx.Err() == nil
	sweep.Finish()
	l.refusals(ctx, term, start, sweep.Refusals(), res)
	if plugin.IsReplyTooLarge(err) {
		l.tooLarge(ctx, term, start, "substrate", l.cfg.DryRun, err, res)
	}
	var reported []sdk.Decision
	if err == nil {
		reported = sw.Decisions
	}
	if lost := ledger.Unaudited("substrate", reported, passEnd(pctx, err)); len(lost) > 0 {
		l.cfg.Logger.Warn("applied sweep writes whose decisions never arrived: audited by the host", "count", len(lost), "error", err)
		defer l.record(ctx, term, start, lost, res)
	}
	cancel()
	elapsed := l.cfg.Clock.Now().Sub(start)
	overran = overran || elapsed > budget
	l.cfg.Metrics.Phase("reconcile", elapsed, overran)
	if overran {
		res.Overruns = append(res.Overruns, "reconcile")
		l.cfg.Logger.Warn("reconcile phase overran its budget", "budget", budget, "elapsed", elapsed)
	}
	if err != nil {
		if !overran && ctx.Err() == nil {
			l.cfg.Logger.Error("reconcile sweep failed", "error", err)
		}
		return false
	}
	for mark, n := range sw.Overrides {
		if !l.marks[mark] {
			// The substrate's word is a metric label: only a known mark's.
			l.cfg.Logger.Warn("the sweep counted overrides of a mark no reaper declared: metered under "+
				overrideUndeclared, "mark", fmt.Sprintf("%.80q", mark), "count", n)
			mark = overrideUndeclared
		}
		l.cfg.Metrics.Override(mark, n)
	}
	l.record(ctx, term, start, l.decisions.Screened("substrate", audit.Screen(sw.Decisions, "substrate", l.sweepAllowed, l.cfg.DryRun)), res)
	l.gate.Swept(term)
	return true
}

// reap runs each reaper in order under the phase's budget of one interval.
// Each pass gets a fair share of what is left of it — the remaining time
// divided by the reapers still to run — so a reaper that hangs costs only
// its share, never the passes after it; time a pass leaves unused goes to
// the ones after it.
func (l *Loop) reap(ctx context.Context, term int64, sub sdk.Substrate, subErr error, res *Result) {
	budget := l.cfg.Ladder.MaintenanceInterval
	start := l.cfg.Clock.Now()
	end := start.Add(budget)
	pctx, cancel := clock.WithTimeout(ctx, l.cfg.Clock, budget)
	defer cancel()
	var exec sdk.Executions
	if subErr == nil {
		exec = sub
	}
	for i, r := range l.reapers {
		now := l.cfg.Clock.Now()
		if pctx.Err() != nil || !now.Before(end) {
			break
		}
		if st := l.lead.Status(now); !st.Leading || st.Term != term {
			l.cfg.Logger.Warn("leadership lost mid-cycle: the remaining reapers wait", "term", term)
			break
		}
		share := end.Sub(now) / time.Duration(len(l.reapers)-i)
		l.pass(pctx, term, r, exec, now, share, res)
	}
	elapsed := l.cfg.Clock.Now().Sub(start)
	overran := (pctx.Err() != nil && ctx.Err() == nil) || elapsed > budget
	l.cfg.Metrics.Phase("reap", elapsed, overran)
	if overran {
		res.Overruns = append(res.Overruns, "reap")
		l.cfg.Logger.Warn("reap phase overran its budget", "budget", budget, "elapsed", elapsed)
	}
}

func (l *Loop) pass(phase context.Context, term int64, r Reaper, exec sdk.Executions, now time.Time, share time.Duration, res *Result) {
	dry := r.DryRun || l.cfg.DryRun
	unavailable := func(err error) {
		l.cfg.Logger.Error("reaper unavailable this cycle", "reaper", r.Name, "error", err)
		l.record(phase, term, now, []sdk.Decision{{Reaper: r.Name, Label: sdk.LabelPluginUnavailable, DryRun: dry,
			Detail: err.Error()}}, res)
	}
	if exec == nil {
		unavailable(errors.New("the substrate is unavailable"))
		return
	}
	rp, err := l.plugin(phase, r, now)
	if err != nil {
		unavailable(err)
		return
	}
	// The share counts from here: a plugin (re)started above had a bound of
	// its own, and its start is not the pass's time.
	passStart := l.cfg.Clock.Now()
	ctx, cancel := clock.WithTimeout(phase, l.cfg.Clock, share)
	defer cancel()
	deadline := passStart.Add(share)
	substrate := exec // the substrate itself, before the pass's wrappers
	if dry {
		exec = dryRunExecutions{exec}
	} else if l.cfg.Owed != nil {
		exec = l.cfg.Owed.Wrap(exec, r.Name, term)
	}
	l.mu.Lock()
	state := l.states[r.Name]
	l.mu.Unlock()
	edge := l.edge(ctx, term, r.Name, now, dry, substrate, res)
	pr, err := rp.Reap(ctx, sdk.Pass{
		Now: now, Ladder: l.cfg.Ladder, Term: term, DryRun: dry, Deadline: deadline,
		State: state, Edition: l.cfg.Edition,
	}, edge.Ledger, exec, edge.Sink)
	elapsed := l.cfg.Clock.Now().Sub(passStart)
	l.cfg.Metrics.Pass(r.Name, elapsed)
	// The pass is done once its audit is written; what failed to be is the
	// pipeline's to write at the next cycle.
	edge.Finish()
	kept, count := edge.Decisions()
	res.DecisionCount += count - len(kept)
	l.keep(kept, res)
	l.refusals(ctx, term, now, edge.Refusals(), res)
	if lost := edge.Ledger.Unaudited(r.Name, nil, passEnd(ctx, err)); len(lost) > 0 {
		l.cfg.Logger.Warn("applied writes whose decisions never arrived: audited by the host",
			"reaper", r.Name, "count", len(lost), "error", err)
		l.record(ctx, term, now, lost, res)
	}
	if err != nil {
		// What the reaper decided before the error is kept (over gRPC
		// too: the decisions travel ahead of the error), and so is the
		// state it handed back, if any: what it owes its next pass (an
		// orphan stop in flight, a kill line) must not be lost with it.
		if pr.State != nil {
			l.mu.Lock()
			l.states[r.Name] = pr.State
			l.mu.Unlock()
		}
		// Its share ran out (the phase's own deadline included), as
		// opposed to the loop shutting down: the plugin may still be busy.
		if errors.Is(context.Cause(ctx), context.DeadlineExceeded) || elapsed > share {
			l.cfg.Logger.Warn("reaper pass outlived its share of the reap budget: restarting the plugin",
				"reaper", r.Name, "share", share, "elapsed", elapsed)
			r.Plugin.Recycle()
			unavailable(fmt.Errorf("the pass outlived its share of the budget (%s): %w", share, err))
			return
		}
		if r.Plugin.Down() || plugin.IsUnavailable(err) {
			unavailable(err)
			return
		}
		if plugin.IsReplyTooLarge(err) {
			l.tooLarge(ctx, term, now, r.Name, dry, err, res)
			return
		}
		l.cfg.Logger.Error("reaper pass failed", "reaper", r.Name, "error", err)
		l.record(ctx, term, now, []sdk.Decision{{Reaper: r.Name, Label: sdk.LabelPassError, DryRun: dry,
			Detail: err.Error()}}, res)
		return
	}
	res.Reaped = append(res.Reaped, r.Name)
	l.mu.Lock()
	l.states[r.Name] = pr.State
	l.mu.Unlock()
}

// edge starts the host's edge of a pass of the named reaper (audit.Pass):
// its sink and its ledger, between the plugin and the audit and the board.
// The pass's decisions are audited as they arrive, beside the pass, and
// each batch is metered, logged and covered in the ledger once written,
// then let go (but for what the cycle's result still has room for): a mass
// recovery's decisions are never all held. Its writes go through the
// ledger, so that a write that applied and whose decision never arrives is
// audited all the same. The host, not the plugin, says whose decisions
// they are, which labels they may carry, when its writes are fenced and
// whether its marks are confirmed as they are made.
func (l *Loop) edge(ctx context.Context, term int64, name string, now time.Time, dry bool,
	substrate sdk.Executions, res *Result) *audit.Pass {
	edge := l.decisions.NewPass(ctx, l.boardFor(dry), audit.PassSpec{Term: term, At: now, Name: name, DryRun: dry,
		Allowed: l.allowed[name], Keep: ResultDecisions - len(res.Decisions)})
	edge.Ledger.Guard(l.cfg.Clock, now, true, l.allowed[name])
	if l.cfg.Edition == ladder.EditionLite {
		// No sweep reads an outcome on Lite: the host confirms an infra
		// mark as made when the substrate reads its attempt dead.
		edge.Ledger.ConfirmDead(substrate)
	}
	return edge
}

// refusals records the writes the board or the host refused a pass's
// plugin (audit.Ledger.Refusals), said at WARN by the pipeline.
func (l *Loop) refusals(ctx context.Context, term int64, at time.Time, ds []sdk.Decision, res *Result) {
	if len(ds) == 0 {
		return
	}
	l.keep(ds, res)
	l.decisions.Refused(ctx, term, at, ds)
}

// knownMarks is the failure reasons an override may be metered under: the
// built-in mark reasons and those the reapers declared (words only).
func knownMarks(reapers []Reaper) map[string]bool {
	out := map[string]bool{}
	for _, m := range board.MarkReasons {
		out[m] = true
	}
	for _, r := range reapers {
		for _, m := range r.MarkReasons {
			out[m] = out[m] || sdk.LabelWord(m)
		}
	}
	return out
}

// overrideUndeclared is the mark label an override of an undeclared mark
// is metered under.
const overrideUndeclared = "undeclared"

// tooLarge records a plugin reply the host refused for its size: the pass
// (or the sweep) goes on without it; what it wrote before is in the
// ledger, and audited by the host if its decisions never came.
func (l *Loop) tooLarge(ctx context.Context, term int64, at time.Time, name string, dry bool, err error, res *Result) {
	l.cfg.Logger.Warn("a plugin's reply was larger than the host accepts: refused, the cycle goes on without it",
		"plugin", name, "error", err)
	l.record(ctx, term, at, []sdk.Decision{{Reaper: name, Label: sdk.LabelPluginReplyTooLarge, DryRun: dry,
		Detail: err.Error()}}, res)
}

// passEnd says, for the audit, how a pass ended.
func passEnd(ctx context.Context, err error) string {
	switch {
	case errors.Is(context.Cause(ctx), context.DeadlineExceeded):
		return "the pass was cut off at the end of its share of the budget"
	case ctx.Err() != nil:
		return "the pass was stopped with the loop"
	case err != nil:
		return "the pass failed: " + err.Error()
	}
	return "the pass did not record it"
}

// RecoverWindow is how far before its term began a new leader looks on the
// board for reapers' writes left unaudited (a leader killed between its
// marks and their audit).
const RecoverWindow = time.Hour

// recoverMarks audits, once a term, the writes the board shows without an
// applied decision: what a leader that died (kill -9, OOM) between its
// writes and their audit left behind. A mark is told apart from anything
// else by its failure reason, a reconciler's write by the label the board
// keeps with it (reconciled_as); an attempt released since (retried,
// re-placed) is found in its history. It runs when the gate first opens,
// so that a deposed leader still alive has long written its own audit, and
// before this term's first reap.
func (l *Loop) recoverMarks(ctx context.Context, term int64, since time.Time, res *Result) {
	finder, ok := l.audit.(MarkFinder)
	if !ok || l.checked == term {
		return
	}
	marks, err := finder.UnauditedMarks(ctx, since.Add(-RecoverWindow), l.searchable...)
	if err != nil {
		l.cfg.Logger.Warn("could not check the board for unaudited marks: next cycle", "error", err)
		return
	}
	l.checked = term
	if len(marks) == 0 {
		return
	}
	l.cfg.Logger.Warn("marks on the board without their decision: audited from the board", "count", len(marks), "term", term)
	// Each is audited at the time of its write (a pass's marks share it).
	byAt := map[time.Time][]sdk.Decision{}
	var ats []time.Time
	for _, m := range marks {
		if _, ok := byAt[m.At]; !ok {
			ats = append(ats, m.At)
		}
		reaper := l.reaperOf(m.Reason)
		if m.Reconciled {
			reaper = "substrate" // the sweep's decisions are filed under it
		}
		byAt[m.At] = append(byAt[m.At], sdk.Decision{Reaper: reaper, Label: m.Reason, Attempt: m.Attempt,
			Applied: true, Detail: "found on the board without its decision (its leader stopped between the write " +
				"and its audit): audited by the host from the row",
			Evidence: map[string]string{audit.EvRecovered: "board", audit.EvMessage: m.Message}})
	}
	for _, at := range ats {
		l.record(ctx, term, at, byAt[at], res)
	}
}

// markSearchable reports whether the board may be searched for rows
// failed with reason as a reaper's mark: a built-in mark reason, or a
// plugin's own word (lowercase, digits and underscores, at most 64 bytes)
// that is none of the labels and reasons the host, the reconciler and the
// runners write themselves. A plugin that declared one of those (say
// reconcile_settled, or credential_ceiling, which a warm worker's watchdog
// reports too) would have the host audit rows it never wrote as its marks.
func markSearchable(reason string) bool {
	if slices.Contains(board.MarkReasons, reason) {
		return true
	}
	if reason == "" || len(reason) > 64 || reason[0] < 'a' || reason[0] > 'z' {
		return false
	}
	for _, c := range reason {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return !slices.Contains(sdk.Labels(), reason) && reason != sdk.ReasonPodDisrupted &&
		reason != sdk.ReasonControlPlaneUnavailable
}

// searchableReasons is the declared mark reasons of reapers the board is
// searched for (markSearchable), each once. A word the host writes itself
// is filed by its reaper but not searched for (agentlost declares
// credential_ceiling, which a warm worker's watchdog reports too); a word
// no reason can be is logged.
func searchableReasons(reapers []Reaper, log hclog.Logger) []string {
	var out []string
	for _, r := range reapers {
		for _, reason := range r.MarkReasons {
			switch {
			case slices.Contains(out, reason) || slices.Contains(board.MarkReasons, reason):
			case markSearchable(reason):
				out = append(out, reason)
			case slices.Contains(sdk.Labels(), reason):
				log.Debug("a reaper declares a mark reason the host writes too: filed under it, not searched for on the board",
					"reaper", r.Name, "reason", reason)
			default:
				log.Warn("a reaper declares a mark reason no failure reason can be: ignored",
					"reaper", r.Name, "reason", reason)
			}
		}
	}
	return out
}

// reaperOf names the reaper whose Info declares the failure reason among
// those its writes leave, the first in the configured order; "host" when
// none does.
func (l *Loop) reaperOf(reason string) string {
	for _, r := range l.reapers {
		if slices.Contains(r.MarkReasons, reason) {
			return r.Name
		}
	}
	return "host"
}

// PluginStartTimeout bounds a plugin's (re)start before its pass: the
// process, the handshake and its configuration. It is its own bound, not
// the pass's share: a share of a short interval is far less than a process
// needs to start on a loaded host, and a restart that could never finish
// inside it would leave the plugin down for good.
const PluginStartTimeout = 10 * time.Second

// plugin returns the reaper's plugin, (re)starting it if it is down, under
// PluginStartTimeout; a stop of the loop still cuts a start short.
func (l *Loop) plugin(phase context.Context, r Reaper, now time.Time) (sdk.Reaper, error) {
	ctx, cancel := clock.WithTimeout(context.WithoutCancel(phase), l.cfg.Clock, PluginStartTimeout)
	defer cancel()
	stop := context.AfterFunc(phase, func() {
		if !errors.Is(phase.Err(), context.DeadlineExceeded) {
			cancel() // the loop is stopping, not merely out of budget
		}
	})
	defer stop()
	return r.Plugin.Get(ctx, now)
}

func (l *Loop) boardFor(dry bool) sdk.Board {
	if dry {
		return dryRunBoard{l.board}
	}
	return l.board
}

// record meters, logs and audits decisions through the pipeline, and adds
// them to the cycle's result. The audit is one batch per call; an audit
// failure is logged, never fatal to the cycle: the pipeline keeps what
// failed for the next cycle.
func (l *Loop) record(ctx context.Context, term int64, at time.Time, ds []sdk.Decision, res *Result) {
	if len(ds) == 0 {
		return
	}
	l.keep(ds, res)
	l.decisions.Record(ctx, term, at, ds)
}

// keep adds decisions to the cycle's result (its first ResultDecisions).
func (l *Loop) keep(ds []sdk.Decision, res *Result) {
	res.DecisionCount += len(ds)
	if room := ResultDecisions - len(res.Decisions); room > 0 {
		res.Decisions = append(res.Decisions, ds[:min(room, len(ds))]...)
	}
}

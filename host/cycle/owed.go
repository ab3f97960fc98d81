package cycle

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/reap"
)

// Teardowns owed until done.
//
// A reaper tears down what it reaped once its mark is on the board. The
// executions the host hands each (non-dry-run) pass are wrapped so that a
// teardown that does not complete is written to the board (owed_teardowns):
// the whole call failed, or an object's outcome carries an error other than
// "it was gone". The reaper's own *_pod_delete_error decision meters the
// first failure; the row is the memory. Each cycle the leader tries the
// owed teardowns that are due again, through the substrate, after the reap
// phase and under a budget of its own (OwedBudget), so that they never
// take time from the sweep or the reapers. A retry that completes removes
// the row (reap_teardown_retried); one that fails again is its reaper's
// *_pod_delete_error decision, and the row's next try backs off. A mark is
// never touched.

// OwedTeardowns is the board's memory of teardowns that did not complete
// (board.Store).
type OwedTeardowns interface {
	OweTeardown(ctx context.Context, f board.TeardownFailure, b board.TeardownBackoff) (board.OwedTeardown, error)
	DueTeardowns(ctx context.Context, term int64, now time.Time, limit int) ([]board.OwedTeardown, error)
	TeardownDone(ctx context.Context, id, term int64, now time.Time) (bool, error)
	TeardownFailed(ctx context.Context, id, term int64, now time.Time, failure string, b board.TeardownBackoff) (board.OwedTeardown, error)
	OwedTeardownCount(ctx context.Context) (int, error)
}

// Defaults of the owed teardowns' retries.
const (
	// OwedBackoffCapDefault is the longest wait between two tries of an
	// owed teardown (Config.TeardownBackoff.Cap's default); the first wait
	// is one interval.
	OwedBackoffCapDefault = 5 * time.Minute
	// OwedPage is the most owed teardowns a cycle tries again; the rest
	// (the longest due first) wait for the next cycle.
	OwedPage = 100
	// MaxUnrecorded bounds the failed teardowns kept in memory while the
	// board cannot record them.
	MaxUnrecorded = 10_000
	// owedWriteTimeout bounds the write of one owed teardown from inside a
	// pass (its share may be spent: the write outlives it).
	owedWriteTimeout = 5 * time.Second
)

// OwedBudget is the time a cycle gives the retries of owed teardowns: a
// quarter of the interval. They run after the reap phase, so an overrun
// delays the next cycle a little (its ticks are coalesced) and never takes
// from the sweep's or the reapers' budgets.
func OwedBudget(interval time.Duration) time.Duration { return interval / 4 }

// teardownOwed classifies a teardown: it is owed (not complete) when the
// whole call failed, or when an object's outcome carries an error that is
// not sdk.TeardownGone's. Stopped in place, deleted (the fallback too),
// skipped as terminal, nothing found, and gone are complete. why says what
// failed.
func teardownOwed(out []sdk.TeardownOutcome, err error) (why string, owed bool) {
	if err != nil {
		return err.Error(), true
	}
	var parts []string
	for _, o := range out {
		if o.Incomplete() {
			parts = append(parts, o.Object+": "+o.Error)
		}
	}
	return strings.Join(parts, "; "), len(parts) > 0
}

// deleteErrLabel is the *_pod_delete_error label a failed teardown of
// reaper's, for reason, is metered under: the reaper's own by its mark (or
// by its name), reap_teardown_owed_error for a reaper that has none.
func deleteErrLabel(reaper, reason string) string {
	switch reason {
	case sdk.LabelAgentLost, sdk.LabelCredentialCeiling:
		return sdk.LabelAgentLostPodDeleteErr
	case sdk.LabelDispatchLost, sdk.LabelStartExpired:
		return sdk.LabelDispatchLostPodDeleteErr
	case sdk.LabelPodLost:
		return sdk.LabelPodLostPodDeleteErr
	case sdk.LabelOrphanRun:
		return sdk.LabelOrphanRunPodDeleteErr
	}
	switch reaper {
	case "agentlost":
		return sdk.LabelAgentLostPodDeleteErr
	case "dispatchlost":
		return sdk.LabelDispatchLostPodDeleteErr
	case "podlost":
		return sdk.LabelPodLostPodDeleteErr
	case "orphanrun":
		return sdk.LabelOrphanRunPodDeleteErr
	}
	return sdk.LabelTeardownOwedError
}

// owing is the memory of failed teardowns between the passes that fail
// them and the board: what the board could not record yet.
type owing struct {
	mu         sync.Mutex
	unrecorded []board.TeardownFailure
}

func (o *owing) keep(f board.TeardownFailure) (dropped bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.unrecorded = append(o.unrecorded, f)
	if len(o.unrecorded) > MaxUnrecorded {
		o.unrecorded = o.unrecorded[1:]
		return true
	}
	return false
}

func (o *owing) take() []board.TeardownFailure {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := o.unrecorded
	o.unrecorded = nil
	return out
}

func (o *owing) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.unrecorded)
}

// owingExecutions records every teardown of a pass that does not complete.
type owingExecutions struct {
	sdk.Executions
	l      *Loop
	reaper string
	term   int64
}

// owingFeed is owingExecutions over executions that serve the change feed,
// so that the feed stays visible to the reaper.
type owingFeed struct {
	owingExecutions
	sdk.ChangeFeed
}

// owingFor wraps exec for reaper's pass under term.
func (l *Loop) owingFor(exec sdk.Executions, reaper string, term int64) sdk.Executions {
	o := owingExecutions{Executions: exec, l: l, reaper: reaper, term: term}
	if feed, ok := exec.(sdk.ChangeFeed); ok {
		return owingFeed{owingExecutions: o, ChangeFeed: feed}
	}
	return o
}

func (e owingExecutions) Teardown(ctx context.Context, req sdk.TeardownRequest) ([]sdk.TeardownOutcome, error) {
	out, err := e.Executions.Teardown(ctx, req)
	if why, owed := teardownOwed(out, err); owed {
		e.l.oweTeardown(ctx, e.reaper, e.term, req, why)
	}
	return out, err
}

// oweTeardown writes one failed teardown to the board, or keeps it for
// the next cycle when the board cannot take it.
func (l *Loop) oweTeardown(ctx context.Context, reaper string, term int64, req sdk.TeardownRequest, why string) {
	f := board.TeardownFailure{Reaper: reaper, Label: deleteErrLabel(reaper, req.Reason), Reason: req.Reason,
		Error: why, At: l.cfg.Clock.Now(), Term: term}
	switch {
	case req.Attempt != nil:
		a := *req.Attempt
		f.RunID, f.Attempt = a.RunID, &a
	case req.RunID != "":
		f.RunID = req.RunID
	default:
		return // a request the substrate refused outright: there is nothing to retry
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), owedWriteTimeout)
	defer cancel()
	o, err := l.cfg.Owed.OweTeardown(wctx, f, l.cfg.TeardownBackoff)
	if err != nil {
		l.cfg.Logger.Warn("could not record an owed teardown: kept for the next cycle", "reaper", reaper,
			"what", subjectOf(f), "error", err)
		if l.owing.keep(f) {
			l.cfg.Logger.Error("owed teardowns kept past the bound: the oldest given up", "bound", MaxUnrecorded)
		}
		return
	}
	l.cfg.Logger.Warn("teardown did not complete: owed, retried from a later cycle", "reaper", reaper,
		"what", o.Subject(), "tries", o.Tries, "next_try_at", o.NextTryAt, "error", why)
}

func subjectOf(f board.TeardownFailure) string {
	if f.Attempt != nil {
		return f.Attempt.String()
	}
	return "run " + f.RunID
}

// payTeardowns is the cycle's last step on the leader: it writes what the
// board could not record before, then tries again the owed teardowns that
// are due, under OwedBudget, fenced by term, and sets the gauge. Nothing
// happens without a board to remember them, under the global dry-run, or
// without the substrate.
func (l *Loop) payTeardowns(ctx context.Context, term int64, sub sdk.Substrate, subErr error, res *Result) {
	if l.cfg.Owed == nil || l.cfg.DryRun || ctx.Err() != nil {
		return
	}
	budget := OwedBudget(l.cfg.Ladder.MaintenanceInterval)
	start := l.cfg.Clock.Now()
	pctx, cancel := clock.WithTimeout(ctx, l.cfg.Clock, budget)
	defer cancel()
	defer l.countOwed(ctx)

	kept := l.owing.take()
	for i, f := range kept {
		if _, err := l.cfg.Owed.OweTeardown(pctx, f, l.cfg.TeardownBackoff); err != nil {
			l.cfg.Logger.Warn("could not record owed teardowns kept from before: next cycle", "count", len(kept)-i, "error", err)
			for _, g := range kept[i:] {
				l.owing.keep(g)
			}
			return
		}
	}
	if subErr != nil {
		return // the sweep already said the substrate is unavailable
	}
	due, err := l.cfg.Owed.DueTeardowns(pctx, term, start, OwedPage)
	switch {
	case errors.Is(err, board.ErrDeposed):
		l.cfg.Logger.Warn("owed teardowns not tried: this term no longer leads", "term", term)
		return
	case err != nil:
		l.cfg.Logger.Warn("could not read the owed teardowns: next cycle", "error", err)
		return
	}
	for _, o := range due {
		now := l.cfg.Clock.Now()
		if pctx.Err() != nil {
			break
		}
		if st := l.lead.Status(now); !st.Leading || st.Term != term {
			l.cfg.Logger.Warn("leadership lost: the owed teardowns wait", "term", term)
			break
		}
		if d, ok := l.retryTeardown(pctx, term, sub, o); ok {
			l.record(ctx, term, now, []sdk.Decision{d}, res)
		}
	}
	l.afterPhase(ctx, pctx, "teardown", start, budget, res, "owed teardowns overran their budget: the rest wait for the next cycle")
}

// afterPhase meters a phase run after the reapers (started at start under
// budget, in pctx, its budget's context below ctx) and, when it overran,
// notes it in res and warns with msg.
func (l *Loop) afterPhase(ctx, pctx context.Context, phase string, start time.Time, budget time.Duration, res *Result, msg string) {
	elapsed := l.cfg.Clock.Now().Sub(start)
	overran := (pctx.Err() != nil && ctx.Err() == nil) || elapsed > budget
	l.cfg.Metrics.Phase(phase, elapsed, overran)
	if overran {
		res.Overruns = append(res.Overruns, phase)
		l.cfg.Logger.Warn(msg, "budget", budget, "elapsed", elapsed)
	}
}

// liveAttempt is why an owed teardown of a live attempt is not tried.
const liveAttempt = "not tried: the attempt is still its task's current attempt on its way to execute or " +
	"executing (for a run: the run is still running), so no mark stands behind the teardown"

// retryTeardown tries one owed teardown again and writes what came of it;
// the decision says so (ok false: nothing was written, the term no longer
// leads).
func (l *Loop) retryTeardown(ctx context.Context, term int64, sub sdk.Substrate, o board.OwedTeardown) (sdk.Decision, bool) {
	var (
		why, summary string
		owed         bool
	)
	if o.Live {
		// No applied mark stands behind it (a reaper tore down what it had
		// not reaped): when in doubt, defer, and say so each time it is due.
		why, summary, owed = liveAttempt, "not tried", true
	} else {
		out, err := sub.Teardown(ctx, o.Request(term))
		why, owed = teardownOwed(out, err)
		_, _, summary = reap.TeardownTrouble(out, err)
	}
	now := l.cfg.Clock.Now()
	a := sdk.Attempt{RunID: o.RunID}
	if o.Attempt != nil {
		a = *o.Attempt
	}
	ev := map[string]string{reap.EvTeardown: summary, "reason": o.Reason,
		"tries": strconv.Itoa(o.Tries), "owed_since": o.FirstFailedAt.UTC().Format(time.RFC3339)}
	if o.PodUID != "" {
		ev["pod_uid"] = o.PodUID
	}
	// The write is not cut short with the budget: what the try did must be
	// on the board.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), owedWriteTimeout)
	defer cancel()
	if !owed {
		if _, err := l.cfg.Owed.TeardownDone(wctx, o.ID, term, now); err != nil {
			l.cfg.Logger.Warn("an owed teardown completed, but removing it failed: tried again later",
				"what", o.Subject(), "error", err)
			return sdk.Decision{}, false
		}
		ev["tries"] = strconv.Itoa(o.Tries + 1)
		return sdk.Decision{Reaper: o.Reaper, Label: sdk.LabelTeardownRetried, Attempt: a, Applied: true,
			Detail: fmt.Sprintf("the teardown owed since %s (%s) completed on try %d", o.FirstFailedAt.UTC().Format(time.RFC3339),
				o.Label, o.Tries+1), Evidence: ev}, true
	}
	n, err := l.cfg.Owed.TeardownFailed(wctx, o.ID, term, now, why, l.cfg.TeardownBackoff)
	if err != nil {
		l.cfg.Logger.Warn("an owed teardown failed again, and recording it failed", "what", o.Subject(),
			"teardown_error", why, "error", err)
		if errors.Is(err, board.ErrDeposed) {
			return sdk.Decision{}, false
		}
		n = o
		n.Tries++
	}
	ev["tries"], ev["next_try_at"] = strconv.Itoa(n.Tries), n.NextTryAt.UTC().Format(time.RFC3339)
	return sdk.Decision{Reaper: o.Reaper, Label: o.Label, Attempt: a,
		Detail: "the owed teardown failed again, the mark stays: " + why, Evidence: ev}, true
}

// countOwed sets the gauge of owed teardowns: the board's rows and those
// the board could not record yet.
func (l *Loop) countOwed(ctx context.Context) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), owedWriteTimeout)
	defer cancel()
	n, err := l.cfg.Owed.OwedTeardownCount(cctx)
	if err != nil {
		l.cfg.Logger.Warn("could not count the owed teardowns", "error", err)
		return
	}
	l.cfg.Metrics.OwedTeardowns(n + l.owing.count())
}

package ctl

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// Defaults of tune's flags.
const (
	TuneWindowDefault     = 7 * 24 * time.Hour
	TuneMinSamplesDefault = 20
)

// Verdicts of a threshold against what was observed.
const (
	verdictOK            = "ok"
	verdictShort         = "short"
	verdictBelowTail     = "below_tail"
	verdictTooFew        = "too_few_samples"
	verdictNoSamples     = "no_samples"
	verdictDisabled      = "disabled"
	verdictNotDerivable  = "not_derivable"
	measureDuration      = "attempt_duration"
	measureQueueWait     = "queue_wait"
	measureRunSettle     = "run_settle_lag"
	measurePodStart      = "pod_start"
	keyCredentialCeiling = "auth.max_attempt_credential_lifetime"
)

// measure is one observed distribution.
type measure struct {
	name    string // measureDuration, ...
	label   string // for people
	from    string // what is measured
	sum     summary
	enough  bool          // at least the minimum of samples for a suggestion
	suggest time.Duration // when enough
}

// check is one configured threshold against a measure.
type check struct {
	key      string
	value    time.Duration
	disabled bool
	against  *measure // nil: no observation bounds it
	why      string   // why it is compared with this measure, or why none
	verdict  string
	words    string
}

type tuneJSON struct {
	WindowSeconds float64         `json:"window_seconds"` // 0: every sample
	Limit         int             `json:"limit"`
	MinSamples    int             `json:"min_samples"`
	Measures      []measureJSON   `json:"measures"`
	Thresholds    []thresholdJSON `json:"thresholds"`
	BelowTail     []string        `json:"below_tail"`
	Notes         []string        `json:"notes"`
	// Replay is the replay's summary: each rung's smallest candidate with
	// no false reap in the window (reaperctl replay has the detail).
	Replay []tuneReplayJSON `json:"replay"`
}

type tuneReplayJSON struct {
	Rung   string `json:"rung"`
	Key    string `json:"key"`
	Status string `json:"status"`
	// ConfiguredSeconds is null when the configured value disables the rung.
	ConfiguredSeconds *float64 `json:"configured_seconds"`
	// The largest and the
	// suggestion are null when nothing was observed, the suggestion also
	// when no candidate within the ladder has no false reap.
	FalseReapsAtConfigured *int             `json:"false_reaps_at_configured"`
	Observed               *int             `json:"observed"`
	Largest                *observationJSON `json:"largest"`
	SmallestZeroSeconds    *float64         `json:"smallest_zero_seconds"`
	SmallestZeroSource     string           `json:"smallest_zero_source,omitempty"`
	MarginSeconds          *float64         `json:"margin_seconds"`
	Detail                 string           `json:"detail"`
}

type measureJSON struct {
	Name             string   `json:"name"`
	Measures         string   `json:"measures"`
	Count            int      `json:"count"`
	MedianSeconds    *float64 `json:"median_seconds"`
	P99Seconds       *float64 `json:"p99_seconds"`
	P999Seconds      *float64 `json:"p99_9_seconds"`
	MaxSeconds       *float64 `json:"max_seconds"`
	Enough           bool     `json:"enough_samples"`
	SuggestedSeconds *float64 `json:"suggested_seconds"`
}

type thresholdJSON struct {
	Key               string   `json:"key"`
	ConfiguredSeconds float64  `json:"configured_seconds"`
	Against           string   `json:"against,omitempty"`
	TailSeconds       *float64 `json:"tail_seconds"`
	SuggestedSeconds  *float64 `json:"suggested_seconds"`
	TimesMedian       *float64 `json:"times_median"`
	Verdict           string   `json:"verdict"`
	BelowTail         bool     `json:"below_tail"`
	Detail            string   `json:"detail"`
}

func seconds(d time.Duration) *float64 {
	s := d.Seconds()
	return &s
}

func (c CLI) tune(ctx context.Context, inv *invocation) error {
	fs := inv.flags()
	window := fs.Duration("window", TuneWindowDefault, "only what ended within `D` before now (0: everything)")
	limit := fs.Int("limit", board.TimingLimitDefault, "at most `N` samples of each kind, the newest")
	minSamples := fs.Int("min-samples", TuneMinSamplesDefault, "a suggestion needs at least `N` samples")
	if _, err := inv.parse(0, 0); err != nil {
		return err
	}
	if *window < 0 {
		return usagef("-window %s: must not be negative", *window)
	}
	if *limit < 1 || *limit > board.TimingLimitMax {
		return usagef("-limit %d: want 1 to %d", *limit, board.TimingLimitMax)
	}
	if *minSamples < 1 {
		return usagef("-min-samples %d: want at least 1", *minSamples)
	}

	s, err := c.open(ctx, inv.configPath)
	if err != nil {
		return err
	}
	defer s.close()
	q := board.TimingQuery{Limit: *limit}
	if *window > 0 {
		q.EndedAfter = c.now().Add(-*window)
	}
	attempts, err := s.store.SuccessTimings(ctx, q)
	if err != nil {
		return err
	}
	runs, err := s.store.RunSettleTimings(ctx, q)
	if err != nil {
		return err
	}
	var durations, waits, lags, podStarts []time.Duration
	for _, a := range attempts {
		durations = append(durations, a.Duration())
		if w, ok := a.QueueWait(); ok {
			waits = append(waits, w)
		}
		if p, ok := a.PodStart(); ok {
			podStarts = append(podStarts, p)
		}
	}
	for _, r := range runs {
		lags = append(lags, r.Lag())
	}

	ms := []*measure{
		{name: measureDuration, label: "attempt duration", from: "running -> ended, successful attempts"},
		{name: measureQueueWait, label: "queue wait", from: "queued -> running, the same attempts"},
		{name: measureRunSettle, label: "run settle lag", from: "last task activity -> end, successful runs"},
	}
	samples := [][]time.Duration{durations, waits, lags}
	if len(podStarts) > 0 {
		// The kube pods' own start, the part of the queue wait that is the
		// pod's (no threshold bounds it alone: dispatch_lost bounds the
		// whole wait); shown only where pods were recorded.
		ms = append(ms, &measure{name: measurePodStart, label: "pod start", from: "pod created -> running, kube (part of the queue wait)"})
		samples = append(samples, podStarts)
	}
	for i, samples := range samples {
		m := ms[i]
		m.sum = summarize(samples)
		m.enough = m.sum.Count >= *minSamples
		if m.enough {
			m.suggest = suggest(m.sum)
		}
	}
	checks := thresholdChecks(s.cfg.Ladder, ms[0], ms[1], ms[2])
	for _, ch := range checks {
		ch.verdict, ch.words = judge(ch, *minSamples)
	}
	notes := tuneNotes(s.cfg.Edition, s.cfg.Ladder, checks)
	opts := replayOptions{rungs: rungDefs(), list: 1}
	if *window > 0 {
		opts.since = c.now().Add(-*window)
	}
	replayed, err := replayRungs(ctx, s, opts)
	if err != nil {
		return err
	}

	if inv.json {
		doc := tuneDoc(*window, *limit, *minSamples, ms, checks, notes)
		doc.Replay = tuneReplayDoc(replayed)
		return writeJSON(inv.stdout, doc)
	}
	if err := tuneTables(inv, *window, *limit, *minSamples, ms, checks, notes); err != nil {
		return err
	}
	return tuneReplayTable(inv, *window, replayed)
}

// replaySummary is a rung's line of tune's replay summary: the smallest
// candidate with no false reap, its margin over the largest value
// observed, and what the numbers are when there are none.
type replaySummary struct {
	zero   *candidate
	top    board.Observation
	hasTop bool
	atConf *candidate
	detail string
	margin time.Duration
}

func summarizeReplay(r *rungResult) replaySummary {
	var sum replaySummary
	for _, c := range r.cands {
		if c.configured {
			sum.atConf = c
		}
	}
	sum.top, sum.hasTop = r.largest()
	zero, ok := r.smallestZero()
	switch {
	case !sum.hasTop:
		sum.detail = "nothing observed in the window: no " + r.def.unit + " to judge a threshold by"
	case !ok:
		sum.detail = "no candidate within the timing ladder has no false reap"
		for _, d := range r.dropped {
			if d.source == sourceTail {
				sum.detail = fmt.Sprintf("the observed tail needs %s, which breaks the ladder (%s)", human(d.value), d.why)
			}
		}
	default:
		sum.zero, sum.margin = zero, zero.value-sum.top.Value
		sum.detail = fmt.Sprintf("%s has no false reap in the window, %s over the largest %s",
			human(zero.value), human(sum.margin), strings.TrimSuffix(r.def.values, "s"))
		if zero.configured {
			sum.detail += "; it is the configured value"
		}
	}
	return sum
}

func tuneReplayDoc(results []*rungResult) []tuneReplayJSON {
	out := []tuneReplayJSON{}
	for _, r := range results {
		sum := summarizeReplay(r)
		j := tuneReplayJSON{Rung: r.def.name, Key: r.def.key, Status: r.status, Detail: sum.detail}
		if !r.disabled {
			j.ConfiguredSeconds = seconds(r.configured)
		}
		if r.status == statusReplayed {
			n := r.rep.Count
			j.Observed = &n
			if sum.atConf != nil {
				fr := sum.atConf.falseReaps
				j.FalseReapsAtConfigured = &fr
			}
		}
		if sum.hasTop {
			o := observationOf(sum.top)
			j.Largest = &o
		}
		if sum.zero != nil {
			j.SmallestZeroSeconds, j.SmallestZeroSource = seconds(sum.zero.value), sum.zero.source
			j.MarginSeconds = seconds(sum.margin)
		}
		out = append(out, j)
	}
	return out
}

func tuneReplayTable(inv *invocation, window time.Duration, results []*rungResult) error {
	w := inv.stdout
	over := "everything the board holds"
	if window > 0 {
		over = "the last " + human(window)
	}
	fmt.Fprintf(w, "\nreplayed over %s (reaperctl replay -rung RUNG names the attempts behind each number)\n\n", over)
	t := newTable(w, "RUNG", "CONFIGURED", "FALSE REAPS AT IT", "LARGEST OBSERVED", "NO FALSE REAP FROM", "MARGIN")
	for _, r := range results {
		sum := summarizeReplay(r)
		falseReaps, largest, zero, margin := "-", "-", "-", "-"
		if sum.atConf != nil {
			falseReaps = strconv.Itoa(sum.atConf.falseReaps)
		}
		if sum.hasTop {
			largest = fmt.Sprintf("%s (%s)", human(sum.top.Value), obsName(sum.top.Attempt))
		}
		if sum.zero != nil {
			zero, margin = human(sum.zero.value), human(sum.margin)
			if sum.zero.source == sourceTail {
				zero += " (the tail, rounded up)"
			}
		}
		t.row(r.def.name, configuredWords(r), falseReaps, largest, zero, margin)
	}
	if err := t.flush(); err != nil {
		return err
	}
	for _, r := range results {
		if sum := summarizeReplay(r); sum.zero == nil {
			fmt.Fprintf(w, "note: %s: %s\n", r.def.name, sum.detail)
		}
	}
	return nil
}

// thresholdChecks pairs each configured threshold with the observation that
// bounds it.
func thresholdChecks(l ladder.Ladder, duration, wait, settle *measure) []*check {
	return []*check{
		{key: keyCredentialCeiling, value: l.CredentialCeiling, disabled: !l.CeilingEnabled(), against: duration,
			why: "an attempt still running at the ceiling is ended as credential_ceiling"},
		{key: "dispatch_lost", value: l.DispatchLost, against: wait,
			why: "a queued attempt not started within it is marked dispatch_lost"},
		{key: "orphan_run", value: l.OrphanRun, against: settle,
			why: "a running run with nothing live for this long is failed"},
		{key: "agent_lost", value: l.AgentLost,
			why: "it bounds heartbeat silences, not durations (replayed below)"},
	}
}

// judge gives a threshold its verdict and says it in words.
func judge(ch *check, minSamples int) (string, string) {
	m := ch.against
	switch {
	case m == nil:
		return verdictNotDerivable, "not derivable: " + ch.why
	case ch.disabled:
		return verdictDisabled, "disabled (<= 0): nothing to compare"
	case m.sum.Count == 0:
		return verdictNoSamples, "no samples to compare with"
	case ch.value < m.sum.P999:
		return verdictBelowTail, fmt.Sprintf("BELOW THE OBSERVED TAIL (p99.9 %s, max %s)",
			human(m.sum.P999), human(m.sum.Max))
	case !m.enough:
		return verdictTooFew, fmt.Sprintf("too few samples to judge (%d < %d)", m.sum.Count, minSamples)
	case ch.value < m.suggest:
		return verdictShort, fmt.Sprintf("short: above the tail but under %d x the median (%s)",
			suggestionFactor, human(suggestionFactor*m.sum.Median))
	}
	return verdictOK, "ok: above the tail and the suggestion"
}

// tuneNotes says what the reader should know besides the tables: what a
// threshold below the tail does, why orphan_run is compared with runs
// rather than attempts, and whether the suggestions, taken together, keep
// the ladder in order.
func tuneNotes(edition string, l ladder.Ladder, checks []*check) []string {
	notes := []string{
		fmt.Sprintf("suggested = max(%d x median, p99.9), rounded up; percentiles by nearest rank", suggestionFactor),
		"orphan_run is compared with runs, not attempts: a running attempt keeps its run alive, so what it " +
			"bounds is a run's quiet time between its last task settling and the run being finished",
	}
	for _, ch := range checks {
		if ch.verdict == verdictBelowTail {
			notes = append(notes, fmt.Sprintf("%s is below the observed tail: %s, so observed %ss would have been cut short",
				ch.key, ch.why, ch.against.label))
		}
	}
	proposed, changed := l, false
	for _, ch := range checks {
		if ch.against == nil || ch.disabled || !ch.against.enough {
			continue
		}
		changed = true
		switch ch.key {
		case keyCredentialCeiling:
			proposed.CredentialCeiling = ch.against.suggest
		case "dispatch_lost":
			proposed.DispatchLost = ch.against.suggest
		case "orphan_run":
			proposed.OrphanRun = ch.against.suggest
		}
	}
	if changed {
		if _, err := proposed.Validate(edition); err != nil {
			notes = append(notes, "taken as they are, the suggestions break the timing ladder ("+
				err.Error()+"): keep the ladder's order when applying them")
		}
	}
	return notes
}

func tuneDoc(window time.Duration, limit, minSamples int, ms []*measure, checks []*check, notes []string) tuneJSON {
	doc := tuneJSON{WindowSeconds: window.Seconds(), Limit: limit, MinSamples: minSamples,
		Measures: []measureJSON{}, Thresholds: []thresholdJSON{}, BelowTail: []string{}, Notes: notes}
	for _, m := range ms {
		mj := measureJSON{Name: m.name, Measures: m.from, Count: m.sum.Count, Enough: m.enough}
		if m.sum.Count > 0 {
			mj.MedianSeconds, mj.P99Seconds = seconds(m.sum.Median), seconds(m.sum.P99)
			mj.P999Seconds, mj.MaxSeconds = seconds(m.sum.P999), seconds(m.sum.Max)
		}
		if m.enough {
			mj.SuggestedSeconds = seconds(m.suggest)
		}
		doc.Measures = append(doc.Measures, mj)
	}
	for _, ch := range checks {
		tj := thresholdJSON{Key: ch.key, ConfiguredSeconds: ch.value.Seconds(), Verdict: ch.verdict,
			BelowTail: ch.verdict == verdictBelowTail, Detail: ch.words}
		if m := ch.against; m != nil {
			tj.Against = m.name
			if m.sum.Count > 0 {
				tj.TailSeconds = seconds(m.sum.P999)
				if m.sum.Median > 0 && !ch.disabled {
					x := float64(ch.value) / float64(m.sum.Median)
					tj.TimesMedian = &x
				}
			}
			if m.enough {
				tj.SuggestedSeconds = seconds(m.suggest)
			}
		}
		if tj.BelowTail {
			doc.BelowTail = append(doc.BelowTail, ch.key)
		}
		doc.Thresholds = append(doc.Thresholds, tj)
	}
	return doc
}

func tuneTables(inv *invocation, window time.Duration, limit, minSamples int, ms []*measure, checks []*check, notes []string) error {
	w := inv.stdout
	scope := "everything the board holds"
	if window > 0 {
		scope = "what ended in the last " + human(window)
	}
	fmt.Fprintf(w, "observed: %s, the newest %d samples of each at most\n\n", scope, limit)
	t := newTable(w, "MEASURE", "FROM", "SAMPLES", "MEDIAN", "P99", "P99.9", "MAX", "SUGGESTED")
	for _, m := range ms {
		if m.sum.Count == 0 {
			t.row(m.label, m.from, "0", "-", "-", "-", "-", "no samples")
			continue
		}
		sug := human(m.suggest)
		if !m.enough {
			sug = fmt.Sprintf("too few samples (%d < %d)", m.sum.Count, minSamples)
		}
		t.row(m.label, m.from, strconv.Itoa(m.sum.Count), human(m.sum.Median), human(m.sum.P99),
			human(m.sum.P999), human(m.sum.Max), sug)
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	t = newTable(w, "THRESHOLD", "CONFIGURED", "AGAINST", "X MEDIAN", "SUGGESTED", "VERDICT")
	var below []string
	for _, ch := range checks {
		against, times, sug := "-", "-", "-"
		if m := ch.against; m != nil {
			against = m.label
			if m.sum.Median > 0 && !ch.disabled {
				times = ratio(float64(ch.value) / float64(m.sum.Median))
			}
			if m.enough {
				sug = human(m.suggest)
			}
		}
		if ch.verdict == verdictBelowTail {
			below = append(below, ch.key)
		}
		t.row(ch.key, human(ch.value), against, times, sug, ch.words)
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if len(below) > 0 {
		fmt.Fprintf(w, "%s below the observed tail: %s\n", plural(len(below), "threshold"), strings.Join(below, ", "))
	} else {
		fmt.Fprintln(w, "no configured threshold is below the observed tail")
	}
	for _, n := range notes {
		fmt.Fprintln(w, "note: "+n)
	}
	return nil
}

// ratio renders a multiple of the median: "0.5x", "12x".
func ratio(x float64) string {
	switch {
	case x < 10:
		return strconv.FormatFloat(x, 'f', 1, 64) + "x"
	default:
		return strconv.FormatFloat(x, 'f', 0, 64) + "x"
	}
}

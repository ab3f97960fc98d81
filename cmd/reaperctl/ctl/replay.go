package ctl

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/host/config"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// Replay judges the thresholds of the ladder against the board's own
// history: for each rung a reaper judges by, the values the board saw that
// later proved the attempt (or run) alive, and the ones that were really
// lost. A candidate threshold under a value that proved alive is a false
// reap there; a lost attempt is recovered at the candidate instead of when
// it was, sooner or later by the difference (its shift).
//
// Replay judges the staleness gate alone, the one a threshold sets: it
// counts as a false reap every value past the threshold, as if a reaper
// had looked at that instant and the liveness gate (the process or pod
// read) had not deferred. Its counts are what the threshold alone would
// have let through, an upper bound of what a reaper would have done.

// Rungs that replay knows.
const (
	rungAgentLost    = "agent_lost"
	rungDispatchLost = "dispatch_lost"
	rungOrphanRun    = "orphan_run"
	rungCeiling      = "credential_ceiling"
	rungPodLostFloor = "pod_lost_floor"
)

// A rung's status in the replay.
const (
	statusReplayed = "replayed"
)

// Where a candidate comes from.
const (
	sourceConfigured = "configured"
	sourceRange      = "range"
	sourceTail       = "observed_tail"
	sourceGiven      = "given"
)

// Defaults of replay's flags.
const (
	ReplayWindowDefault = 7 * 24 * time.Hour
)

// rangeFactors are the multiples of the configured value that make the
// default candidates: from a quarter to four times, rounded up (roundUp)
// to a step that suits their size; the configured value itself exactly.
var rangeFactors = []float64{0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4}

// pictureQuantiles are the fractions whose values draw the tail: every
// percent, then finer towards the largest value.
func pictureQuantiles() []float64 {
	var fs []float64
	for i := 0; i <= 100; i++ {
		fs = append(fs, float64(i)/100)
	}
	return append(fs, 0.995, 0.999, 0.9995, 0.9999, 0.99995, 0.99999)
}

// rungDef is one rung of the ladder as replay judges it.
type rungDef struct {
	name    string // the rung: agent_lost, ...
	key     string // the configuration key that sets it
	measure string // what its values are, for people
	unit    string // what a value belongs to: attempts or runs
	values  string // what its values are called: silences, ...
	lostAs  string // how a lost one's value reads: "silent", ...
	get     func(ladder.Ladder) time.Duration
	set     func(*ladder.Ladder, time.Duration)
	// read is the board's history read.
	read func(*board.Store, context.Context, board.ReplayQuery) (board.Replay, error)
}

func rungDefs() []*rungDef {
	return []*rungDef{
		{name: rungAgentLost, key: "agent_lost", unit: "attempts", values: "silences", lostAs: "silent",
			measure: "heartbeat silence: an attempt's longest gap between heartbeats (the first from running), " +
				"or its silence before its own outcome",
			get:  func(l ladder.Ladder) time.Duration { return l.AgentLost },
			set:  func(l *ladder.Ladder, d time.Duration) { l.AgentLost = d },
			read: (*board.Store).ReplayAgentLost},
		{name: rungDispatchLost, key: "dispatch_lost", unit: "attempts", values: "waits", lostAs: "queued",
			measure: "dispatch latency: an attempt's wait from queued to running",
			get:     func(l ladder.Ladder) time.Duration { return l.DispatchLost },
			set:     func(l *ladder.Ladder, d time.Duration) { l.DispatchLost = d },
			read:    (*board.Store).ReplayDispatchLost},
		{name: rungPodLostFloor, key: "pod_lost_floor", unit: "attempts", values: "pod cache misses", lostAs: "running",
			measure: "pod cache miss: how long a kube attempt had been running when a window in which the pod " +
				"cache held no pod of it ended while it lived on (its pod came back, or it heartbeated or " +
				"reported after its pod was deleted)",
			get:  func(l ladder.Ladder) time.Duration { return l.PodLostFloor },
			set:  func(l *ladder.Ladder, d time.Duration) { l.PodLostFloor = d },
			read: (*board.Store).ReplayPodLostFloor},
		{name: rungOrphanRun, key: "orphan_run", unit: "runs", values: "quiet periods", lostAs: "quiet",
			measure: "run quiet: a run's longest stretch with no attempt live and no activity",
			get:     func(l ladder.Ladder) time.Duration { return l.OrphanRun },
			set:     func(l *ladder.Ladder, d time.Duration) { l.OrphanRun = d },
			read:    (*board.Store).ReplayOrphanRun},
		{name: rungCeiling, key: keyCredentialCeiling, unit: "attempts", values: "credential lives", lostAs: "on its credentials",
			measure: "credential life: a successful attempt's time from its credential's mint to its end",
			get:     func(l ladder.Ladder) time.Duration { return l.CredentialCeiling },
			set:     func(l *ladder.Ladder, d time.Duration) { l.CredentialCeiling = d },
			read:    (*board.Store).ReplayCredentialCeiling},
	}
}

func rungNames() []string {
	var ns []string
	for _, d := range rungDefs() {
		ns = append(ns, d.name)
	}
	return ns
}

func lookupRung(name string) (*rungDef, bool) {
	for _, d := range rungDefs() {
		if d.name == name || d.key == name {
			return d, true
		}
	}
	return nil, false
}

// candidate is one threshold replayed on a rung.
type candidate struct {
	value      time.Duration
	source     string
	configured bool
	falseReaps int
	// recovered counts the lost attempts (or runs) this rung would have
	// settled at the candidate; shifts are their candidate minus the value
	// at which they were settled (negative: sooner).
	recovered   int
	medianShift time.Duration
	maxShift    time.Duration
}

// dropped is a candidate of the default range left out, and why.
type dropped struct {
	value  time.Duration
	source string
	why    string
}

// rungResult is one rung's replay.
type rungResult struct {
	def        *rungDef
	status     string
	configured time.Duration
	disabled   bool // the configured value disables the rung (the ceiling <= 0)
	cands      []*candidate
	dropped    []dropped
	rep        board.Replay
}

// largest is the largest value that proved alive; ok is false when none.
func (r *rungResult) largest() (board.Observation, bool) {
	if len(r.rep.Largest) == 0 {
		return board.Observation{}, false
	}
	return r.rep.Largest[0], true
}

// smallestZero is the smallest candidate with no false reap; ok is false
// when there is none, or nothing was observed to judge by.
func (r *rungResult) smallestZero() (*candidate, bool) {
	if r.status != statusReplayed || r.rep.Count == 0 {
		return nil, false
	}
	for _, c := range r.cands {
		if c.falseReaps == 0 {
			return c, true
		}
	}
	return nil, false
}

// replayOptions is what to replay.
type replayOptions struct {
	since time.Time // zero: all history
	rungs []*rungDef
	given []time.Duration // candidates given on the command line (one rung)
	list  int
}

// checkCandidate refuses a candidate that breaks the ladder's order, naming
// the rung and the rule.
func checkCandidate(cfg *config.Config, def *rungDef, d time.Duration) error {
	l := cfg.Ladder
	def.set(&l, d)
	_, err := l.Validate(cfg.Edition)
	if err == nil {
		return nil
	}
	var lerr *ladder.Error
	if !errors.As(err, &lerr) {
		return fmt.Errorf("%s %s: %w", def.name, human(d), err)
	}
	rules := make([]string, len(lerr.Violations))
	for i, v := range lerr.Violations {
		rules[i] = v.Rule
	}
	return fmt.Errorf("%s %s breaks the timing ladder: %s", def.name, human(d), strings.Join(rules, "; "))
}

// candidatesFor is a rung's candidates before the read: the given ones,
// or the default range around the configured value, less what breaks the
// ladder.
func candidatesFor(cfg *config.Config, def *rungDef, given []time.Duration) ([]*candidate, []dropped) {
	configured := def.get(cfg.Ladder)
	enabled := configured > 0
	var cands []*candidate
	var drop []dropped
	seen := map[time.Duration]bool{}
	add := func(v time.Duration, source string) {
		if seen[v] {
			return
		}
		seen[v] = true
		if err := checkCandidate(cfg, def, v); err != nil {
			drop = append(drop, dropped{value: v, source: source, why: err.Error()})
			return
		}
		cands = append(cands, &candidate{value: v, source: source, configured: enabled && v == configured})
	}
	if given != nil {
		for _, v := range given {
			add(v, sourceGiven)
		}
		return cands, drop
	}
	base := configured
	if !enabled {
		base = def.get(ladder.Defaults())
	}
	for _, f := range rangeFactors {
		if f == 1 {
			source := sourceConfigured
			if !enabled {
				source = sourceRange
			}
			add(base, source)
			continue
		}
		add(roundUp(time.Duration(float64(base)*f)), sourceRange)
	}
	return cands, drop
}

// replayRungs replays each rung of opts against the board.
func replayRungs(ctx context.Context, s *session, opts replayOptions) ([]*rungResult, error) {
	var out []*rungResult
	for _, def := range opts.rungs {
		res := &rungResult{def: def, configured: def.get(s.cfg.Ladder)}
		res.disabled = res.configured <= 0
		res.status = statusReplayed
		res.cands, res.dropped = candidatesFor(s.cfg, def, opts.given)
		q := board.ReplayQuery{Since: opts.since, Quantiles: pictureQuantiles(), List: opts.list}
		for _, c := range res.cands {
			q.Thresholds = append(q.Thresholds, c.value)
		}
		rep, err := def.read(s.store, ctx, q)
		if err != nil {
			return nil, err
		}
		res.rep = rep
		for i, c := range res.cands {
			c.falseReaps = rep.Exceeding[i]
		}
		// The observed tail, rounded up: by construction no value proved
		// alive lies above it, so it has no false reap.
		if top, ok := res.largest(); ok && opts.given == nil {
			if t := roundUp(top.Value); t > 0 && !slices.ContainsFunc(res.cands, func(c *candidate) bool { return c.value == t }) {
				if err := checkCandidate(s.cfg, def, t); err != nil {
					res.dropped = append(res.dropped, dropped{value: t, source: sourceTail, why: err.Error()})
				} else {
					res.cands = append(res.cands, &candidate{value: t, source: sourceTail,
						configured: !res.disabled && t == res.configured})
				}
			}
		}
		for _, c := range res.cands {
			scoreLost(c, rep.Lost)
		}
		sort.SliceStable(res.cands, func(i, j int) bool { return res.cands[i].value < res.cands[j].value })
		out = append(out, res)
	}
	return out, nil
}

// scoreLost counts the lost this rung recovers at the candidate and their
// shifts. The rung's own settlements are recovered at any candidate, the
// candidate minus their value sooner or later; another path's only under a
// candidate below their value (sooner: the other path still comes first
// otherwise).
func scoreLost(c *candidate, lost []board.LostObservation) {
	var shifts []time.Duration
	for _, l := range lost {
		if l.Own || c.value < l.Value {
			shifts = append(shifts, c.value-l.Value)
		}
	}
	c.recovered = len(shifts)
	if len(shifts) == 0 {
		return
	}
	sort.Slice(shifts, func(i, j int) bool { return shifts[i] < shifts[j] })
	c.medianShift = nearestRank(shifts, 500)
	c.maxShift = shifts[len(shifts)-1]
}

// parseCandidates reads -candidates: durations separated by commas.
func parseCandidates(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		d, err := time.ParseDuration(f)
		if err != nil {
			return nil, fmt.Errorf("-candidates %q: %q is not a duration", s, f)
		}
		if d <= 0 {
			return nil, fmt.Errorf("-candidates %q: %s is not positive", s, f)
		}
		out = append(out, d)
	}
	return out, nil
}

func (c CLI) replay(ctx context.Context, inv *invocation) error {
	fs := inv.flags()
	window := fs.Duration("window", ReplayWindowDefault, "the history of the last `D` (0: everything the board holds)")
	rungFlag := fs.String("rung", "", "replay only this `RUNG`: "+strings.Join(rungNames(), ", "))
	candFlag := fs.String("candidates", "", "with -rung: replay the thresholds `D,D,...` instead of the range around the configured one")
	list := fs.Int("list", board.ReplayListDefault, "list at most `N` false reaps and lost attempts of each rung")
	output := inv.outputFlag()
	picture := fs.String("picture", "", "also draw the observed tails with the candidates on them, as an SVG, into `FILE`")
	if _, err := inv.parse(0, 0); err != nil {
		return err
	}
	if *window < 0 {
		return usagef("-window %s: must not be negative", *window)
	}
	if *list < 1 || *list > board.ReplayListMax {
		return usagef("-list %d: want 1 to %d", *list, board.ReplayListMax)
	}
	if err := output(); err != nil {
		return err
	}
	opts := replayOptions{list: *list, rungs: rungDefs()}
	if *rungFlag != "" {
		def, ok := lookupRung(*rungFlag)
		if !ok {
			return usagef("-rung %q: want one of %s", *rungFlag, strings.Join(rungNames(), ", "))
		}
		opts.rungs = []*rungDef{def}
	}
	if *candFlag != "" {
		if *rungFlag == "" {
			return usagef("-candidates needs -rung: each rung has a scale of its own")
		}
		given, err := parseCandidates(*candFlag)
		if err != nil {
			return usagef("%v", err)
		}
		opts.given = given
	}

	s, err := c.open(ctx, inv.configPath)
	if err != nil {
		return err
	}
	defer s.close()
	for _, d := range opts.given {
		if opts.rungs[0].read == nil {
			break
		}
		if err := checkCandidate(s.cfg, opts.rungs[0], d); err != nil {
			return usagef("-candidates: %v", err)
		}
	}
	if *window > 0 {
		opts.since = c.now().Add(-*window)
	}
	results, err := replayRungs(ctx, s, opts)
	if err != nil {
		return err
	}
	if *picture != "" {
		if err := writePicture(*picture, *window, results); err != nil {
			return err
		}
	}
	if inv.json {
		return writeJSON(inv.stdout, replayDoc(*window, opts.since, s.cfg.Edition, *list, results))
	}
	return replayTables(inv, *window, opts.since, *list, results)
}

// writePicture writes the picture to path.
func writePicture(path string, window time.Duration, results []*rungResult) error {
	svg, err := picture(window, results)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, svg, 0o644); err != nil {
		return fmt.Errorf("write the picture: %w", err)
	}
	return nil
}

// scope says which history a replay read.
func scope(window time.Duration, since time.Time) string {
	if window == 0 {
		return "everything the board holds"
	}
	return fmt.Sprintf("the last %s (attempts released or last written since %s; runs ended since, or not ended)",
		human(window), stamp(since))
}

// obsName names what a value belongs to: an attempt, or a run.
func obsName(a sdk.Attempt) string {
	if a.TaskID == "" {
		return a.RunID
	}
	return attemptName(a)
}

// signed renders a shift: "-45s" sooner, "+1m" later, "0s".
func signed(d time.Duration) string {
	if d > 0 {
		return "+" + human(d)
	}
	return human(d)
}

func candidateNote(c *candidate, disabled bool) string {
	var parts []string
	if c.configured {
		parts = append(parts, "<- configured")
	}
	switch c.source {
	case sourceTail:
		parts = append(parts, "the observed tail, rounded up")
	case sourceConfigured:
		if disabled {
			parts = append(parts, "configured: disabled")
		}
	}
	return strings.Join(parts, "; ")
}

func replayTables(inv *invocation, window time.Duration, since time.Time, list int, results []*rungResult) error {
	w := inv.stdout
	fmt.Fprintf(w, "replay of %s\n", scope(window, since))
	for _, r := range results {
		def := r.def
		fmt.Fprintf(w, "\n%s\n", rungTitle(r))
		fmt.Fprintf(w, "  measures %s\n", def.measure)
		if top, ok := r.largest(); ok {
			fmt.Fprintf(w, "  %s that later proved alive: %d; the largest %s: %s (%s)\n",
				def.values, r.rep.Count, human(top.Value), obsName(top.Attempt), top.Proof)
		} else {
			fmt.Fprintf(w, "  nothing observed in the window: no %s to judge a threshold by\n", def.unit)
		}
		fmt.Fprintf(w, "  %s settled lost: %d\n", def.unit, len(r.rep.Lost))
		t := newTable(w, "  CANDIDATE", "FALSE REAPS", "LOST RECOVERED", "MEDIAN SHIFT", "MAX SHIFT", "")
		for _, c := range r.cands {
			median, maxs := "-", "-"
			if c.recovered > 0 {
				median, maxs = signed(c.medianShift), signed(c.maxShift)
			}
			t.row("  "+human(c.value), strconv.Itoa(c.falseReaps), fmt.Sprintf("%d of %d", c.recovered, len(r.rep.Lost)),
				median, maxs, candidateNote(c, r.disabled))
		}
		if err := t.flush(); err != nil {
			return err
		}
		if n := maxFalseReaps(r); n > 0 {
			fmt.Fprintf(w, "  false reaps, the largest value first (each is one at every candidate under its value):\n")
			shown := min(n, len(r.rep.Largest))
			for _, o := range r.rep.Largest[:shown] {
				fmt.Fprintf(w, "    %s  %s  %s%s\n", obsName(o.Attempt), human(o.Value), o.Proof, period(o))
			}
			if n > shown {
				fmt.Fprintf(w, "    ... and %d more (-list N, or -o json)\n", n-shown)
			}
		}
		if len(r.rep.Lost) > 0 {
			fmt.Fprintf(w, "  lost, the largest value first (what the shifts are measured from):\n")
			shown := min(len(r.rep.Lost), list)
			for _, l := range r.rep.Lost[:shown] {
				fmt.Fprintf(w, "    %s  %s %s when settled %s at %s\n", obsName(l.Attempt), def.lostAs, human(l.Value),
					dash(l.Reason), stamp(l.At))
			}
			if len(r.rep.Lost) > shown {
				fmt.Fprintf(w, "    ... and %d more (-list N, or -o json)\n", len(r.rep.Lost)-shown)
			}
		}
		for _, d := range r.dropped {
			fmt.Fprintf(w, "  left out %s (%s): %s\n", human(d.value), d.source, d.why)
		}
	}
	fmt.Fprintln(w)
	for _, n := range replayNotes() {
		fmt.Fprintln(w, "note: "+n)
	}
	return nil
}

func period(o board.Observation) string {
	if o.From.IsZero() || o.To.IsZero() {
		return ""
	}
	return fmt.Sprintf(" (%s to %s)", stamp(o.From), stamp(o.To))
}

// rungTitle names a rung with its key, when it has one of its own, and its
// configured value.
func rungTitle(r *rungResult) string {
	key := ""
	if r.def.key != r.def.name {
		key = r.def.key + ", "
	}
	return fmt.Sprintf("%s (%sconfigured %s)", r.def.name, key, configuredWords(r))
}

func configuredWords(r *rungResult) string {
	if r.disabled {
		return "disabled"
	}
	return human(r.configured)
}

// maxFalseReaps is the false reaps of the smallest candidate: every value
// above it.
func maxFalseReaps(r *rungResult) int {
	n := 0
	for _, c := range r.cands {
		n = max(n, c.falseReaps)
	}
	return n
}

func replayNotes() []string {
	return []string{
		"a false reap is a value above the candidate that later proved alive; a reaper judging by the " +
			"threshold alone would have settled it (its liveness read might still have deferred it)",
		"a shift is the candidate minus the value at which a lost one was settled: negative, recovered sooner",
		"orphan_run counts from stamps: the time a task waited scheduled is not stamped, so a run's quiet " +
			"can read longer than it was (more false reaps, never fewer)",
		"agent_lost counts an attempt's first silence from its running report; on kube that window is " +
			"pod_lost's, so there the count can only be higher than agent_lost's own",
		"pod_lost_floor counts only the windows the kube substrate's pod cache saw (not its first list " +
			"after a start, nor a pod the attempt never recorded) and only where the history is recorded " +
			"(from migration 013 on): a board without it reads as nothing observed",
	}
}

// The JSON document of replay -o json.

type replayJSON struct {
	WindowSeconds float64    `json:"window_seconds"` // 0: all history
	Since         *time.Time `json:"since"`
	Edition       string     `json:"edition"`
	Rungs         []rungJSON `json:"rungs"`
	Notes         []string   `json:"notes"`
}

type rungJSON struct {
	Rung     string `json:"rung"`
	Key      string `json:"key"`
	Status   string `json:"status"`
	Detail   string `json:"detail,omitempty"`
	Measures string `json:"measures"`
	Unit     string `json:"unit"`
	// ConfiguredSeconds is null when the configured value disables the rung.
	ConfiguredSeconds *float64 `json:"configured_seconds"`
	// Observed is how many values proved alive.
	Observed   *int              `json:"observed"`
	Largest    *observationJSON  `json:"largest"`
	Candidates []candidateJSON   `json:"candidates"`
	FalseReaps []observationJSON `json:"false_reaps"` // the largest values, largest first
	Lost       []lostJSON        `json:"lost"`
	LostCount  *int              `json:"lost_count"`
	Dropped    []droppedJSON     `json:"dropped"`
}

// whoJSON names what a value belongs to: an attempt, or a run alone.
type whoJSON struct {
	RunID  string `json:"run_id"`
	TaskID string `json:"task_id,omitempty"`
	Try    *int32 `json:"try_number,omitempty"`
	Epoch  *int32 `json:"attempt_epoch,omitempty"`
}

func whoOf(a sdk.Attempt) whoJSON {
	if a.TaskID == "" {
		return whoJSON{RunID: a.RunID}
	}
	try, epoch := a.Try, a.Epoch
	return whoJSON{RunID: a.RunID, TaskID: a.TaskID, Try: &try, Epoch: &epoch}
}

type observationJSON struct {
	whoJSON
	ValueSeconds float64    `json:"value_seconds"`
	Proof        string     `json:"proof"`
	From         *time.Time `json:"from,omitempty"`
	To           *time.Time `json:"to,omitempty"`
}

type lostJSON struct {
	whoJSON
	ValueSeconds float64    `json:"value_seconds"`
	Reason       string     `json:"reason"`
	Own          bool       `json:"own"`
	At           *time.Time `json:"at"`
}

type candidateJSON struct {
	Seconds            float64           `json:"seconds"`
	Source             string            `json:"source"`
	Configured         bool              `json:"configured"`
	FalseReaps         int               `json:"false_reaps"`
	FalseReapAttempts  []observationJSON `json:"false_reap_attempts"` // the listed ones
	LostRecovered      int               `json:"lost_recovered"`
	MedianShiftSeconds *float64          `json:"median_shift_seconds"`
	MaxShiftSeconds    *float64          `json:"max_shift_seconds"`
}

type droppedJSON struct {
	Seconds float64 `json:"seconds"`
	Source  string  `json:"source"`
	Why     string  `json:"why"`
}

func observationOf(o board.Observation) observationJSON {
	return observationJSON{whoJSON: whoOf(o.Attempt), ValueSeconds: o.Value.Seconds(), Proof: o.Proof,
		From: timeOrNil(o.From), To: timeOrNil(o.To)}
}

func lostOf(l board.LostObservation) lostJSON {
	return lostJSON{whoJSON: whoOf(l.Attempt), ValueSeconds: l.Value.Seconds(), Reason: l.Reason, Own: l.Own,
		At: timeOrNil(l.At)}
}

func rungDoc(r *rungResult, listCap int) rungJSON {
	j := rungJSON{Rung: r.def.name, Key: r.def.key, Status: r.status, Measures: r.def.measure, Unit: r.def.unit,
		Candidates: []candidateJSON{}, FalseReaps: []observationJSON{}, Lost: []lostJSON{}, Dropped: []droppedJSON{}}
	if !r.disabled {
		j.ConfiguredSeconds = seconds(r.configured)
	}
	count, lostCount := r.rep.Count, len(r.rep.Lost)
	j.Observed, j.LostCount = &count, &lostCount
	if top, ok := r.largest(); ok {
		o := observationOf(top)
		j.Largest = &o
	}
	for _, o := range r.rep.Largest[:min(maxFalseReaps(r), len(r.rep.Largest))] {
		j.FalseReaps = append(j.FalseReaps, observationOf(o))
	}
	for _, l := range r.rep.Lost[:min(len(r.rep.Lost), listCap)] {
		j.Lost = append(j.Lost, lostOf(l))
	}
	for _, c := range r.cands {
		cj := candidateJSON{Seconds: c.value.Seconds(), Source: c.source, Configured: c.configured,
			FalseReaps: c.falseReaps, LostRecovered: c.recovered, FalseReapAttempts: []observationJSON{}}
		for _, o := range r.rep.Largest[:min(c.falseReaps, len(r.rep.Largest))] {
			cj.FalseReapAttempts = append(cj.FalseReapAttempts, observationOf(o))
		}
		if c.recovered > 0 {
			cj.MedianShiftSeconds, cj.MaxShiftSeconds = seconds(c.medianShift), seconds(c.maxShift)
		}
		j.Candidates = append(j.Candidates, cj)
	}
	for _, d := range r.dropped {
		j.Dropped = append(j.Dropped, droppedJSON{Seconds: d.value.Seconds(), Source: d.source, Why: d.why})
	}
	return j
}

func replayDoc(window time.Duration, since time.Time, edition string, list int, results []*rungResult) replayJSON {
	doc := replayJSON{WindowSeconds: window.Seconds(), Since: timeOrNil(since), Edition: edition,
		Rungs: []rungJSON{}, Notes: replayNotes()}
	for _, r := range results {
		doc.Rungs = append(doc.Rungs, rungDoc(r, list))
	}
	return doc
}

// Package parked is a reaper plugin written the way a third party writes
// one: in its own module, on the public packages of the reaper SDK only
// (sdk for the contract, sdk/reap for the toolkit, sdk/plugin for main).
//
// It settles attempts that were parked and then forgotten. An attempt in
// up_for_reschedule (a reschedule-mode sensor between two pokes) or deferred
// keeps its run alive on purpose: the orphan-run reaper must not fail a run
// that merely waits. But if whatever should bring the attempt back never
// does (the poke is lost, the trigger that owned a deferred attempt is gone),
// nothing else will ever end it, and its run stays open for good. This
// reaper fails such an attempt on the infra rail as parked_expired, so the
// scheduler re-places it (policy "replace") or holds it for an operator
// (policy "hold").
//
// Two gates stand before any write, and both must pass:
//
//   - stale: the attempt parked (ended_at) longer than ttl ago. The board
//     applies the threshold in the listing, before the page limit, so a
//     fresh parked attempt never takes a slot. The default, 6h, is far above
//     any sane poke interval; tune it from the longest honest park you see.
//   - dead: the substrate reads nothing of the attempt alive. Alive defers
//     (parked_process_alive); unknown, or a liveness read that failed,
//     defers too (parked_query_error). On kube the read is authoritative,
//     not the cache.
//
// Every mark is guarded: it names the attempt's try and epoch and its
// parked state as the only source state, and carries the leadership term,
// so an attempt re-poked or cleared between the listing and the mark is
// left alone (reap_mark_noop). The reaper never stops or tears down
// anything: it acts only on attempts of which nothing runs.
//
// It has no brake. A brake holds back marks decided on heartbeat silence
// alone; every mark here rests on the substrate's positive "dead", which is
// never braked, so a mass expiry (say, a trigger service that lost every
// deferred attempt at once) is settled in one drained pass.
//
// Configured in reaperd's file:
//
//	reaper "parked" {
//	  ttl    = "6h"       # how long an attempt may stay parked
//	  policy = "replace"  # or "hold"
//	}
package parked

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/reap"
)

// Name is the label the reaper is configured under; its binary is
// reaper-parked.
const Name = "parked"

// Decision labels. They are this plugin's own: a third-party reaper names
// its decisions itself, declares them in its Info (MarkReasons,
// DecisionLabels), and the host meters and audits them like any other.
const (
	// LabelExpired: parked past the TTL and read dead: failed on the infra
	// rail.
	LabelExpired = "parked_expired"
	// LabelProcessAlive: parked past the TTL, but something of the attempt
	// still runs: deferred.
	LabelProcessAlive = "parked_process_alive"
	// LabelQueryError: parked past the TTL, and the substrate could not say
	// whether anything of it runs: deferred.
	LabelQueryError = "parked_query_error"
)

// EvParkedFor is the evidence key of how long the attempt has been parked.
const EvParkedFor = "parked_for"

// listParked names the listing: the key of its cursor in the pass state.
const listParked = "parked"

// TTLDefault is how long an attempt may stay parked by default.
const TTLDefault = 6 * time.Hour

// Config is the reaper's configuration block. The host decodes the
// operator's HCL against the schema sdk.SchemaOf derives from it, so a typo
// or a bad value fails `reaperd validate` with the file and line.
type Config struct {
	TTL time.Duration `reaper:"ttl" help:"how long an attempt may stay parked (up_for_reschedule or deferred) before it is judged; far above the longest poke interval or deferral you run"`
	reap.PolicySetting
	reap.DrainSetting
}

// DefaultConfig is the configuration of a block that sets nothing.
func DefaultConfig() Config {
	return Config{TTL: TTLDefault, PolicySetting: reap.DefaultPolicy()}
}

// Validate checks what the embedded settings do not (they validate
// themselves).
func (c Config) Validate() error {
	if c.TTL <= 0 {
		return fmt.Errorf("attribute %q: must be positive, got %s", "ttl", c.TTL)
	}
	return nil
}

// Reaper is the parked reaper: reap.Base serves Info, ConfigSchema and
// Configure from the Info given and the Config struct; the plugin adds
// Reap. Its zero value is not usable; call New.
type Reaper struct{ *reap.Base[Config] }

// New returns the reaper with its default configuration. plugin.Serve
// calls it with a logger whose lines the host re-emits under the plugin's
// name; a nil logger discards.
func New(logger hclog.Logger) *Reaper {
	return &Reaper{reap.NewBase(logger, DefaultConfig, sdk.Info{Name: Name, Version: "0.1.0",
		Editions:    []string{ladder.EditionLite, ladder.EditionKube},
		Description: "fails attempts parked in up_for_reschedule or deferred far past a TTL with nothing of them alive (parked_expired)",
		MarkReasons: []string{LabelExpired},
		// Every other label its decisions carry: the host takes a
		// decision only under a label its plugin declared.
		DecisionLabels: []string{LabelProcessAlive, LabelQueryError},
		// Of those, the one that fails an attempt (an infra mark, which a
		// durable SUCCESS may still override): the host scores it in the
		// shadow and opens its verdict series.
		KillLabels: []string{LabelExpired}, ProvisionalLabels: []string{LabelExpired}})}
}

// WithStopwatch makes the reaper measure its pass against the phase budget
// on c instead of the real clock, so a test decides how long pages take.
// Decisions never read it: they read pass.Now.
func (r *Reaper) WithStopwatch(c clock.Clock) *Reaper {
	r.SetStopwatch(c)
	return r
}

// Reap runs one pass: it drains the listing of attempts parked longer than
// the TTL (oldest first, a page at a time, within the phase budget, going
// on next pass from where this one stopped), judges each page, and marks
// the attempts that passed both gates. One decision per attempt judged.
func (r *Reaper) Reap(ctx context.Context, pass sdk.Pass, board sdk.Board, exec sdk.Executions, sink sdk.Sink) (sdk.PassResult, error) {
	p := &passRun{cfg: r.Config(), pass: pass, board: board, exec: exec,
		rec: reap.NewRecorder(Name, pass, sink), lite: pass.Edition == ladder.EditionLite}
	executor := sdk.ExecutorKube
	if p.lite {
		executor = sdk.ExecutorLite
	}
	return reap.Run(ctx, pass, p.rec, reap.Spec{
		Name: Name, Logger: r.Logger(), Stopwatch: r.Stopwatch(), MaxPages: p.cfg.MaxPages,
		Listings: []reap.Listing{reap.Candidates(listParked, board, sdk.CandidateQuery{
			// up_for_retry is left out: the retry rail brings it back.
			States:    []string{sdk.StateUpForReschedule, sdk.StateDeferred},
			Executors: []string{executor},
			OrderBy:   sdk.FieldEndedAt,
			OlderThan: pass.Now.Add(-p.cfg.TTL),
		}, p.judgePage)},
	})
}

var _ sdk.Reaper = (*Reaper)(nil)

// passRun is one pass's view: the configuration read once at its start.
type passRun struct {
	cfg   Config
	pass  sdk.Pass
	board sdk.Board
	exec  sdk.Executions
	rec   *reap.Recorder
	lite  bool
}

// judgePage asks the substrate about the whole page in one call, judges
// each attempt, and settles the marks: guarded writes, one decision each.
func (p *passRun) judgePage(ctx context.Context, page []sdk.Candidate) error {
	attempts := make([]sdk.Attempt, len(page))
	for i, c := range page {
		attempts[i] = c.Attempt
	}
	// Kube: a mark must rest on an authoritative read, never the cache.
	answers := reap.ReadLiveness(ctx, p.exec, p.pass.Now, attempts, !p.lite)

	var planned []reap.Planned
	for _, c := range page {
		live := answers[c.Attempt]
		v := judge(c, p.pass.Now, p.cfg.TTL, live)
		if v.act == actNone {
			continue
		}
		ev := reap.CandidateEvidence(p.pass, c, p.cfg.TTL).Liveness(live)
		ev[EvParkedFor] = reap.Age(p.pass.Now, c.EndedAt)
		if v.act == actDefer {
			p.rec.Add(v.label, c.Attempt, false, v.detail, ev)
			continue
		}
		planned = append(planned, p.plan(c, v, ev))
	}
	return reap.Settle(ctx, p.board, p.rec, planned, nil)
}

// plan builds the guarded mark: still this attempt (try and epoch), still
// in the parked state it was listed in, under this term.
func (p *passRun) plan(c sdk.Candidate, v verdict, ev reap.Evidence) reap.Planned {
	ev[reap.EvMark] = LabelExpired
	ev[reap.EvSignal] = reap.SignalPositive
	ev[reap.EvPolicy] = string(p.cfg.Policy)
	return reap.Planned{
		Mark: sdk.Mark{
			Attempt:    c.Attempt,
			FromStates: []string{c.State},
			Kind:       sdk.MarkInfra,
			Reason:     LabelExpired,
			Message:    LabelExpired + ": " + v.detail,
			Hold:       p.cfg.Hold(),
			Term:       p.pass.Term,
			At:         p.pass.Now,
		},
		Label: v.label, Detail: v.detail, Evidence: ev,
	}
}

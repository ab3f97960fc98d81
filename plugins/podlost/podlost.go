// Package podlost is the pod-lost reaper (kube edition): a running attempt
// whose pod is gone is failed on the infra rail as pod_lost.
//
// The listing holds the kube attempts in running that entered running more
// than pod_lost_floor ago (the floor is applied by the board, before the
// page limit), oldest first, a page of 100 at a time with the keyset cursor
// kept between passes, drained within the phase budget. Warm-pool attempts
// are not listed: they run in a warm worker's pod, not a pod of their own
// (the warmworker reaper judges them).
//
// Each page's attempts are put to the substrate in one liveness read. The
// kube substrate answers a cached Pending or Running pod with no API call
// and reads every other attempt live; it never answers "dead" from its
// cache. An attempt is marked only when the read says it has no pod object
// at all: a finished or unreachable pod is still present (its outcome is
// the reconciler's), and a read error defers (pod_lost_pod_query_error).
// The mark is provisional (the sweep confirms it, or the valve opens). Every
// mark rests on a positive signal, so the mass-reap brake never holds one
// back.
//
// The marked attempts' pods are torn down after the pass's marks, not
// between them: a teardown costs an API read of its own, and a lost node
// pool must not wait for thousands of them before its last attempt is
// marked. Teardowns run while the phase budget lasts; those it leaves are
// carried in the pass state and done first by the next pass. A teardown
// that fails is recorded as pod_lost_pod_delete_error and never undoes the
// mark.
//
// A present pod is the normal case and makes no decision, so a pass over a
// healthy fleet records nothing; the one exception is an attempt running
// past the floor that never heartbeated, whose present pod is recorded as
// pod_lost_pod_present (the window before the first heartbeat is this
// reaper's, not agentlost's).
package podlost

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/reap"
)

// Name is the label the reaper is configured under.
const Name = "podlost"

// listRunning names the listing (the key of its cursor in the pass state).
const listRunning = "running"

// Config is the reaper's configuration block.
type Config struct {
	reap.PolicySetting
	reap.DrainSetting
}

// DefaultConfig is the configuration of a block that sets nothing.
func DefaultConfig() Config { return Config{PolicySetting: reap.DefaultPolicy()} }

// Reaper is the pod-lost reaper. Its zero value is not usable; call New.
type Reaper struct {
	logger    hclog.Logger
	stopwatch clock.Clock

	cfg atomic.Pointer[Config] // set by Configure, read once a pass
}

var _ sdk.Reaper = (*Reaper)(nil)

// New returns the reaper with its default configuration. A nil logger
// discards.
func New(logger hclog.Logger) *Reaper {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	r := &Reaper{logger: logger, stopwatch: clock.Real{}}
	cfg := DefaultConfig()
	r.cfg.Store(&cfg)
	return r
}

// Info describes the plugin.
func (r *Reaper) Info(context.Context) (sdk.Info, error) {
	return sdk.Info{Name: Name, Kind: sdk.KindReaper, Version: sdk.BuildVersion,
		Editions:    []string{ladder.EditionKube},
		Description: "fails running attempts that have no pod left (pod_lost)"}, nil
}

// ConfigSchema declares policy and drain_max_pages.
func (r *Reaper) ConfigSchema(context.Context) (sdk.Schema, error) {
	return sdk.SchemaOf(DefaultConfig()), nil
}

// Configure validates and applies the decoded block; an error names the
// offending attribute.
func (r *Reaper) Configure(_ context.Context, req sdk.ConfigureRequest) error {
	cfg := DefaultConfig()
	if err := req.Values.Decode(&cfg); err != nil {
		return err
	}
	r.cfg.Store(&cfg)
	return nil
}

// Reap runs one pass: one decision per attempt marked or deferred, plus
// one per teardown that failed or fell back.
func (r *Reaper) Reap(ctx context.Context, pass sdk.Pass, board sdk.Board, exec sdk.Executions, sink sdk.Sink) (sdk.PassResult, error) {
	p := &passRun{log: r.logger, cfg: *r.cfg.Load(), pass: pass, board: board, exec: exec,
		rec: reap.NewRecorder(Name, pass, sink), watch: r.stopwatch, started: r.stopwatch.Now()}
	st := reap.LoadState(pass, r.logger)
	p.teardowns = st.TakeOwed(owedTeardown)
	return reap.Run(ctx, pass, p.rec, reap.Spec{
		Name: Name, Logger: r.logger, Stopwatch: r.stopwatch, MaxPages: p.cfg.MaxPages,
		Listings: []reap.Listing{reap.Candidates(listRunning, board, sdk.CandidateQuery{
			States: []string{sdk.StateRunning}, Executors: []string{sdk.ExecutorKube},
			OrderBy: sdk.FieldRunningAt, OlderThan: pass.Now.Add(-pass.Ladder.PodLostFloor),
		}, p.judgePage)},
		Finish: p.tearDown,
		State:  st,
		Save: func(st *reap.State, _ reap.DrainStats) {
			for _, a := range p.teardowns {
				st.Owe(owedTeardown, a)
			}
		},
	})
}

// owedTeardown is the kind, in the pass state, of marked attempts whose
// teardown a pass did not get to.
const owedTeardown = "teardown"

type passRun struct {
	log   hclog.Logger
	cfg   Config
	pass  sdk.Pass
	board sdk.Board
	exec  sdk.Executions
	rec   *reap.Recorder

	watch   clock.Clock
	started time.Time
	// teardowns: marked attempts whose pods are still to be torn down,
	// those owed by earlier passes first.
	teardowns []sdk.Attempt
}

// judgePage reads the page's pods in one call, judges each attempt, then
// marks and tears down the lost ones.
func (p *passRun) judgePage(ctx context.Context, page []sdk.Candidate) error {
	attempts := make([]sdk.Attempt, len(page))
	for i, c := range page {
		attempts[i] = c.Attempt
	}
	answers := reap.ReadLiveness(ctx, p.exec, p.pass.Now, attempts, false)
	var planned []reap.Planned
	for _, c := range page {
		live := answers[c.Attempt]
		j := judge(c, p.pass.Now, p.pass.Ladder, live)
		if j.act == actNone {
			continue
		}
		ev := reap.CandidateEvidence(p.pass, c, p.pass.Ladder.PodLostFloor).Liveness(live)
		if j.act == actDefer {
			p.rec.Add(j.label, c.Attempt, false, j.detail, ev)
			continue
		}
		ev[reap.EvMark] = sdk.LabelPodLost
		ev[reap.EvSignal] = reap.SignalPositive
		ev[reap.EvPolicy] = string(p.cfg.Policy)
		planned = append(planned, reap.Planned{
			Mark: sdk.Mark{
				Attempt:    c.Attempt,
				FromStates: []string{sdk.StateRunning},
				Kind:       sdk.MarkInfra,
				Reason:     sdk.LabelPodLost,
				Message:    sdk.LabelPodLost + ": " + j.detail,
				Hold:       p.cfg.Hold(),
				Term:       p.pass.Term,
				At:         p.pass.Now,
			},
			Label: j.label, Detail: j.detail, Evidence: ev,
		})
	}
	return reap.Settle(ctx, p.board, p.rec, planned, p.afterMark)
}

// afterMark queues the marked attempt's teardown for the end of the pass.
func (p *passRun) afterMark(_ context.Context, pl *reap.Planned) []reap.FollowUp {
	p.teardowns = append(p.teardowns, pl.Mark.Attempt)
	pl.Evidence[reap.EvTeardown] = "after the pass's marks"
	return nil
}

// tearDown tears down exactly each marked attempt's pod (normally there is
// none; one created since the read belongs to an attempt that is now
// failed) while the phase budget lasts, keeping a tenth of it in hand, and
// leaves the rest to the next pass. A failure is recorded against the
// attempt; its mark stays.
func (p *passRun) tearDown(ctx context.Context, _ reap.DrainStats) error {
	if p.pass.DryRun {
		return nil // a dry run stops nothing; what is owed stays owed
	}
	done := 0
	for _, a := range p.teardowns {
		if ctx.Err() != nil || !p.timeLeft() {
			break
		}
		ev := reap.Evidence{reap.EvTerm: strconv.FormatInt(p.pass.Term, 10), reap.EvEdition: p.pass.Edition,
			reap.EvMark: sdk.LabelPodLost}
		for _, f := range reap.TeardownAttempt(ctx, p.exec, p.pass, a, sdk.LabelPodLost, sdk.LabelPodLostPodDeleteErr, ev) {
			p.rec.Add(f.Label, a, f.Applied, f.Detail, f.Evidence)
		}
		done++
	}
	p.teardowns = p.teardowns[done:]
	if len(p.teardowns) > 0 {
		p.log.Info("teardowns left to the next pass: the phase budget is spent", "done", done, "left", len(p.teardowns))
	}
	return p.rec.Flush(ctx)
}

// timeLeft reports whether another teardown may start: more than a tenth of
// the phase budget is left (always, for a pass without a deadline).
func (p *passRun) timeLeft() bool {
	if p.pass.Deadline.IsZero() {
		return true
	}
	total := p.pass.Deadline.Sub(p.pass.Now)
	return p.watch.Now().Sub(p.started) < total-total/10
}

type action int

const (
	actNone  action = iota // healthy, or not this reaper's yet: no decision
	actDefer               // leave it, say why
	actMark                // mark it pod_lost
)

type judgment struct {
	act    action
	label  string
	detail string
}

// judge is the policy for one listed attempt, given the substrate's answer
// about its pods.
func judge(c sdk.Candidate, now time.Time, l ladder.Ladder, live reap.Answer) judgment {
	if c.RunningAt.IsZero() || now.Sub(c.RunningAt) <= l.PodLostFloor {
		return judgment{act: actNone}
	}
	running := now.Sub(c.RunningAt).Round(time.Millisecond)
	switch {
	case live.Unknown():
		return judgment{act: actDefer, label: sdk.LabelPodLostPodQueryErr, detail: live.Why()}
	case live.State == sdk.Alive && c.LastHeartbeatAt.IsZero():
		return judgment{act: actDefer, label: sdk.LabelPodLostPodPresent,
			detail: fmt.Sprintf("running for %s without a heartbeat, but %s", running, live.Why())}
	case live.State == sdk.Alive:
		return judgment{act: actNone}
	}
	return judgment{act: actMark, label: sdk.LabelPodLost,
		detail: fmt.Sprintf("running for %s (floor %s); no pod of the attempt", running, l.PodLostFloor)}
}

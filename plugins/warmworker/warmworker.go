// Package warmworker is the warm-worker-lost reaper (kube warm pool): an
// attempt bound to a warm worker that a live LIST of the warm pool shows
// gone is failed on the infra rail as warm_worker_lost.
//
// The listing holds the warm attempts (executor warm) in queued or running,
// oldest queue time first, a page of 100 at a time with the keyset cursor
// kept between passes, drained within the phase budget. Only once the pass
// has listed its attempts does it LIST the warm pool, live (never a cache),
// so a worker an attempt was bound to before the listing is in the LIST if
// it exists. A worker is gone when no pod of the pool carries its name;
// a pod of it in any phase is present (a finished worker's attempts fall to
// agentlost once their heartbeats stop). A LIST that fails aborts the pass
// with no mark at all (warm_worker_list_error), and its cursor is kept.
//
// A mark names the attempt (try and epoch) and the states it may move from,
// and is confirmed as it is made: the worker's pod is gone, and no
// reconciler ever reads an outcome record for a warm attempt, so nothing
// could confirm it later. The reaper never deletes a pod: a warm worker
// outlives its attempts. Every mark rests on a positive signal (the live
// LIST), so the mass-reap brake never holds one back.
//
// A warm attempt's wall-clock bound is the worker's attempt watchdog, not a
// pod deadline; it is the credential ceiling (ladder.WarmAttemptWatchdog).
// The worker reports an attempt its watchdog ends as credential_ceiling;
// one whose report cannot land goes silent, and agentlost fails it the same
// way, without tearing anything down.
package warmworker

import (
	"context"
	"fmt"
	"strconv"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/reap"
)

// Name is the label the reaper is configured under.
const Name = "warmworker"

// Evidence keys of this reaper's decisions.
const (
	EvWarmWorker = "warm_worker"  // the worker the attempt is bound to
	EvPoolSize   = "warm_workers" // how many pods the live LIST found
)

const listWarm = "warm"

// Config is the reaper's configuration block.
type Config struct {
	reap.PolicySetting
	reap.DrainSetting
}

// DefaultConfig is the configuration of a block that sets nothing.
func DefaultConfig() Config { return Config{PolicySetting: reap.DefaultPolicy()} }

// Reaper is the warm-worker-lost reaper. Its zero value is not usable; call
// New.
type Reaper struct{ *reap.Base[Config] }

// New returns the reaper with its default configuration. A nil logger
// discards.
func New(logger hclog.Logger) *Reaper {
	return &Reaper{reap.NewBase(logger, DefaultConfig, sdk.Info{Name: Name, Editions: []string{ladder.EditionKube}, MarkReasons: []string{sdk.LabelWarmWorkerLost},
		DecisionLabels: []string{sdk.LabelWarmWorkerListErr},
		KillLabels:     []string{sdk.LabelWarmWorkerLost}, ProvisionalLabels: []string{sdk.LabelWarmWorkerLost},
		Description: "fails attempts whose warm worker pod is gone (warm_worker_lost)"})}
}

// Reap runs one pass: one decision per attempt whose worker is gone, or
// one warm_worker_list_error when the pool could not be listed.
func (r *Reaper) Reap(ctx context.Context, pass sdk.Pass, board sdk.Board, exec sdk.Executions, sink sdk.Sink) (sdk.PassResult, error) {
	st := reap.LoadState(pass, r.Logger())
	p := &passRun{log: r.Logger(), cfg: r.Config(), pass: pass, board: board, exec: exec,
		rec: reap.NewRecorder(Name, pass, sink)}
	prev := st.Cursors[listWarm]
	_, hadPrev := st.Cursors[listWarm]
	res, err := reap.Run(ctx, pass, p.rec, reap.Spec{
		Name: Name, Logger: r.Logger(), Stopwatch: r.Stopwatch(), MaxPages: p.cfg.MaxPages,
		Listings: []reap.Listing{reap.Candidates(listWarm, board, sdk.CandidateQuery{
			States: []string{sdk.StateQueued, sdk.StateRunning}, Executors: []string{sdk.ExecutorWarm},
			OrderBy: sdk.FieldQueuedAt, OlderThan: pass.Now,
		}, p.collect)},
		Finish: p.finish,
		State:  st,
		Save: func(st *reap.State, _ reap.DrainStats) {
			if p.listFailed {
				// The pass judged nothing: the next one reads the same
				// pages again.
				delete(st.Cursors, listWarm)
				if hadPrev {
					st.Cursors[listWarm] = prev
				}
			}
		},
	})
	return res, err
}

var _ sdk.Reaper = (*Reaper)(nil)

type passRun struct {
	log   hclog.Logger
	cfg   Config
	pass  sdk.Pass
	board sdk.Board
	exec  sdk.Executions
	rec   *reap.Recorder

	bound      []sdk.Candidate // listed attempts bound to a worker
	listFailed bool
}

// collect keeps the listed attempts that name a worker; they are judged
// once the pass has listed them all.
func (p *passRun) collect(_ context.Context, page []sdk.Candidate) error {
	for _, c := range page {
		if c.WarmWorker != "" {
			p.bound = append(p.bound, c)
		}
	}
	return nil
}

// finish lists the warm pool live and marks the attempts whose worker is
// not in it. A LIST error marks nothing.
func (p *passRun) finish(ctx context.Context, _ reap.DrainStats) error {
	if len(p.bound) == 0 {
		return nil
	}
	workers, err := p.exec.WarmWorkers(ctx)
	if err != nil {
		p.listFailed = true
		p.log.Warn("listing the warm pool failed: no attempt judged this pass", "attempts", len(p.bound), "error", err)
		p.rec.Add(sdk.LabelWarmWorkerListErr, sdk.Attempt{}, false,
			fmt.Sprintf("listing the warm pool failed; %d bound attempts left unjudged: %v", len(p.bound), err),
			reap.Evidence{reap.EvTerm: strconv.FormatInt(p.pass.Term, 10), reap.EvEdition: p.pass.Edition,
				reap.EvError: err.Error()})
		return nil
	}
	present := make(map[string]string, len(workers))
	for _, w := range workers {
		present[w.Name] = w.Phase
	}
	var planned []reap.Planned
	for _, c := range p.bound {
		if _, ok := present[c.WarmWorker]; ok {
			continue
		}
		detail := fmt.Sprintf("bound to warm worker %s, which a live list of the pool (%d pods) does not hold",
			c.WarmWorker, len(workers))
		ev := reap.CandidateEvidence(p.pass, c, 0)
		delete(ev, reap.EvThreshold)
		ev[EvWarmWorker] = c.WarmWorker
		ev[EvPoolSize] = strconv.Itoa(len(workers))
		ev[reap.EvLiveness] = string(sdk.Dead)
		ev[reap.EvLivenessLive] = "true"
		ev[reap.EvMark] = sdk.LabelWarmWorkerLost
		ev[reap.EvSignal] = reap.SignalPositive
		ev[reap.EvPolicy] = string(p.cfg.Policy)
		planned = append(planned, reap.Planned{
			Mark: sdk.Mark{
				Attempt:    c.Attempt,
				FromStates: []string{sdk.StateQueued, sdk.StateRunning},
				Kind:       sdk.MarkInfra,
				Reason:     sdk.LabelWarmWorkerLost,
				Message:    sdk.LabelWarmWorkerLost + ": " + detail,
				Hold:       p.cfg.Hold(),
				Term:       p.pass.Term,
				At:         p.pass.Now,
			},
			Label: sdk.LabelWarmWorkerLost, Detail: detail, Evidence: ev,
		})
	}
	return reap.Settle(ctx, p.board, p.rec, planned, nil)
}

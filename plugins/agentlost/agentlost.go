// Package agentlost is the agent-lost reaper: a running attempt whose
// agent heartbeated in this attempt and then went silent past the
// agent_lost threshold is failed on the infra rail as agent_lost, or, when
// its silence began past the credential ceiling, as a task failure
// credential_ceiling.
//
// On kube the mark is provisional (the reconciler confirms it) and the
// attempt's pod is torn down after it. On Lite nothing is marked unless the
// substrate reads the agent and its task group dead: alive or unknown
// defers, an orphaned task group whose agent is dead is stopped first, an
// attempt that never heartbeated is judged on that positive signal alone,
// and an attempt still alive past the credential ceiling is ended. Lite
// marks are confirmed as they are made.
//
// The policy is a set of pure functions of the candidate, the substrate's
// answer and the pass's time (policy.go); the pass (pass.go) lists, asks,
// and acts on their verdicts.
package agentlost

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/plugins/internal/reapkit"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// Name is the label the reaper is configured under.
const Name = "agentlost"

// KilledLine is the try-log line written once an attempt ended at the
// credential ceiling has exited: the last line of its log.
const KilledLine = "killed: credential_ceiling"

type settings struct {
	policy   string
	brake    reapkit.Brake
	maxPages int
}

// Reaper is the agent-lost reaper. Its zero value is not usable; call New.
type Reaper struct {
	logger    hclog.Logger
	stopwatch clock.Clock // measures a pass's elapsed time against its budget

	cfg atomic.Pointer[settings] // set by Configure, read once a pass
}

var _ sdk.Reaper = (*Reaper)(nil)

// New returns the reaper with its default configuration. A nil logger
// discards.
func New(logger hclog.Logger) *Reaper {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	r := &Reaper{logger: logger, stopwatch: clock.Real{}}
	r.cfg.Store(&settings{policy: reapkit.PolicyReplace, brake: reapkit.DefaultBrake()})
	return r
}

// Info describes the plugin.
func (r *Reaper) Info(context.Context) (sdk.Info, error) {
	return sdk.Info{Name: Name, Kind: sdk.KindReaper, Version: sdk.BuildVersion,
		Editions:    []string{ladder.EditionLite, ladder.EditionKube},
		Description: "fails running attempts whose agent went silent (agent_lost), or outlived the credential ceiling"}, nil
}

func schema() sdk.Schema {
	attrs := []sdk.Attribute{reapkit.PolicyAttribute(), reapkit.DrainAttribute()}
	return sdk.Schema{Attributes: append(attrs, reapkit.BrakeAttributes()...)}
}

// ConfigSchema declares policy, drain_max_pages, brake_share, brake_min and
// brake_max.
func (r *Reaper) ConfigSchema(context.Context) (sdk.Schema, error) { return schema(), nil }

// Configure validates and applies the decoded block; an error names the
// offending attribute.
func (r *Reaper) Configure(_ context.Context, req sdk.ConfigureRequest) error {
	s := schema()
	if err := reapkit.CheckKnown(s, req.Values); err != nil {
		return fmt.Errorf("configure %s: %w", Name, err)
	}
	var cfg settings
	var err error
	if cfg.policy, err = reapkit.ParsePolicy(req.Values); err != nil {
		return fmt.Errorf("configure %s: %w", Name, err)
	}
	if cfg.brake, err = reapkit.ParseBrake(req.Values); err != nil {
		return fmt.Errorf("configure %s: %w", Name, err)
	}
	if cfg.maxPages, err = reapkit.ParseDrainMaxPages(req.Values); err != nil {
		return fmt.Errorf("configure %s: %w", Name, err)
	}
	r.cfg.Store(&cfg)
	return nil
}

func (r *Reaper) settings() settings { return *r.cfg.Load() }

// Reap runs one pass. It returns one decision per attempt judged, plus one
// per teardown that failed or fell back. On an error of the board the
// decisions made so far are returned with it, and the state keeps the
// cursor of the page that failed.
func (r *Reaper) Reap(ctx context.Context, pass sdk.Pass, board sdk.Board, exec sdk.Executions) (sdk.PassResult, error) {
	p := newPass(r.logger, r.settings(), pass, board, exec)
	st, err := reapkit.DecodeState(pass.State)
	if err != nil {
		r.logger.Warn("starting every listing over", "error", err)
	}
	budget := reapkit.NewBudget(r.stopwatch, pass, p.cfg.maxPages)
	stats, err := reapkit.Drain(ctx, budget, st, p.listings()...)
	if err == nil {
		err = p.finish(ctx)
	}
	state, encErr := st.Encode()
	res := sdk.PassResult{Decisions: p.rec.Decisions(), State: state}
	if err != nil {
		return res, fmt.Errorf("%s pass: %w", Name, err)
	}
	if encErr != nil {
		return res, fmt.Errorf("%s pass: %w", Name, encErr)
	}
	if n := len(res.Decisions); n > 0 {
		r.logger.Debug("pass done", "decisions", n, "judged", p.judged, "pages", stats.Pages,
			"exhausted", stats.Exhausted, "elapsed", budget.Elapsed())
	}
	return res, nil
}

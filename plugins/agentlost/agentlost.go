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
	"sync/atomic"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/reap"
)

// Name is the label the reaper is configured under.
const Name = "agentlost"

// CeilingMessage is the error_message of an attempt failed at the
// credential ceiling, word for word what operators search their logs for.
const CeilingMessage = "credential_ceiling: attempt outlived auth.max_attempt_credential_lifetime"

// KilledLine is the try-log line written once an attempt ended at the
// credential ceiling has exited: the last line of its log.
const KilledLine = "killed: credential_ceiling"

// Config is the reaper's configuration block.
type Config struct {
	reap.PolicySetting
	reap.DrainSetting
	reap.Brake
}

// DefaultConfig is the configuration of a block that sets nothing.
func DefaultConfig() Config {
	return Config{PolicySetting: reap.DefaultPolicy(), Brake: reap.DefaultBrake()}
}

// Reaper is the agent-lost reaper. Its zero value is not usable; call New.
type Reaper struct {
	logger    hclog.Logger
	stopwatch clock.Clock // measures a pass's elapsed time against its budget

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
		Editions:    []string{ladder.EditionLite, ladder.EditionKube},
		Description: "fails running attempts whose agent went silent (agent_lost), or outlived the credential ceiling"}, nil
}

// ConfigSchema declares policy, drain_max_pages, brake_share, brake_min and
// brake_max.
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

// Reap runs one pass: one decision per attempt judged, plus one per
// teardown that failed or fell back.
func (r *Reaper) Reap(ctx context.Context, pass sdk.Pass, board sdk.Board, exec sdk.Executions, sink sdk.Sink) (sdk.PassResult, error) {
	cfg := *r.cfg.Load()
	p := newPass(r.logger, cfg, pass, board, exec, sink)
	p.state = reap.LoadState(pass, r.logger)
	p.stopping = reap.TakeStopping(p.state)
	if p.lite && !pass.DryRun {
		p.settleKillLines(ctx)
	}
	return reap.Run(ctx, pass, p.rec, reap.Spec{
		Name: Name, Logger: r.logger, Stopwatch: r.stopwatch, MaxPages: cfg.MaxPages,
		Listings: p.listings(), Backlog: p.backlog, Finish: p.finish, State: p.state, Save: p.stopping.Keep,
	})
}

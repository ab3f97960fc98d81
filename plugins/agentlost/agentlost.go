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

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk"
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
type Reaper struct{ *reap.Base[Config] }

// New returns the reaper with its default configuration. A nil logger
// discards.
func New(logger hclog.Logger) *Reaper {
	return &Reaper{reap.NewBase(logger, DefaultConfig, sdk.Info{Name: Name, Editions: []string{ladder.EditionLite, ladder.EditionKube}, MarkReasons: []string{sdk.LabelAgentLost, sdk.LabelCredentialCeiling},
		DecisionLabels: []string{sdk.LabelAgentLostProcessAlive, sdk.LabelAgentLostProcessQueryErr,
			sdk.LabelAgentLostOrphanStopped, sdk.LabelAgentLostOrphanStopErr, sdk.LabelAgentLostPodDeleteErr,
			sdk.LabelAgentLostNeverHeartbeated, sdk.LabelAgentLostNeverHeartbeatedProcessAlive,
			sdk.LabelAgentLostNeverHeartbeatedProcessQueryErr},
		KillLabels: []string{sdk.LabelAgentLost, sdk.LabelAgentLostNeverHeartbeated, sdk.LabelAgentLostOrphanStopped,
			sdk.LabelCredentialCeiling},
		ProvisionalLabels: []string{sdk.LabelAgentLost, sdk.LabelAgentLostNeverHeartbeated, sdk.LabelAgentLostOrphanStopped},
		Description:       "fails running attempts whose agent went silent (agent_lost), or outlived the credential ceiling"})}
}

// Reap runs one pass: one decision per attempt judged, plus one per
// teardown that failed or fell back.
func (r *Reaper) Reap(ctx context.Context, pass sdk.Pass, board sdk.Board, exec sdk.Executions, sink sdk.Sink) (sdk.PassResult, error) {
	cfg := r.Config()
	p := newPass(r.Logger(), cfg, pass, board, exec, sink)
	p.state = reap.LoadState(pass, r.Logger())
	p.stopping = reap.TakeStopping(p.state)
	if p.lite && !pass.DryRun {
		p.settleKillLines(ctx)
	}
	return reap.Run(ctx, pass, p.rec, reap.Spec{
		Name: Name, Logger: r.Logger(), Stopwatch: r.Stopwatch(), MaxPages: cfg.MaxPages,
		Listings: p.listings(), Backlog: p.backlog, Finish: p.finish, State: p.state, Save: p.stopping.Keep,
	})
}

var _ sdk.Reaper = (*Reaper)(nil)

package agentlost

import (
	"context"
	"fmt"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/reap"
)

// Listing names: the keys of the cursors in the pass state.
const (
	listSilent = "silent"            // heartbeated, silent past agent_lost
	listNever  = "never_heartbeated" // Lite: running past agent_lost, no heartbeat
	listCeil   = "ceiling"           // Lite: running past the credential ceiling
)

// owedKillLine is the kind, in the pass state, of attempts ended at the
// credential ceiling whose kill line waits for their processes to be gone.
const owedKillLine = "kill_line"

// passRun is one pass of the reaper.
type passRun struct {
	log   hclog.Logger
	cfg   Config
	pass  sdk.Pass
	board sdk.Board
	exec  sdk.Executions
	rec   *reap.Recorder
	lite  bool
	state *reap.State // carries the kill lines still owed between passes
	// stopping: attempts whose orphan stop is in flight (carried in state)
	stopping reap.Stopping

	seen   map[sdk.Attempt]bool // judged in this pass (listings overlap)
	judged int
	// backlog: the marks on a positive signal, settled a few pages at a
	// time (reap.MarkBatch) and at the end of the drain.
	backlog *reap.Backlog
	// held: marks decided on silence alone, applied at the end of the pass
	// once the brake has seen every attempt the pass judged.
	held []reap.Planned
}

func newPass(log hclog.Logger, cfg Config, pass sdk.Pass, board sdk.Board, exec sdk.Executions, sink sdk.Sink) *passRun {
	p := &passRun{log: log, cfg: cfg, pass: pass, board: board, exec: exec,
		rec: reap.NewRecorder(Name, pass, sink), lite: pass.Edition == ladder.EditionLite,
		seen: map[sdk.Attempt]bool{}}
	p.backlog = reap.NewBacklog(board, p.rec, p.afterMark)
	return p
}

// listings are the candidate listings of the pass, each with its threshold
// applied in the query.
func (p *passRun) listings() []reap.Listing {
	now, l := p.pass.Now, p.pass.Ladder
	executors := []string{sdk.ExecutorKube, sdk.ExecutorWarm}
	if p.lite {
		executors = []string{sdk.ExecutorLite}
	}
	running := []string{sdk.StateRunning}
	out := []reap.Listing{reap.Candidates(listSilent, p.board, sdk.CandidateQuery{
		States: running, Executors: executors, OrderBy: sdk.FieldHeartbeatAt,
		OlderThan: now.Add(-l.AgentLost), Heartbeat: sdk.HeartbeatSeen,
	}, p.judgePage)}
	if !p.lite {
		return out
	}
	out = append(out, reap.Candidates(listNever, p.board, sdk.CandidateQuery{
		States: running, Executors: executors, OrderBy: sdk.FieldRunningAt,
		OlderThan: now.Add(-l.AgentLost), Heartbeat: sdk.HeartbeatNever,
	}, p.judgePage))
	if l.CeilingEnabled() {
		out = append(out, reap.Candidates(listCeil, p.board, sdk.CandidateQuery{
			States: running, Executors: executors, OrderBy: sdk.FieldRunningAt,
			OlderThan: now.Add(-l.CredentialCeiling),
		}, p.judgePage))
	}
	return out
}

// judgePage judges one page: one liveness read for the page, one verdict
// per attempt, then the stops and the marks the verdicts ask for.
func (p *passRun) judgePage(ctx context.Context, page []sdk.Candidate) error {
	fresh := make([]sdk.Candidate, 0, len(page))
	attempts := make([]sdk.Attempt, 0, len(page))
	var warm []sdk.Attempt
	for _, c := range page {
		if p.seen[c.Attempt] {
			continue
		}
		p.seen[c.Attempt] = true
		fresh = append(fresh, c)
		if c.Executor == sdk.ExecutorWarm {
			warm = append(warm, c.Attempt) // no pod of its own: nothing to read
			continue
		}
		attempts = append(attempts, c.Attempt)
	}
	answers := reap.ReadLivenessRecorded(ctx, p.exec, p.pass.Now, attempts, reap.RecordedPodUIDs(fresh), false)
	for _, a := range warm {
		answers[a] = reap.Answer{AttemptLiveness: sdk.AttemptLiveness{Attempt: a, State: sdk.Unknown,
			Detail: "a warm attempt has no pod of its own: not read"}}
	}

	now := make([]reap.Planned, 0, len(fresh))
	var stopAfter []reap.Planned
	for _, c := range fresh {
		live := answers[c.Attempt]
		var j judgment
		if p.lite {
			j = judgeLite(c, p.pass.Now, p.pass.Ladder, live)
		} else {
			j = judgeKube(c, p.pass.Now, p.pass.Ladder, live)
		}
		if j.act == actNone {
			continue
		}
		if j.act == actMark && p.stopping.Settled(c.Attempt) {
			// An earlier pass began stopping its orphaned group; this one
			// finds everything gone.
			j.label = sdk.LabelAgentLostOrphanStopped
			j.detail += "; its orphaned task group was stopped"
		}
		p.judged++
		ev := evidence(p.pass, c, live, j)
		switch j.act {
		case actDefer:
			p.rec.Add(j.label, c.Attempt, false, j.detail, ev)
		case actMark:
			pl := p.plan(c, j, ev)
			if j.positive {
				now = append(now, pl)
			} else {
				p.held = append(p.held, pl)
			}
		case actStopThenMark:
			if pl, ok := p.stopOrphan(ctx, c, j, ev); ok {
				now = append(now, pl)
			}
		case actMarkThenStop:
			stopAfter = append(stopAfter, p.plan(c, j, ev))
		}
	}
	if err := p.backlog.Add(ctx, now...); err != nil {
		return err
	}
	return reap.Settle(ctx, p.board, p.rec, stopAfter, p.endAtCeiling)
}

// plan builds the guarded mark for a verdict.
func (p *passRun) plan(c sdk.Candidate, j judgment, ev reap.Evidence) reap.Planned {
	m := sdk.Mark{
		Attempt:    c.Attempt,
		FromStates: []string{sdk.StateRunning},
		Kind:       j.kind,
		Reason:     j.reason,
		Message:    message(j, p.pass.Ladder),
		Term:       p.pass.Term,
		At:         p.pass.Now,
	}
	switch j.guard {
	case guardSilent:
		// A heartbeat that lands between the listing and the mark makes
		// the mark a no-op.
		m.HeartbeatBefore = p.pass.Now.Add(-p.pass.Ladder.AgentLost)
	case guardNeverHad:
		m.RequireNoHeartbeat = true
	}
	if j.kind == sdk.MarkInfra {
		m.Hold = p.cfg.Hold()
		ev[reap.EvPolicy] = string(p.cfg.Policy)
	}
	return reap.Planned{Mark: m, Label: j.label, Detail: j.detail, Evidence: ev}
}

// stopOrphan stops the orphaned task group of a silent Lite attempt whose
// agent is dead; the attempt is marked only once the group is gone. A stop
// that fails, or cannot confirm the group gone, defers.
func (p *passRun) stopOrphan(ctx context.Context, c sdk.Candidate, j judgment, ev reap.Evidence) (reap.Planned, bool) {
	if p.pass.DryRun {
		return p.plan(c, j, ev), true // Settle records it unapplied
	}
	if !reap.StopOrphanGroup(ctx, p.exec, p.rec, p.stopping, c.Attempt, reap.OrphanStopLabels{
		InFlight: sdk.LabelAgentLostProcessAlive, Failed: sdk.LabelAgentLostOrphanStopErr,
	}, ev) {
		return reap.Planned{}, false
	}
	p.stopping.Settled(c.Attempt)
	return p.plan(c, j, ev), true
}

// afterMark tears down a marked kube attempt's pod (never a warm worker's:
// it outlives its attempts). Lite has nothing to tear down.
func (p *passRun) afterMark(ctx context.Context, pl *reap.Planned) []reap.FollowUp {
	if p.lite || pl.Evidence[reap.EvExecutor] == sdk.ExecutorWarm {
		return nil
	}
	return reap.TeardownAttempt(ctx, p.exec, p.pass, pl.Mark.Attempt, pl.Mark.Reason, sdk.LabelAgentLostPodDeleteErr, pl.Evidence)
}

// endAtCeiling stops the task group of an attempt marked at the credential
// ceiling. Its kill line is written only once the group and the agent are
// both gone, so it is the last line of the try log: at once when the stop
// says so, otherwise on a later pass (the attempt is owed in the pass
// state). A failed stop leaves the mark (the agent is told to terminate at
// its next heartbeat) and is logged.
func (p *passRun) endAtCeiling(ctx context.Context, pl *reap.Planned) []reap.FollowUp {
	a := pl.Mark.Attempt
	res, err := p.exec.StopOrphan(ctx, sdk.StopRequest{Attempt: a, Reason: sdk.StopCredentialCeiling})
	switch {
	case err != nil:
		pl.Evidence[reap.EvStop] = "error: " + err.Error()
		p.log.Warn("marked at the credential ceiling, but stopping its task group failed", "attempt", a.String(), "error", err)
		return nil
	case !res.Stopped:
		pl.Evidence[reap.EvStop] = "not yet gone: " + res.Detail
		p.log.Info("marked at the credential ceiling; its kill line waits until its processes are gone", "attempt", a.String(), "detail", res.Detail)
		p.state.Owe(owedKillLine, a)
		return nil
	}
	pl.Evidence[reap.EvStop] = "stopped: " + res.Detail
	if err := p.writeKillLine(ctx, a); err != nil {
		pl.Evidence[reap.EvError] = err.Error()
	}
	return nil
}

// settleKillLines writes the kill lines owed by earlier passes whose
// attempts are now gone, and keeps owing the others.
func (p *passRun) settleKillLines(ctx context.Context) {
	for _, a := range p.state.TakeOwed(owedKillLine) {
		res, err := p.exec.StopOrphan(ctx, sdk.StopRequest{Attempt: a, Reason: sdk.StopCredentialCeiling})
		if err != nil || !res.Stopped {
			p.state.Owe(owedKillLine, a)
			continue
		}
		if err := p.writeKillLine(ctx, a); err != nil {
			p.state.Owe(owedKillLine, a)
		}
	}
}

func (p *passRun) writeKillLine(ctx context.Context, a sdk.Attempt) error {
	if err := p.board.AppendLog(ctx, p.pass.Term, []sdk.LogLine{{Attempt: a, At: p.pass.Now, Line: KilledLine}}); err != nil {
		p.log.Warn("ended at the credential ceiling, but its try log was not written", "attempt", a.String(), "error", err)
		return fmt.Errorf("append try log: %w", err)
	}
	return nil
}

// finish applies the marks decided on silence alone, as far as the brake
// allows, and defers the rest.
func (p *passRun) finish(ctx context.Context, _ reap.DrainStats) error {
	v := p.cfg.Brake.Judge(p.judged, len(p.held))
	apply, back := p.held[:v.Allowed], p.held[v.Allowed:]
	if v.Engaged {
		p.log.Warn("brake engaged: marks on heartbeat silence alone exceed the configured share; a control-plane fault is likelier than mass agent death",
			"judged", v.Judged, "silence_only", v.SilenceOnly, "marking", v.Allowed, "deferred", len(back),
			"brake_share", p.cfg.Brake.Share, "brake_max", p.cfg.Brake.Max)
	}
	if err := reap.Settle(ctx, p.board, p.rec, apply, p.afterMark); err != nil {
		return err
	}
	for _, pl := range back {
		ev := pl.Evidence
		for k, val := range v.Evidence(p.cfg.Brake) {
			ev[k] = val
		}
		p.rec.Add(sdk.LabelBrakeEngaged, pl.Mark.Attempt, false, pl.Label+" deferred: "+v.Detail(p.cfg.Brake), ev)
	}
	return nil
}

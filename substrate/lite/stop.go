package lite

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/lite/proc"
	"github.com/dexaflow/reaper/substrate/lite/records"
)

// StopOrphan stops an attempt's recorded task group: SIGTERM to the whole
// group, up to stop_grace, SIGKILL, up to kill_wait more. Reasons:
//
//   - sdk.StopOrphan: the agent must be dead (it is checked again here); an
//     agent that reads alive or unknown means the group is not an orphan and
//     nothing is signalled.
//   - sdk.StopCredentialCeiling: the attempt is past the credential ceiling
//     and already marked failed; its group is stopped whether or not its
//     agent lives. The agent itself is never signalled: it sees its task end
//     and reports, and the stop then waits up to kill_wait for it to exit.
//     Stopped is true only once the group AND the agent are gone, so the
//     caller's kill line can be the last line of the try log; asked again
//     later, a stop whose group is already gone only looks at the agent.
//
// The escalation can take longer than a reaper's share of the cycle can
// wait (at the defaults, 10 s of grace and 5 s more after SIGKILL). So the
// signalling runs on in the substrate: the call waits for it as long as its
// context allows (leaving a margin before its deadline for the caller to
// finish its pass), and answers InFlight when it cannot wait longer. Asked
// again, it answers from the stop in flight (waiting again), and once that
// stop is over, with its outcome.
//
// Only a group recorded in this record directory whose leader is still the
// recorded process (same PID, same start time, still leading the group) is
// signalled. A group that cannot be verified is not signalled and not
// stopped (the reaper keeps deferring while it runs); a garbled record is
// never signalled. Stopped is true only when no process of the group is left
// running. A stop that was attempted and failed is an error.
func (s *Substrate) StopOrphan(ctx context.Context, req sdk.StopRequest) (sdk.StopResult, error) {
	if req.Reason != sdk.StopOrphan && req.Reason != sdk.StopCredentialCeiling {
		return sdk.StopResult{}, fmt.Errorf("stopping %s: unknown reason %q", req.Attempt, req.Reason)
	}
	st, err := s.settings()
	if err != nil {
		return sdk.StopResult{}, err
	}
	s.stopsMu.Lock()
	run, ok := s.stops[req.Attempt]
	s.stopsMu.Unlock()
	if ok {
		return s.await(ctx, req.Attempt, run)
	}
	return s.stop(ctx, st, req.Attempt, req.Reason)
}

// stopRun is a stop whose signalling goes on in the substrate.
type stopRun struct {
	done  chan struct{}
	began time.Time
	pgid  int
	res   sdk.StopResult // set before done closes
	err   error
}

// begin runs the signalling of a verified group in a goroutine of the
// substrate's and waits for it as long as ctx allows.
func (s *Substrate) begin(ctx context.Context, a sdk.Attempt, pgid int, signal func(context.Context) (sdk.StopResult, error)) (sdk.StopResult, error) {
	run := &stopRun{done: make(chan struct{}), began: s.clock.Now(), pgid: pgid}
	s.stopsMu.Lock()
	s.stops[a] = run
	s.stopsMu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(run.done)
		run.res, run.err = signal(s.stopCtx)
	}()
	return s.await(ctx, a, run)
}

// await waits for a stop in flight until it is over, or until shortly
// before ctx's deadline; an unfinished stop answers InFlight.
func (s *Substrate) await(ctx context.Context, a sdk.Attempt, run *stopRun) (sdk.StopResult, error) {
	var limit <-chan time.Time
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		wait := left - max(500*time.Millisecond, left/10)
		if wait <= 0 {
			wait = 0
		}
		t := time.NewTimer(wait)
		defer t.Stop()
		limit = t.C
	}
	select {
	case <-run.done:
		s.stopsMu.Lock()
		if s.stops[a] == run {
			delete(s.stops, a)
		}
		s.stopsMu.Unlock()
		return run.res, run.err
	case <-ctx.Done():
	case <-limit:
	}
	return sdk.StopResult{InFlight: true, Detail: fmt.Sprintf("stopping group %d: begun %s ago, goes on",
		run.pgid, s.clock.Now().Sub(run.began).Round(time.Millisecond))}, nil
}

func (s *Substrate) stop(ctx context.Context, st *settings, a sdk.Attempt, reason string) (sdk.StopResult, error) {
	log := s.log.With("attempt", a.String(), "reason", reason)
	b := &batch{dir: st.dir, log: log}
	if boot, err := proc.BootID(); err == nil {
		b.boot = boot
	}
	grec, err := st.dir.ReadGroup(a)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return sdk.StopResult{Stopped: true, Detail: "no task group recorded"}, nil
	case errors.Is(err, records.ErrGarbled):
		log.Warn("group record is garbled: not signalling anything", "path", st.dir.GroupPath(a), "error", err)
		return sdk.StopResult{Detail: "group record garbled: not signalled"}, nil
	case err != nil:
		return sdk.StopResult{}, fmt.Errorf("stopping %s: %w", a, err)
	}

	// The agent: for an orphan it must be dead; for the ceiling it is only
	// watched (never signalled).
	agentPID, agentStart := grec.AgentPID, grec.AgentStart
	arec, aerr := st.dir.ReadAgent(a)
	switch {
	case aerr == nil && arec.PID != grec.AgentPID:
		log.Warn("agent and group records name different agents: not signalling anything",
			"agent_pid", arec.PID, "group_agent_pid", grec.AgentPID)
		return sdk.StopResult{Detail: "records disagree on the agent: not signalled"}, nil
	case aerr == nil:
		if agentStart == 0 {
			agentStart = arec.Start
		}
	case errors.Is(aerr, fs.ErrNotExist):
	case errors.Is(aerr, records.ErrGarbled):
		log.Warn("agent record is garbled: not signalling anything", "path", st.dir.AgentPath(a), "error", aerr)
		return sdk.StopResult{Detail: "agent record garbled: not signalled"}, nil
	default:
		return sdk.StopResult{}, fmt.Errorf("stopping %s: %w", a, aerr)
	}
	f := b.facts(false) // fresh reads: this decides a signal
	if reason == sdk.StopOrphan {
		if l := f.agent(agentPID, agentStart, grec.Boot); l != sdk.Dead {
			return sdk.StopResult{Detail: "not an orphan, not signalled: " + f.detail()}, nil
		}
	}

	// The group: signalled only when verified.
	l, verified := f.group(grec)
	switch {
	case l == sdk.Dead && reason == sdk.StopCredentialCeiling:
		if f.agent(agentPID, agentStart, grec.Boot) != sdk.Dead {
			return sdk.StopResult{Detail: "task group gone; agent still running: " + f.detail()}, nil
		}
		return sdk.StopResult{Stopped: true, Detail: "task group and agent gone: " + f.detail()}, nil
	case l == sdk.Dead:
		return sdk.StopResult{Stopped: true, Detail: f.detail()}, nil
	case !verified:
		log.Warn("task group cannot be verified: not signalling it", "pgid", grec.PGID, "detail", f.detail())
		return sdk.StopResult{Detail: "not signalled: " + f.detail()}, nil
	}

	log.Warn("stopping the attempt's task group", "pgid", grec.PGID, "grace", st.stopGrace, "kill_wait", st.killWait)
	return s.begin(ctx, a, grec.PGID, func(ctx context.Context) (sdk.StopResult, error) {
		rep, err := proc.StopGroup(ctx, s.clock, grec.PGID, st.stopGrace, st.killWait)
		if err != nil {
			log.Error("task group stop failed", "pgid", grec.PGID, "error", err)
			return sdk.StopResult{Detail: fmt.Sprintf("group %d: stop failed", grec.PGID)}, fmt.Errorf("stopping %s: %w", a, err)
		}
		detail := fmt.Sprintf("group %d exited after SIGTERM", grec.PGID)
		switch {
		case rep.AlreadyGone:
			detail = fmt.Sprintf("group %d had already exited", grec.PGID)
		case rep.Killed:
			detail = fmt.Sprintf("group %d SIGKILLed after a %s grace", grec.PGID, st.stopGrace)
		}
		log.Info("task group stopped", "pgid", grec.PGID, "detail", detail)

		if reason == sdk.StopCredentialCeiling {
			if !s.awaitAgentExit(ctx, agentPID, agentStart, st.killWait) {
				// Not stopped yet: the caller asks again on a later pass.
				return sdk.StopResult{Detail: detail + "; agent still running"}, nil
			}
			detail += "; agent exited"
		} else if err := st.dir.Remove(a); err != nil {
			// The agent is dead and the group gone: the records read dead anyway.
			log.Warn("could not remove the stopped attempt's records", "error", err)
		}
		return sdk.StopResult{Stopped: true, Detail: detail}, nil
	})
}

// awaitAgentExit waits up to d for the agent to exit on its own.
func (s *Substrate) awaitAgentExit(ctx context.Context, pid int, start uint64, d time.Duration) bool {
	f := (&batch{}).facts(false)
	dead := func() bool {
		f.resetNotes() // the notes are not wanted: keep them from piling up
		return f.agentLiveness(pid, start) == sdk.Dead
	}
	deadline := s.clock.After(d)
	tick := time.NewTicker(proc.PollInterval)
	defer tick.Stop()
	for {
		if dead() {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-deadline:
			return dead()
		case <-tick.C:
		}
	}
}

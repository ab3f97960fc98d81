package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/runner/agent/apireport"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/lite/records"
)

// runWorker is -mode worker: a warm pool worker that claims the attempts
// bound to it with its worker credential (REAPER_WORKER_TOKEN, with
// REAPER_ATTEMPT_API and REAPER_ATTEMPT_API_CA; a worker bootstrap token
// there is exchanged for the worker token before the first claim) and runs each with the
// attempt's own credential (agent.RunWorker). It returns the exit code.
func runWorker(ctx context.Context, inv agent.Invocation, log hclog.Logger, getenv func(string) string) int {
	dir, err := records.Open(inv.RecordDir)
	if err != nil {
		log.Error("record directory refused", "error", err)
		return exitUsage
	}
	api, ca := getenv(attempttoken.EnvAPI), getenv(attempttoken.EnvCA)
	wc, err := attemptapi.NewClient(api, getenv(attempttoken.EnvWorkerToken), ca)
	if err != nil {
		log.Error("cannot reach the attempt API as a warm worker", "error", fmt.Errorf("-mode worker: %w", err))
		return exitUsage
	}
	defer wc.Close()
	// The worker's exchange proves its pod with the pod's projected token.
	wc.UsePodToken(getenv(attemptapi.EnvPodTokenFile))
	claim := func(ctx context.Context, slots int, running []sdk.Attempt) ([]agent.Claimed, error) {
		// The pod spec's bootstrap token is exchanged once, before the
		// first claim (a no-op from then on).
		if err := wc.ExchangeWorker(ctx, inv.Worker); err != nil {
			return nil, apireport.Classify(err)
		}
		got, err := wc.Claim(ctx, inv.Worker, slots, running)
		if errors.Is(err, attemptapi.ErrReplyTooLarge) {
			return nil, fmt.Errorf("%w: %w", agent.ErrClaimTooLarge, err)
		}
		if err != nil {
			return nil, apireport.Classify(err)
		}
		out := make([]agent.Claimed, 0, len(got))
		for _, c := range got {
			ac, err := attemptapi.NewClient(api, c.Token, ca)
			if err != nil {
				return out, fmt.Errorf("the credential of claimed attempt %s: %w", c.Attempt(), err)
			}
			cl := agent.Claimed{Attempt: c.Attempt(), Command: c.Command,
				ExecutionTimeout: secondsOf(c.ExecutionTimeoutSeconds),
				Reporter:         apireport.ForClient(ac), Close: ac.Close}
			if c.CommandWithheld > 0 {
				cl.Refuse = fmt.Sprintf("the command of %s is %d bytes, over the %d a command may have: "+
					"the control plane withheld it", c.Attempt(), c.CommandWithheld, lifecycle.CommandMax)
			}
			out = append(out, cl)
		}
		return out, nil
	}
	err = agent.RunWorker(ctx, agent.WorkerConfig{
		Name: inv.Worker, Slots: inv.Slots, Poll: inv.Poll, Watchdog: inv.Watchdog, Claim: claim, Subreaper: true,
		Attempt: agent.Config{
			Shell: inv.Shell, Dir: inv.Dir, Records: dir, Output: os.Stdout,
			Heartbeat: inv.Heartbeat, DrainBound: inv.DrainBound, TerminateGrace: inv.TerminateGrace,
			KillWait: inv.KillWait, StartRetry: inv.StartRetry, ReportRetry: inv.ReportRetry, RescheduleExitCode: inv.RescheduleExitCode,
		},
		Logger: log,
	})
	if err != nil {
		log.Error("the warm worker stopped", "error", err)
		return exitWorkerRefused
	}
	return exitSuccess
}

func secondsOf(s int64) time.Duration { return time.Duration(s) * time.Second }

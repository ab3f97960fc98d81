package proc

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dexaflow/reaper/sdk/clock"
)

// PollInterval is how often StopGroup looks whether a signalled group has
// exited. It is the pace of waiting on a real process, not a threshold.
const PollInterval = 10 * time.Millisecond

// StopReport says how a group stop went.
type StopReport struct {
	// AlreadyGone: the group had no running process when the stop began;
	// nothing was signalled.
	AlreadyGone bool
	// Terminated: SIGTERM was sent. Killed: SIGKILL was sent too.
	Terminated, Killed bool
	// Gone: no process of the group is left running.
	Gone bool
}

// StopGroup stops the process group pgid: SIGTERM to the whole group, up to
// grace for it to exit, then SIGKILL and up to killWait more. The deadlines
// come from clk; the group is polled every PollInterval of real time. It
// returns an error when the group still runs after killWait (or a signal
// could not be sent); ctx cancellation aborts the wait with ctx's error.
//
// The caller must have verified that pgid is the group it means to stop.
func StopGroup(ctx context.Context, clk clock.Clock, pgid int, grace, killWait time.Duration) (StopReport, error) {
	return StopGroupWith(ctx, clk, pgid, grace, killWait, SignalGroup)
}

// Sender sends a signal to a process group, as SignalGroup does: false
// when the group is already gone.
type Sender func(pgid int, sig unix.Signal) (bool, error)

// StopGroupWith is StopGroup sending its signals with send (the Lite
// agent's, which signals a task of another user as that user).
func StopGroupWith(ctx context.Context, clk clock.Clock, pgid int, grace, killWait time.Duration, send Sender) (StopReport, error) {
	var rep StopReport
	running, err := GroupRunning(pgid)
	if err != nil {
		return rep, fmt.Errorf("stopping process group %d: %w", pgid, err)
	}
	if !running {
		rep.AlreadyGone, rep.Gone = true, true
		return rep, nil
	}
	if _, err := send(pgid, unix.SIGTERM); err != nil {
		return rep, fmt.Errorf("stopping process group %d: %w", pgid, err)
	}
	rep.Terminated = true
	gone, err := waitGone(ctx, clk, pgid, grace)
	if err != nil || gone {
		rep.Gone = gone
		return rep, err
	}
	if _, err := send(pgid, unix.SIGKILL); err != nil {
		return rep, fmt.Errorf("stopping process group %d: %w", pgid, err)
	}
	rep.Killed = true
	gone, err = waitGone(ctx, clk, pgid, killWait)
	if err != nil {
		return rep, err
	}
	rep.Gone = gone
	if !gone {
		return rep, fmt.Errorf("stopping process group %d: processes still run %s after SIGKILL", pgid, killWait)
	}
	return rep, nil
}

// KillGroup sends SIGKILL to the group and waits up to killWait for it to go.
func KillGroup(ctx context.Context, clk clock.Clock, pgid int, killWait time.Duration) error {
	return KillGroupWith(ctx, clk, pgid, killWait, SignalGroup)
}

// KillGroupWith is KillGroup sending SIGKILL with send.
func KillGroupWith(ctx context.Context, clk clock.Clock, pgid int, killWait time.Duration, send Sender) error {
	if _, err := send(pgid, unix.SIGKILL); err != nil {
		return err
	}
	gone, err := waitGone(ctx, clk, pgid, killWait)
	if err != nil {
		return err
	}
	if !gone {
		return fmt.Errorf("killing process group %d: processes still run %s after SIGKILL", pgid, killWait)
	}
	return nil
}

// waitGone waits until no process of the group runs, or d has passed on clk.
func waitGone(ctx context.Context, clk clock.Clock, pgid int, d time.Duration) (bool, error) {
	return AwaitGone(ctx, pgid, clk.After(d))
}

// AwaitGone polls the group every PollInterval until no process of it runs
// (true) or deadline fires (false, after one last look).
func AwaitGone(ctx context.Context, pgid int, deadline <-chan time.Time) (bool, error) {
	tick := time.NewTicker(PollInterval)
	defer tick.Stop()
	for {
		running, err := GroupRunning(pgid)
		if err != nil {
			return false, fmt.Errorf("waiting for process group %d to exit: %w", pgid, err)
		}
		if !running {
			return true, nil
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("waiting for process group %d to exit: %w", pgid, ctx.Err())
		case <-deadline:
			running, err := GroupRunning(pgid)
			if err != nil {
				return false, fmt.Errorf("waiting for process group %d to exit: %w", pgid, err)
			}
			return !running, nil
		case <-tick.C:
		}
	}
}

package helmrelease

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Reaperctl runs reaperctl's command on the machine with the release's
// configuration (-config HostConfig after the command), says the command
// line, and returns its output.
func (r *Release) Reaperctl(ctx context.Context, command string, args ...string) (string, error) {
	args = append([]string{command, "-config", r.HostConfig}, args...)
	r.say("$ reaperctl %s", strings.Join(quoted(args), " "))
	out, err := r.command(ctx, "reaperctl", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helmrelease: reaperctl %s: %w\n%s", command, err, out)
	}
	return string(out), nil
}

// Submit submits a run of n tasks running command with reaperctl, as an
// operator would.
func (r *Release) Submit(ctx context.Context, runID string, n int, command string) error {
	_, err := r.Reaperctl(ctx, "submit", "-run", runID, "-n", fmt.Sprint(n), "-command", command)
	return err
}

// Run states that end a run.
const (
	RunSuccess = "success"
	RunFailed  = "failed"
)

// RunState reads the run's state and its tasks' states from the board.
func (r *Release) RunState(ctx context.Context, runID string) (string, map[string]string, error) {
	var state string
	if err := r.Board.QueryRow(ctx, `SELECT state FROM runs WHERE run_id = $1`, runID).Scan(&state); err != nil {
		return "", nil, fmt.Errorf("helmrelease: read run %s: %w", runID, err)
	}
	tasks, err := r.perTask(ctx, runID, "state")
	return state, tasks, err
}

// WaitRun waits, at most within, for the run to end, and returns its state
// and its tasks' (those last read when it did not end).
func (r *Release) WaitRun(ctx context.Context, runID string, within time.Duration) (string, map[string]string, error) {
	var state string
	var tasks map[string]string
	var readErr error
	err := until(ctx, within, 250*time.Millisecond, "run "+runID+" to end", func() bool {
		state, tasks, readErr = r.RunState(ctx, runID)
		return state == RunSuccess || state == RunFailed
	})
	if err != nil && readErr != nil {
		err = fmt.Errorf("%w (%w)", err, readErr)
	}
	return state, tasks, err
}

// Attempts returns each task's current attempt as "try.epoch state".
func (r *Release) Attempts(ctx context.Context, runID string) (map[string]string, error) {
	return r.perTask(ctx, runID, "try_number || '.' || attempt_epoch || ' ' || state")
}

// RecordedPods returns, per task of the run, the UID of the pod the
// in-cluster runner recorded for its attempt ("" where none).
func (r *Release) RecordedPods(ctx context.Context, runID string) (map[string]string, error) {
	return r.perTask(ctx, runID, "coalesce(pod_uid, '')")
}

// perTask reads the value of an expression over task_instances (text) for
// each task of the run.
func (r *Release) perTask(ctx context.Context, runID, expr string) (map[string]string, error) {
	rows, err := r.Board.Query(ctx, `SELECT task_id, `+expr+` FROM task_instances WHERE run_id = $1`, runID)
	if err != nil {
		return nil, fmt.Errorf("helmrelease: read run %s's tasks: %w", runID, err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var task, v string
		if err := rows.Scan(&task, &v); err != nil {
			return nil, fmt.Errorf("helmrelease: read run %s's tasks: %w", runID, err)
		}
		out[task] = v
	}
	return out, rows.Err()
}

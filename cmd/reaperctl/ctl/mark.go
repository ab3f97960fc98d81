package ctl

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"strings"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
)

type markJSON struct {
	Marked   bool        `json:"marked"`
	Verdict  string      `json:"verdict"`
	Operator string      `json:"operator"`
	Was      string      `json:"was"`
	Attempt  attemptJSON `json:"attempt"`
}

// defaultOperator is the operator's name when -by does not give one: the
// OS user running reaperctl.
func defaultOperator() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return os.Getenv("USER")
}

func (c CLI) mark(ctx context.Context, inv *invocation) error {
	inv.flags()
	resolve := inv.operatorFlag()
	pos, err := inv.parse(3, 3)
	if err != nil {
		return err
	}
	verdict := pos[2]
	if verdict != sdk.StateFailed && verdict != sdk.StateSuccess {
		return usagef("%q: mark a task failed or success", verdict)
	}
	operator, err := resolve()
	if err != nil {
		return err
	}
	s, err := c.open(ctx, inv.configPath)
	if err != nil {
		return err
	}
	defer s.close()
	now := c.now()

	run, ti, err := findTask(ctx, s, pos[0], pos[1])
	if err != nil {
		return err
	}
	a := ti.Attempt
	switch {
	case run.State == sdk.RunSuccess || run.State == sdk.RunFailed:
		return fmt.Errorf("run %s has finished (%s): its tasks are not marked; clear a task to run it again", run.RunID, run.State)
	case run.State != sdk.RunRunning:
		return fmt.Errorf("run %s is %s, not running: nothing of it runs yet", run.RunID, run.State)
	case !lifecycle.CanMark(ti.State):
		return fmt.Errorf("%s is %s, an outcome of its own: it is not marked; clear it to run it again", attemptName(a), ti.State)
	}
	was := ti.State
	if f := failure(ti); f != "-" {
		was += " (" + f + ")"
	}
	if c.beforeWrite != nil {
		c.beforeWrite()
	}
	m, err := s.writer.MarkState(ctx, a, ti.State, lifecycle.Verdict{State: verdict, Operator: operator}, now)
	if err != nil {
		return err
	}
	switch {
	case m.Applied:
	case m.Reason == lifecycle.ReasonRunNotRunning:
		return fmt.Errorf("run %s finished while %s was being marked: nothing written", a.RunID, attemptName(a))
	default:
		return fmt.Errorf("%s moved on (%s) while being marked: nothing written; look again with reaperctl explain %s %s",
			attemptName(a), m.Reason, a.RunID, a.TaskID)
	}
	if inv.json {
		after, err := s.store.TaskInstance(ctx, a.RunID, a.TaskID)
		if err != nil {
			return err
		}
		return writeJSON(inv.stdout, markJSON{Marked: true, Verdict: verdict, Operator: operator, Was: ti.State,
			Attempt: attemptOf(after)})
	}
	var next []string
	if ti.State == sdk.StateQueued || ti.State == sdk.StateRunning {
		next = append(next, "its agent is told to stop at its next report")
	}
	next = append(next, "the runner finishes the run once every task is settled")
	_, err = fmt.Fprintf(inv.stdout, "marked %s %s by %s (was %s): %s\n", attemptName(a), verdict, operator, was,
		strings.Join(next, "; "))
	return err
}

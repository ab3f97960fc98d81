package ctl

import (
	"context"
	"fmt"
	"strconv"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
)

// HeldLimitDefault is how many held attempts held lists unless -limit says.
const HeldLimitDefault = 100

type heldJSON struct {
	Held []attemptJSON `json:"held"`
	// More is true when more attempts are held than -limit listed.
	More bool `json:"more"`
}

type releaseJSON struct {
	Released bool        `json:"released"`
	Attempt  attemptJSON `json:"attempt"`
}

func (c CLI) held(ctx context.Context, inv *invocation) error {
	fs := inv.flags()
	limit := fs.Int("limit", HeldLimitDefault, "list at most `N` held attempts, the oldest hold first")
	if _, err := inv.parse(0, 0); err != nil {
		return err
	}
	if *limit < 1 || *limit > 100*board.ListLimitMax {
		return usagef("-limit %d: want 1 to %d", *limit, 100*board.ListLimitMax)
	}
	s, err := c.open(ctx, inv.configPath)
	if err != nil {
		return err
	}
	defer s.close()
	now := c.now()

	var (
		held []board.TaskInstance
		more bool
		q    = board.HeldQuery{Limit: board.ListLimitMax}
	)
	for {
		page, err := s.store.ListHeld(ctx, q)
		if err != nil {
			return err
		}
		held = append(held, page.Attempts...)
		if len(held) > *limit {
			held, more = held[:*limit], true
			break
		}
		if page.Next == nil {
			break
		}
		q.After = page.Next
	}

	if inv.json {
		doc := heldJSON{Held: []attemptJSON{}, More: more}
		for _, ti := range held {
			doc.Held = append(doc.Held, attemptOf(ti))
		}
		return writeJSON(inv.stdout, doc)
	}
	w := inv.stdout
	if len(held) == 0 {
		_, err := fmt.Fprintln(w, "no attempts are held for review")
		return err
	}
	t := newTable(w, "RUN", "TASK", "TRY", "EPOCH", "STATE", "REASON", "SINCE", "ERROR")
	for _, ti := range held {
		t.row(ti.RunID, ti.TaskID, strconv.Itoa(int(ti.Try)), strconv.Itoa(int(ti.Epoch)), ti.State,
			failure(ti), age(now, ti.HeldAt), dash(clip(ti.ErrorMessage, 60)))
	}
	if err := t.flush(); err != nil {
		return err
	}
	if more {
		fmt.Fprintf(w, "(the %d oldest holds; more are held: raise -limit)\n", *limit)
	}
	_, err = fmt.Fprintln(w, "release one with: reaperctl release RUN TASK")
	return err
}

func (c CLI) release(ctx context.Context, inv *invocation) error {
	inv.flags()
	resolve := inv.operatorFlag()
	pos, err := inv.parse(2, 2)
	if err != nil {
		return err
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

	_, ti, err := findTask(ctx, s, pos[0], pos[1])
	if err != nil {
		return err
	}
	a := ti.Attempt
	if ti.HeldAt.IsZero() {
		return fmt.Errorf("%s is not held for review", attemptName(a))
	}
	ok, err := s.writer.ReleaseHold(ctx, a, operator, now)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%s moved on while being released: look again with reaperctl status %s", attemptName(a), a.RunID)
	}
	if inv.json {
		after, err := s.store.TaskInstance(ctx, a.RunID, a.TaskID)
		if err != nil {
			return err
		}
		return writeJSON(inv.stdout, releaseJSON{Released: true, Attempt: attemptOf(after)})
	}
	next := "the runner may re-place it now"
	if !(ti.State == sdk.StateFailed && ti.LastFailureKind == sdk.FailureInfra) {
		next = "no rail is barred by a hold any more"
	}
	_, err = fmt.Fprintf(inv.stdout, "released %s (held %s, %s): %s\n", attemptName(a), age(now, ti.HeldAt), failure(ti), next)
	return err
}

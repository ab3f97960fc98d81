package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/dexaflow/reaper/board"
)

// StatusLimitDefault is how many runs status lists unless -limit says.
const StatusLimitDefault = 20

// RefusalWindow is how far back status counts the writes the board's
// fence refused.
const RefusalWindow = 24 * time.Hour

type statusJSON struct {
	Leader *leaderJSON `json:"leader"`
	// FenceRefusals are the writes the fence refused in the last
	// RefusalWindow.
	FenceRefusals refusalsJSON `json:"fence_refusals"`
	Runs          []runJSON    `json:"runs"`
	// More is true when runs beyond -limit exist.
	More bool `json:"more"`
	// Pools are the pools' slots and their use (the overview only).
	Pools []poolJSON `json:"pools,omitempty"`
}

func (c CLI) status(ctx context.Context, inv *invocation) error {
	fs := inv.flags()
	verbose := fs.Bool("v", false, "also list the attempts of every listed run")
	state := fs.String("state", "", "list only runs in `STATE` (queued, running, success, failed)")
	limit := fs.Int("limit", StatusLimitDefault, "list at most `N` runs, newest first")
	pos, err := inv.parse(0, 1)
	if err != nil {
		return err
	}
	if len(pos) == 1 && (flagSet(fs, "state") || flagSet(fs, "limit")) {
		return usagef("-state and -limit select runs to list; they do not apply to one RUN")
	}
	if *state != "" && !board.IsRunState(*state) {
		return usagef("-state %q: not a run state (queued, running, success, failed)", *state)
	}
	if *limit < 1 || *limit > board.ListLimitMax {
		return usagef("-limit %d: want 1 to %d", *limit, board.ListLimitMax)
	}

	s, err := c.open(ctx, inv.configPath)
	if err != nil {
		return err
	}
	defer s.close()
	v := statusView{now: c.now(), state: *state, limit: *limit, attempts: map[string][]board.TaskInstance{}}

	if v.lease, v.hasLeader, err = s.store.CurrentLeader(ctx); err != nil {
		return err
	}
	if v.refused, err = s.store.RecentRefusals(ctx, v.now.Add(-RefusalWindow)); err != nil {
		return err
	}
	if len(pos) == 1 {
		rs, tis, err := oneRun(ctx, s, pos[0])
		if err != nil {
			return err
		}
		v.runs, v.attempts[rs.RunID] = []board.RunSummary{rs}, tis
	} else if err := v.listRuns(ctx, s, *verbose); err != nil {
		return err
	}
	if len(pos) == 0 {
		if v.pools, err = poolRows(ctx, s, v.now); err != nil {
			return err
		}
	}
	if inv.json {
		return writeJSON(inv.stdout, v.doc())
	}
	return v.write(inv.stdout)
}

// statusView is what reaperctl status shows: the leader, the fence's
// recent refusals, the runs (with their attempts where asked) and the pools.
type statusView struct {
	now       time.Time
	state     string // -state
	limit     int    // -limit
	lease     board.Lease
	hasLeader bool
	refused   board.RefusalSummary
	runs      []board.RunSummary
	more      bool // runs beyond the limit exist
	attempts  map[string][]board.TaskInstance
	pools     []poolJSON
}

// listRuns reads the newest runs (in the -state asked), at most the limit,
// and with verbose the attempts of each.
func (v *statusView) listRuns(ctx context.Context, s *session, verbose bool) error {
	q := board.RunListQuery{Limit: v.limit + 1}
	if v.state != "" {
		q.States = []string{v.state}
	}
	page, err := s.store.ListRuns(ctx, q)
	if err != nil {
		return err
	}
	v.runs = page.Runs
	if len(v.runs) > v.limit {
		v.runs, v.more = v.runs[:v.limit], true
	}
	if !verbose {
		return nil
	}
	for _, r := range v.runs {
		tis, err := s.store.TaskInstances(ctx, r.RunID)
		if err != nil {
			return err
		}
		v.attempts[r.RunID] = tis
	}
	return nil
}

// doc is the view as -o json writes it.
func (v *statusView) doc() statusJSON {
	doc := statusJSON{Runs: []runJSON{}, More: v.more, Pools: v.pools, FenceRefusals: refusalsOf(v.now, v.refused)}
	if v.hasLeader {
		doc.Leader = &leaderJSON{Name: v.lease.Name, Term: v.lease.Term, Holder: v.lease.Holder,
			Held: v.lease.Held(v.now), ExpiresAt: timeOrNil(v.lease.ExpiresAt)}
	}
	for _, r := range v.runs {
		rj := runOf(r)
		if tis, ok := v.attempts[r.RunID]; ok {
			rj.Attempts = []attemptJSON{}
			for _, ti := range tis {
				rj.Attempts = append(rj.Attempts, attemptOf(ti))
			}
		}
		doc.Runs = append(doc.Runs, rj)
	}
	return doc
}

// write writes the view as text: the leader and refusals, the busy pools,
// the runs' table, then the attempts of each run that has them.
func (v *statusView) write(w io.Writer) error {
	fmt.Fprintln(w, leaderLine(v.lease, v.hasLeader, v.now))
	if v.refused.Count > 0 {
		fmt.Fprintln(w, refusalLine(v.now, v.refused))
	}
	fmt.Fprintln(w)
	if busy(v.pools) {
		if err := poolTable(w, v.pools); err != nil {
			return err
		}
		fmt.Fprintln(w)
	}
	if len(v.runs) == 0 {
		if v.state != "" {
			fmt.Fprintf(w, "no %s runs\n", v.state)
		} else {
			fmt.Fprintln(w, "no runs")
		}
		return nil
	}
	t := newTable(w, "RUN", "DAG", "STATE", "AGE", "ENDED", "TASKS", "HELD", "BY STATE")
	for _, r := range v.runs {
		ended := "-"
		if !r.EndedAt.IsZero() {
			ended = age(v.now, r.EndedAt) + " ago"
		}
		t.row(r.RunID, r.DagID, r.State, age(v.now, board.RunSortTime(r.Run)), ended,
			strconv.Itoa(total(r.Tasks)), strconv.Itoa(r.Held), countsLine(r.Tasks))
	}
	if err := t.flush(); err != nil {
		return err
	}
	if v.more {
		fmt.Fprintf(w, "(the %d newest; more runs exist: raise -limit)\n", v.limit)
	}
	for _, r := range v.runs {
		tis, ok := v.attempts[r.RunID]
		if !ok {
			continue
		}
		fmt.Fprintf(w, "\nattempts of %s:\n", r.RunID)
		if err := attemptTable(w, v.now, tis); err != nil {
			return err
		}
	}
	return nil
}

// oneRun reads one run and its task instances, counted.
func oneRun(ctx context.Context, s *session, runID string) (board.RunSummary, []board.TaskInstance, error) {
	run, err := s.store.Run(ctx, runID)
	if errors.Is(err, board.ErrNotFound) {
		return board.RunSummary{}, nil, fmt.Errorf("no run %q", runID)
	}
	if err != nil {
		return board.RunSummary{}, nil, err
	}
	tis, err := s.store.TaskInstances(ctx, runID)
	if err != nil {
		return board.RunSummary{}, nil, err
	}
	rs := board.RunSummary{Run: run, Tasks: map[string]int{}}
	for _, ti := range tis {
		rs.Tasks[ti.State]++
		if !ti.HeldAt.IsZero() {
			rs.Held++
		}
	}
	return rs, tis, nil
}

// attemptTable lists task instances' current attempts.
func attemptTable(w io.Writer, now time.Time, tis []board.TaskInstance) error {
	if len(tis) == 0 {
		_, err := fmt.Fprintln(w, "  (no task instances)")
		return err
	}
	t := newTable(w, "TASK", "STATE", "TRY", "EPOCH", "AGE", "HEARTBEAT", "FAILURE", "HELD", "ERROR")
	for _, ti := range tis {
		t.row(ti.TaskID, ti.State, strconv.Itoa(int(ti.Try)), strconv.Itoa(int(ti.Epoch)),
			age(now, stateSince(ti)), age(now, ti.LastHeartbeatAt), failure(ti), age(now, ti.HeldAt),
			dash(clip(ti.ErrorMessage, 60)))
	}
	return t.flush()
}

// leaderLine says who leads the board, judged at now.
func leaderLine(l board.Lease, ok bool, now time.Time) string {
	switch {
	case !ok:
		return "leader: none (no reaperd has led on this board yet)"
	case l.Held(now):
		return fmt.Sprintf("leader: %s, term %d, lease expires in %s", l.Holder, l.Term,
			human(l.ExpiresAt.Sub(now).Truncate(time.Second)))
	case l.Holder == "":
		return fmt.Sprintf("leader: none (term %d resigned)", l.Term)
	}
	return fmt.Sprintf("leader: none (the lease of term %d, %s, lapsed %s ago)", l.Term, l.Holder, age(now, l.ExpiresAt))
}

// refusalLine says how many writes the fence refused in the window and
// which was the last: what it claimed, and the leader row it met.
func refusalLine(now time.Time, sum board.RefusalSummary) string {
	line := fmt.Sprintf("fence: %s refused in the last %dh", plural(sum.Count, "write"), int(RefusalWindow.Hours()))
	r := sum.Last
	if r == nil {
		return line
	}
	by := r.Holder
	if by == "" {
		by = "a writer with no holder"
	}
	met := "no leader row"
	if r.LeadFound {
		holder := r.LeadHolder
		if holder == "" {
			holder = "resigned"
		}
		met = fmt.Sprintf("the board's term %d, %s", r.LeadTerm, holder)
	}
	return fmt.Sprintf("%s; the last %s ago: %s under term %d by %s (%s: %s)", line, age(now, r.At), r.Write, r.Term, by, met, r.Why())
}

// refusalsJSON is the fence's refusals in status's document.
type refusalsJSON struct {
	Since time.Time    `json:"since"`
	Count int          `json:"count"`
	Last  *refusalJSON `json:"last,omitempty"`
}

type refusalJSON struct {
	ID            int64                `json:"id"`
	At            time.Time            `json:"at"`
	Write         string               `json:"write"`
	Term          int64                `json:"term"`
	Holder        string               `json:"holder,omitempty"`
	WriteAt       *time.Time           `json:"write_at,omitempty"`
	Attempts      []refusedAttemptJSON `json:"attempts"`
	Requests      int                  `json:"requests"`
	LeadTerm      *int64               `json:"lead_term,omitempty"`
	LeadHolder    string               `json:"lead_holder,omitempty"`
	LeadExpiresAt *time.Time           `json:"lead_expires_at,omitempty"`
	Why           string               `json:"why"`
}

// refusedAttemptJSON is an attempt as a refusal names it (a run alone: no task).
type refusedAttemptJSON struct {
	RunID  string `json:"run_id"`
	TaskID string `json:"task_id,omitempty"`
	Try    int32  `json:"try_number"`
	Epoch  int32  `json:"attempt_epoch"`
}

func refusalsOf(now time.Time, sum board.RefusalSummary) refusalsJSON {
	doc := refusalsJSON{Since: now.Add(-RefusalWindow).UTC(), Count: sum.Count}
	r := sum.Last
	if r == nil {
		return doc
	}
	last := &refusalJSON{ID: r.ID, At: r.At.UTC(), Write: r.Write, Term: r.Term, Holder: r.Holder,
		WriteAt: timeOrNil(r.WriteAt), Attempts: []refusedAttemptJSON{}, Requests: r.Requests, LeadHolder: r.LeadHolder,
		LeadExpiresAt: timeOrNil(r.LeadExpiresAt), Why: r.Why()}
	if r.LeadFound {
		term := r.LeadTerm
		last.LeadTerm = &term
	}
	for _, a := range r.Attempts {
		last.Attempts = append(last.Attempts, refusedAttemptJSON{RunID: a.RunID, TaskID: a.TaskID, Try: a.Try, Epoch: a.Epoch})
	}
	doc.Last = last
	return doc
}

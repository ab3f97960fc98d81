package boardhistory

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
)

// Transition is one change of a task instance's row as the database saw
// it, with the leadership term current in that transaction.
type Transition struct {
	At            time.Time
	From          sdk.Attempt // the attempt the row held before
	To            sdk.Attempt // and after (a new try or epoch on a rail)
	OldState      string
	NewState      string
	FailureReason string
	FailureKind   string // last_failure_kind: "task", "infra" or ""
	Term          int64  // the leader row's term at the write; 0 when none
	// OldFailureKind is the row's last_failure_kind before the change.
	OldFailureKind string
	// Writer is the writing connection's application_name: a reaperd
	// replica's holder (cut to what PostgreSQL keeps), "" when unnamed.
	Writer string
	// Fenced says the writing transaction share-locked the leader row: a
	// write fenced by a leadership term.
	Fenced bool
	// LeadHolder is the holder the leader row named at the write.
	LeadHolder string
}

// RunChange is one change of a run's state as the database saw it.
type RunChange struct {
	At       time.Time
	RunID    string
	OldState string
	NewState string
	Term     int64
	// Writer, Fenced and LeadHolder are as a Transition's.
	Writer     string
	Fenced     bool
	LeadHolder string
}

// Term is one leadership term as the database saw it begin.
type Term struct {
	Term   int64
	Holder string
	At     time.Time
}

// Heartbeat is one heartbeat that landed on an attempt's row.
type Heartbeat struct {
	ID      int64 // its row's id: Heartbeats reads those after a given one
	At      time.Time
	Attempt sdk.Attempt
}

// Board is what the triggers recorded, each list in the order of its rows,
// and the writes the board's fence refused (its own fence_refusals).
type Board struct {
	Terms       []Term
	Transitions []Transition
	RunChanges  []RunChange
	Refusals    []board.FenceRefusal
	// Heartbeats are, by attempt, the times its heartbeats landed, in
	// order.
	Heartbeats map[sdk.Attempt][]time.Time
}

// Collect reads everything the triggers recorded.
func Collect(ctx context.Context, pool *pgxpool.Pool) (Board, error) {
	var b Board
	var err error
	if b.Transitions, err = Transitions(ctx, pool); err != nil {
		return b, err
	}
	if b.RunChanges, err = RunChanges(ctx, pool); err != nil {
		return b, err
	}
	if b.Terms, err = Terms(ctx, pool); err != nil {
		return b, err
	}
	if b.Refusals, err = Refusals(ctx, pool); err != nil {
		return b, err
	}
	beats, _, err := Heartbeats(ctx, pool, 0)
	if err != nil {
		return b, err
	}
	b.Heartbeats = map[sdk.Attempt][]time.Time{}
	for _, h := range beats {
		b.Heartbeats[h.Attempt] = append(b.Heartbeats[h.Attempt], h.At)
	}
	return b, nil
}

// Transitions reads every change of a task instance, in order.
func Transitions(ctx context.Context, pool *pgxpool.Pool) ([]Transition, error) {
	rows, err := pool.Query(ctx, `SELECT at, run_id, task_id, old_try, old_epoch, new_try, new_epoch,
	        old_state, new_state, coalesce(failure_reason, ''), coalesce(failure_kind, ''), coalesce(term, 0),
	        coalesce(old_failure_kind, ''), coalesce(writer, ''), coalesce(fenced, false), coalesce(lead_holder, '')
	    FROM fault_history_ti ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("boardhistory: read the task instances' changes: %w", err)
	}
	defer rows.Close()
	var out []Transition
	for rows.Next() {
		var tr Transition
		if err := rows.Scan(&tr.At, &tr.From.RunID, &tr.From.TaskID, &tr.From.Try, &tr.From.Epoch,
			&tr.To.Try, &tr.To.Epoch, &tr.OldState, &tr.NewState, &tr.FailureReason, &tr.FailureKind, &tr.Term,
			&tr.OldFailureKind, &tr.Writer, &tr.Fenced, &tr.LeadHolder); err != nil {
			return nil, fmt.Errorf("boardhistory: read the task instances' changes: %w", err)
		}
		tr.To.RunID, tr.To.TaskID = tr.From.RunID, tr.From.TaskID
		out = append(out, tr)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("boardhistory: read the task instances' changes: %w", err)
	}
	return out, nil
}

// RunChanges reads every change of a run's state, in order.
func RunChanges(ctx context.Context, pool *pgxpool.Pool) ([]RunChange, error) {
	rows, err := pool.Query(ctx, `SELECT at, run_id, old_state, new_state, coalesce(term, 0),
	        coalesce(writer, ''), coalesce(fenced, false), coalesce(lead_holder, '') FROM fault_history_run ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("boardhistory: read the runs' changes: %w", err)
	}
	defer rows.Close()
	var out []RunChange
	for rows.Next() {
		var rc RunChange
		if err := rows.Scan(&rc.At, &rc.RunID, &rc.OldState, &rc.NewState, &rc.Term, &rc.Writer, &rc.Fenced, &rc.LeadHolder); err != nil {
			return nil, fmt.Errorf("boardhistory: read the runs' changes: %w", err)
		}
		out = append(out, rc)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("boardhistory: read the runs' changes: %w", err)
	}
	return out, nil
}

// Terms reads every term the leader row began, in order.
func Terms(ctx context.Context, pool *pgxpool.Pool) ([]Term, error) {
	rows, err := pool.Query(ctx, `SELECT term, coalesce(holder, ''), at FROM fault_history_leader ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("boardhistory: read the leader row's terms: %w", err)
	}
	defer rows.Close()
	var out []Term
	for rows.Next() {
		var tm Term
		if err := rows.Scan(&tm.Term, &tm.Holder, &tm.At); err != nil {
			return nil, fmt.Errorf("boardhistory: read the leader row's terms: %w", err)
		}
		out = append(out, tm)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("boardhistory: read the leader row's terms: %w", err)
	}
	return out, nil
}

// Refusals reads every write the board's fence refused, in order
// (board.Store.FenceRefusals, page by page).
func Refusals(ctx context.Context, pool *pgxpool.Pool) ([]board.FenceRefusal, error) {
	store := board.New(pool, board.Options{})
	var out []board.FenceRefusal
	for {
		var after int64
		if len(out) > 0 {
			after = out[len(out)-1].ID
		}
		page, err := store.FenceRefusals(ctx, after, refusalPage)
		if err != nil {
			return nil, fmt.Errorf("boardhistory: %w", err)
		}
		out = append(out, page...)
		if len(page) < refusalPage {
			return out, nil
		}
	}
}

// refusalPage is how many refusals Refusals reads at once.
const refusalPage = 500

// Heartbeats reads the heartbeats that landed after the one with id after
// (0: all), in order, and the id of the last read (after when none).
func Heartbeats(ctx context.Context, pool *pgxpool.Pool, after int64) ([]Heartbeat, int64, error) {
	rows, err := pool.Query(ctx, `SELECT id, at, run_id, task_id, try, epoch FROM fault_history_hb WHERE id > $1 ORDER BY id`, after)
	if err != nil {
		return nil, after, fmt.Errorf("boardhistory: read the heartbeats: %w", err)
	}
	defer rows.Close()
	var out []Heartbeat
	last := after
	for rows.Next() {
		var h Heartbeat
		if err := rows.Scan(&h.ID, &h.At, &h.Attempt.RunID, &h.Attempt.TaskID, &h.Attempt.Try, &h.Attempt.Epoch); err != nil {
			return nil, after, fmt.Errorf("boardhistory: read the heartbeats: %w", err)
		}
		out = append(out, h)
		last = h.ID
	}
	if err := rows.Err(); err != nil {
		return nil, after, fmt.Errorf("boardhistory: read the heartbeats: %w", err)
	}
	return out, last, nil
}

// Final is a task's row on the board as read after the run.
type Final struct {
	Attempt sdk.Attempt
	State   string
	At      time.Time // when it was read
}

// ReadFinals reads every task's row from the board, stamped at.
func ReadFinals(ctx context.Context, pool *pgxpool.Pool, at time.Time) ([]Final, error) {
	rows, err := pool.Query(ctx, `SELECT run_id, task_id, try_number, attempt_epoch, state FROM task_instances
	    ORDER BY run_id, task_id`)
	if err != nil {
		return nil, fmt.Errorf("boardhistory: read the final rows: %w", err)
	}
	defer rows.Close()
	var out []Final
	for rows.Next() {
		f := Final{At: at}
		if err := rows.Scan(&f.Attempt.RunID, &f.Attempt.TaskID, &f.Attempt.Try, &f.Attempt.Epoch, &f.State); err != nil {
			return nil, fmt.Errorf("boardhistory: read the final rows: %w", err)
		}
		out = append(out, f)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("boardhistory: read the final rows: %w", err)
	}
	return out, nil
}

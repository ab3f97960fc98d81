package soak

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/history"
)

// historyFile is the name of a soak's fault history in its directory.
const historyFile = "history.jsonl"

// judgeHistory writes the run's fault history and has the checker judge it:
// the accounts h holds, taken after the last look, and every task's row as
// the board holds it now, the replicas stopped. Each violation the checker
// finds fails the soak, as the soak's own invariants do.
//
// The file is written here, once, from the accounts, rather than as the
// soak goes: every account is already kept whole and in order by its own
// keeper (the triggers' tables in the database, the agents' journals on
// disk, the injector's list), and an execution killed without a word is
// only known ended at a later look of the process table; so the file
// holds exactly the evidence the soak's own invariants judged, read once.
func (s *soak) judgeHistory(ctx context.Context, h History) (history.Verdict, error) {
	finals, err := s.finals(ctx)
	if err != nil {
		s.fail(Violation{Check: HistoryChecked, Evidence: "read the board's final rows: " + err.Error()})
		return history.Verdict{}, err
	}
	events := Record(h, finals)
	path := filepath.Join(s.dir, historyFile)
	w, err := history.Open(path)
	if err != nil {
		s.fail(Violation{Check: HistoryChecked, Evidence: err.Error()})
		return history.Verdict{}, err
	}
	for _, e := range events {
		if err := w.Record(e); err != nil {
			_ = w.Close()
			s.fail(Violation{Check: HistoryChecked, Evidence: err.Error()})
			return history.Verdict{}, err
		}
	}
	if err := w.Close(); err != nil {
		s.fail(Violation{Check: HistoryChecked, Evidence: err.Error()})
		return history.Verdict{}, err
	}
	s.historyPath = path
	// The checker judges the file as anyone would: read back.
	read, err := history.Read(path)
	if err != nil {
		s.fail(Violation{Check: HistoryChecked, Evidence: err.Error()})
		return history.Verdict{}, err
	}
	v := history.Check(read)
	s.logf("%s (%s)", v.Summary(), path)
	if v.OK() {
		s.mu.Lock()
		s.passed[HistoryChecked]++
		s.mu.Unlock()
	}
	for _, x := range v.Violations {
		s.fail(Violation{Check: "history/" + string(x.Rule), Evidence: x.Text})
	}
	return v, nil
}

// finals reads every task's row from the board.
func (s *soak) finals(ctx context.Context) ([]Final, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT run_id, task_id, try_number, attempt_epoch, state FROM task_instances
	    ORDER BY run_id, task_id`)
	if err != nil {
		return nil, fmt.Errorf("read the final rows: %w", err)
	}
	defer rows.Close()
	at := s.tl.now()
	var out []Final
	for rows.Next() {
		f := Final{At: at}
		var a sdk.Attempt
		if err := rows.Scan(&a.RunID, &a.TaskID, &a.Try, &a.Epoch, &f.State); err != nil {
			return nil, fmt.Errorf("read the final rows: %w", err)
		}
		f.Attempt = a
		out = append(out, f)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the final rows: %w", err)
	}
	return out, nil
}

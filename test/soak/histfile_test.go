package soak

import (
	"context"
	"path/filepath"
	"time"

	"github.com/dexaflow/reaper/testkit/boardhistory"
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
	path := filepath.Join(s.dir, historyFile)
	// The checker judges the file as anyone would: read back.
	v, err := boardhistory.Judge(path, Record(h, finals))
	if err != nil {
		s.fail(Violation{Check: HistoryChecked, Evidence: err.Error()})
		return history.Verdict{}, err
	}
	s.historyPath = path
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
	return boardhistory.ReadFinals(ctx, s.pool, s.tl.now())
}

package boardhistory

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/testkit/history"
)

// JudgeBoard is a harness's whole judgement of one board: it collects the
// history the triggers kept on pool, reads the final rows at now, builds
// the events with the executions execs gives for that board and with
// faults, writes them to path and has the checker judge the file (Judge).
func JudgeBoard(ctx context.Context, pool *pgxpool.Pool, path string, execs func(Board) ([]Execution, error),
	faults []Fault, now time.Time) (history.Verdict, error) {
	b, err := Collect(ctx, pool)
	if err != nil {
		return history.Verdict{}, err
	}
	finals, err := ReadFinals(ctx, pool, now)
	if err != nil {
		return history.Verdict{}, err
	}
	xs, err := execs(b)
	if err != nil {
		return history.Verdict{}, fmt.Errorf("boardhistory: the executions: %w", err)
	}
	return Judge(path, Record(b, xs, faults, finals))
}

// Judge writes events to a new history file at path and has the checker
// judge the file as anyone would: read back. It returns the verdict, or
// the error that kept the file from being written or read.
func Judge(path string, events []history.Event) (history.Verdict, error) {
	w, err := history.Open(path)
	if err != nil {
		return history.Verdict{}, err
	}
	for _, e := range events {
		if err := w.Record(e); err != nil {
			_ = w.Close()
			return history.Verdict{}, err
		}
	}
	if err := w.Close(); err != nil {
		return history.Verdict{}, err
	}
	read, err := history.Read(path)
	if err != nil {
		return history.Verdict{}, err
	}
	return history.Check(read), nil
}

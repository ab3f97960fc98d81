package boardhistory

import (
	"github.com/dexaflow/reaper/testkit/history"
)

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

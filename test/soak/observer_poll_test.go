package soak

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/dexaflow/reaper/runner/agent"
)

// TestObserverFoldsEachJournalLineOnceUnderConcurrentPolls: the observer's
// loop and every invariant check poll at once; each task start an agent
// journals must become exactly one execution, or the check of two live
// executions would find one execution overlapping itself (a false
// violation a 40-minute soak once reported).
func TestObserverFoldsEachJournalLineOnceUnderConcurrentPolls(t *testing.T) {
	dir := t.TempDir()
	o := newObserver(dir, newTimeline())
	f, err := os.Create(filepath.Join(dir, "a.journal"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const starts = 400
	var wg sync.WaitGroup
	done := make(chan struct{})
	for range 16 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
					o.poll()
				}
			}
		})
	}
	for i := range starts {
		line, err := json.Marshal(agent.JournalEntry{Event: agent.JournalTaskStart, RunID: "r", TaskID: fmt.Sprint("t", i),
			Try: 1, PID: 1, PGID: 1, Mono: agent.MonoNow()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(append(line, '\n')); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	wg.Wait()
	o.poll()
	var h History
	o.snapshot(&h)
	if len(h.Executions) != starts {
		t.Fatalf("%d task starts journaled, %d executions observed", starts, len(h.Executions))
	}
}

package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/lite/proc"
)

// journalCheckingReporter checks, when the outcome is reported, that the
// journal already holds the task's end and that the task's group is gone.
type journalCheckingReporter struct {
	*memReporter
	t    *testing.T
	path string
	pgid int
	seen chan []JournalEntry
}

func (r *journalCheckingReporter) Report(ctx context.Context, a sdk.Attempt, o Outcome, now time.Time) (bool, error) {
	entries, err := ReadJournal(r.path)
	if err != nil {
		r.t.Error(err)
	}
	if running, err := proc.GroupRunning(r.pgid); err != nil || running {
		r.t.Errorf("the group %d still runs when the outcome is reported (%v)", r.pgid, err)
	}
	r.seen <- entries
	return r.memReporter.Report(ctx, a, o, now)
}

func TestJournal_TaskStartsBeforeItsCommandAndEndsAfterItsGroup(t *testing.T) {
	b := setup(t, `sleep 30 & echo "$$" > "$WORK/leader"; exit 3`)
	j, err := OpenJournal(t.TempDir(), b.cfg.Attempt)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	b.cfg.Journal = j
	rep := &journalCheckingReporter{memReporter: b.rep, t: t, path: j.Path(), seen: make(chan []JournalEntry, 1)}
	pgids := make(chan int, 1)
	b.cfg.OnTaskStarted = func(pgid int) {
		rep.pgid = pgid
		pgids <- pgid
	}
	b.cfg.TerminateGrace, b.cfg.KillWait = 200*time.Millisecond, time.Second
	done := make(chan result, 1)
	go func() {
		out, err := Run(context.Background(), b.cfg, rep)
		done <- result{out, err, time.Now()}
	}()
	pgid := <-pgids
	r := await(t, done, 20*time.Second)
	if r.err != nil || r.out.ExitCode != 3 {
		t.Fatalf("outcome %+v, err %v", r.out, r.err)
	}
	entries := <-rep.seen
	if len(entries) != 2 || entries[0].Event != JournalTaskStart || entries[1].Event != JournalTaskEnd {
		t.Fatalf("journal %+v, want task_start then task_end", entries)
	}
	start, end := entries[0], entries[1]
	if start.PGID != pgid || end.PGID != pgid || start.LeaderStart == 0 || start.PID != os.Getpid() {
		t.Fatalf("journal names group %d/%d (leader start %d), agent %d; want group %d, agent %d",
			start.PGID, end.PGID, start.LeaderStart, start.PID, pgid, os.Getpid())
	}
	if start.Attempt() != b.cfg.Attempt || end.State != sdk.StateFailed || end.Reason != ReasonExitCode ||
		end.ExitCode == nil || *end.ExitCode != 3 {
		t.Fatalf("task_end %+v", end)
	}
	if start.Mono <= 0 || end.Mono < start.Mono || end.Wall.Before(start.Wall) {
		t.Fatalf("times out of order: start %d %s, end %d %s", start.Mono, start.Wall, end.Mono, end.Wall)
	}
	// The command ran after the start was journaled: its leader is the group.
	data, err := os.ReadFile(filepath.Join(b.work, "leader"))
	if err != nil || strings.TrimSpace(string(data)) == "" {
		t.Fatalf("the command did not run: %v", err)
	}
}

func TestJournal_OffByDefault(t *testing.T) {
	var j *Journal
	if err := j.Record(JournalEntry{Event: JournalTaskStart}); err != nil || j.Path() != "" || j.Close() != nil {
		t.Fatalf("a nil journal must record nothing and fail nothing: %v", err)
	}
	b := setup(t, "true")
	r := await(t, b.start(t, context.Background()), 10*time.Second)
	if r.err != nil || r.out.State != sdk.StateSuccess {
		t.Fatalf("outcome %+v, err %v", r.out, r.err)
	}
}

func TestJournal_ALastLineCutShortEndsTheEntries(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j")
	j := `{"event":"agent_start","run_id":"r","task_id":"t","try":1,"epoch":0,"pid":9,"wall":"2024-01-01T00:00:00Z","mono_ns":5}` + "\n" +
		`{"event":"task_st`
	if err := os.WriteFile(path, []byte(j), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := ReadJournal(path)
	if err != nil || len(got) != 1 || got[0].Event != JournalAgentStart || got[0].Mono != 5 {
		t.Fatalf("got %+v, %v", got, err)
	}
}

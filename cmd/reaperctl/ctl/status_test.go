package ctl

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
)

// statusBoard holds two runs: r-old (started two hours ago: one success,
// one attempt held after an agent_lost mark, one never started) and r-new
// (started five minutes ago: one running, one queued).
func statusBoard(t *testing.T) *bundle {
	t.Helper()
	b := setup(t, "")
	b.createRun(t, "r-old", base.Add(-2*time.Hour), "a", "b", "c")
	b.succeeded(t, first("r-old", "a"), base.Add(-110*time.Minute), base.Add(-109*time.Minute), base.Add(-100*time.Minute))
	b.running(t, first("r-old", "b"), base.Add(-110*time.Minute), base.Add(-109*time.Minute), base.Add(-100*time.Minute))
	b.mark(t, first("r-old", "b"), true, base.Add(-94*time.Minute))
	b.createRun(t, "r-new", base.Add(-5*time.Minute), "x", "y")
	b.running(t, first("r-new", "x"), base.Add(-4*time.Minute), base.Add(-3*time.Minute-48*time.Second), base.Add(-12*time.Second))
	b.queued(t, first("r-new", "y"), base.Add(-time.Minute))
	return b
}

func TestStatus(t *testing.T) {
	t.Parallel()

	t.Run("ListsRunsNewestFirst", func(t *testing.T) {
		t.Parallel()
		b := statusBoard(t)
		b.createRun(t, "r-done", base.Add(-3*time.Hour), "z")
		b.succeeded(t, first("r-done", "z"), base.Add(-3*time.Hour), base.Add(-3*time.Hour), base.Add(-150*time.Minute))
		if ok, err := b.w.FinishRun(context.Background(), "r-done", sdk.RunSuccess, "", base.Add(-150*time.Minute+5*time.Second)); err != nil || !ok {
			t.Fatal(ok, err)
		}
		r := b.ctl(t, "status").ok(t)
		golden(t, r.stdout, `
leader: host-a, term 1, lease expires in 1h

RUN     DAG  STATE    AGE  ENDED      TASKS  HELD  BY STATE
r-new   dag  running  5m   -          2      0     running=1 queued=1
r-old   dag  running  2h   -          3      1     none=1 success=1 failed=1
r-done  dag  success  3h   2h30m ago  1      0     success=1
`)
	})

	t.Run("OneRunWithItsAttempts", func(t *testing.T) {
		t.Parallel()
		b := statusBoard(t)
		r := b.ctl(t, "status", "r-old").ok(t)
		golden(t, r.stdout, `
leader: host-a, term 1, lease expires in 1h

RUN    DAG  STATE    AGE  ENDED  TASKS  HELD  BY STATE
r-old  dag  running  2h   -      3      1     none=1 success=1 failed=1

attempts of r-old:
TASK  STATE    TRY  EPOCH  AGE    HEARTBEAT  FAILURE           HELD   ERROR
a     success  1    0      1h40m  -          -                 -      -
b     failed   1    0      1h34m  1h40m      infra:agent_lost  1h34m  agent_lost: no heartbeat for 6m
c     none     1    0      2h     -          -                 -      -
`)
	})

	t.Run("VerboseListsEveryRunsAttempts", func(t *testing.T) {
		t.Parallel()
		b := statusBoard(t)
		r := b.ctl(t, "status", "-v", "-state", "running", "-limit", "1").ok(t)
		golden(t, r.stdout, `
leader: host-a, term 1, lease expires in 1h

RUN    DAG  STATE    AGE  ENDED  TASKS  HELD  BY STATE
r-new  dag  running  5m   -      2      0     running=1 queued=1
(the 1 newest; more runs exist: raise -limit)

attempts of r-new:
TASK  STATE    TRY  EPOCH  AGE    HEARTBEAT  FAILURE  HELD  ERROR
x     running  1    0      3m48s  12s        -        -     -
y     queued   1    0      1m     -          -        -     -
`)
	})

	t.Run("JSONDocument", func(t *testing.T) {
		t.Parallel()
		b := statusBoard(t)
		var doc statusJSON
		b.ctl(t, "status", "--json", "-v").ok(t).decode(t, &doc)
		if doc.Leader == nil || doc.Leader.Term != b.term || !doc.Leader.Held || doc.Leader.Holder != "host-a" {
			t.Fatalf("leader %+v", doc.Leader)
		}
		if len(doc.Runs) != 2 || doc.More || doc.Runs[1].RunID != "r-old" {
			t.Fatalf("runs %+v", doc.Runs)
		}
		old := doc.Runs[1]
		if old.TaskCount != 3 || old.Held != 1 || old.Tasks[sdk.StateFailed] != 1 || len(old.Attempts) != 3 {
			t.Fatalf("r-old %+v", old)
		}
		held := old.Attempts[1]
		if held.TaskID != "b" || held.HeldAt == nil || !held.HeldAt.Equal(base.Add(-94*time.Minute)) ||
			held.LastFailureKind != sdk.FailureInfra || held.FailureReason != sdk.LabelAgentLost ||
			held.RunningAt == nil || held.EndedAt == nil || held.QueuedAt == nil {
			t.Fatalf("held attempt %+v", held)
		}
		if none := old.Attempts[2]; none.QueuedAt != nil || none.Command != "sleep 1" || none.Retries != 1 {
			t.Fatalf("unstarted attempt %+v", none)
		}
	})

	t.Run("TellsTheFencesRecentRefusals", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		b.createRun(t, "r", base.Add(-time.Hour), "a")
		ctx := context.Background()
		// A replica that does not hold the term writes under it, twice;
		// the first refusal is older than the window.
		stale := board.New(b.pool, board.Options{Holder: "host-b"})
		for range 2 {
			if err := stale.AppendLog(ctx, b.term, []sdk.LogLine{{Attempt: first("r", "a"), At: base, Line: "x"}}); !errors.Is(err, board.ErrDeposed) {
				t.Fatalf("a stale holder's write: %v", err)
			}
		}
		if _, err := b.pool.Exec(ctx, `UPDATE fence_refusals SET at = CASE WHEN id = (SELECT min(id) FROM fence_refusals)
            THEN $1::timestamptz ELSE $2::timestamptz END`, base.Add(-25*time.Hour), base.Add(-5*time.Minute)); err != nil {
			t.Fatal(err)
		}
		r := b.ctl(t, "status").ok(t)
		golden(t, r.stdout, `
leader: host-a, term 1, lease expires in 1h
fence: 1 write refused in the last 24h; the last 5m ago: append log under term 1 by host-b (the board's term 1, host-a: holder)

RUN  DAG  STATE    AGE  ENDED  TASKS  HELD  BY STATE
r    dag  running  1h   -      1      0     none=1
`)
		var doc statusJSON
		b.ctl(t, "status", "--json").ok(t).decode(t, &doc)
		f := doc.FenceRefusals
		if f.Count != 1 || !f.Since.Equal(base.Add(-24*time.Hour)) || f.Last == nil || f.Last.Write != "append log" ||
			f.Last.Holder != "host-b" || f.Last.LeadHolder != "host-a" || f.Last.LeadTerm == nil || *f.Last.LeadTerm != b.term ||
			f.Last.Why != board.RefusedHolder || len(f.Last.Attempts) != 1 || f.Last.Attempts[0].TaskID != "a" ||
			f.Last.WriteAt == nil || !f.Last.WriteAt.Equal(base) {
			t.Errorf("fence refusals: %+v last %+v", f, f.Last)
		}
		// None in the window: no line, a count of 0.
		b.cli.Now = func() time.Time { return base.Add(48 * time.Hour) }
		if r := b.ctl(t, "status").ok(t); strings.Contains(r.stdout, "fence:") {
			t.Errorf("a line with no refusal in the window:\n%s", r.stdout)
		}
		var later statusJSON
		b.ctl(t, "status", "--json").ok(t).decode(t, &later)
		if later.FenceRefusals.Count != 0 || later.FenceRefusals.Last != nil {
			t.Errorf("no refusal in the window: %+v", later.FenceRefusals)
		}
	})

	t.Run("EmptyBoardAndNoLeader", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		if _, err := b.pool.Exec(context.Background(), "DELETE FROM leader"); err != nil {
			t.Fatal(err)
		}
		r := b.ctl(t, "status").ok(t)
		golden(t, r.stdout, `
leader: none (no reaperd has led on this board yet)

no runs
`)
	})

	t.Run("LapsedLease", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		b.cli.Now = func() time.Time { return base.Add(2 * time.Hour) }
		r := b.ctl(t, "status").ok(t)
		if !strings.HasPrefix(r.stdout, "leader: none (the lease of term 1, host-a, lapsed 1h ago)\n") {
			t.Fatalf("output:\n%s", r.stdout)
		}
	})

	t.Run("UnknownRun", func(t *testing.T) {
		t.Parallel()
		b := statusBoard(t)
		b.ctl(t, "status", "nope").failed(t, 1, `no run "nope"`)
	})
}

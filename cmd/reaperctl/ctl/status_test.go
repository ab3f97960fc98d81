package ctl

import (
	"context"
	"strings"
	"testing"
	"time"

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

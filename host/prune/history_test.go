package prune_test

import (
	"context"
	"testing"
	"time"

	pgboard "github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/host/prune"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/testkit/byhand"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// The leader keeps the attempt history to its retention: a batch deletes
// what was released before it and keeps the rest; a replica that does not
// lead deletes nothing.
func TestTheLeaderPrunesTheAttemptHistoryPastItsRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	store := pgboard.New(pool, pgboard.Options{})
	lw := lifecycle.New(pool, lifecycle.Options{})
	if err := lw.CreateRun(ctx, lifecycle.NewRun{RunID: "r", DagID: "dag", State: sdk.RunRunning,
		Tasks: []lifecycle.NewTask{{TaskID: "t", Executor: sdk.ExecutorLite, Command: "true"}}}, t0.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	// Released 100, 50 and 1 hours ago (epochs 0, 1, 2 of try 1).
	for epoch, age := range []time.Duration{100 * time.Hour, 50 * time.Hour, time.Hour} {
		if _, err := pool.Exec(ctx, `INSERT INTO attempt_history (run_id, task_id, try_number, attempt_epoch, executor,
            state, released_at) VALUES ('r', 't', 1, $1, 'lite', 'failed', $2)`, epoch, t0.Add(-age)); err != nil {
			t.Fatal(err)
		}
	}
	kept := func() []int {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT attempt_epoch FROM attempt_history ORDER BY attempt_epoch`)
		if err != nil {
			t.Fatal(err)
		}
		var epochs []int
		for rows.Next() {
			var e int
			if err := rows.Scan(&e); err != nil {
				t.Fatal(err)
			}
			epochs = append(epochs, e)
		}
		return epochs
	}
	pruner := func(leading bool) *prune.History {
		lease, _, err := store.TryAcquire(ctx, "test", 72*time.Hour, t0.Add(-time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		lead := byhand.NewLead(leader.Status{Leading: leading, Term: lease.Term, Since: t0.Add(-time.Hour)})
		return prune.NewHistory(prune.Config{Clock: clock.NewFake(t0), Retention: 72 * time.Hour}, lead, store)
	}
	pruner(false).RunOnce(ctx)
	if got := kept(); len(got) != 3 {
		t.Fatalf("a replica that does not lead pruned: kept %v", got)
	}
	pruner(true).RunOnce(ctx)
	if got := kept(); len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("kept epochs %v, want 1 and 2 (released within 72 h)", got)
	}
}

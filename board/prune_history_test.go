package board_test

import (
	"context"
	"testing"
	"time"
)

// PruneHistory deletes only the history released before its time, the
// oldest first, at most its limit a call.
func TestPruneHistoryDeletesTheOldestPastTheTimeInBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.run(t, "r", "t")
	for epoch := range 5 { // released 5, 4, 3, 2 and 1 hours before base
		b.exec(t, `INSERT INTO attempt_history (run_id, task_id, try_number, attempt_epoch, executor, state, released_at)
            VALUES ('r', 't', 1, $1, 'lite', 'failed', $2)`, epoch, base.Add(-time.Duration(5-epoch)*time.Hour))
	}
	left := func() (n int, oldest int) {
		t.Helper()
		if err := b.pool.QueryRow(ctx, `SELECT count(*), coalesce(min(attempt_epoch), -1) FROM attempt_history`).Scan(&n, &oldest); err != nil {
			t.Fatal(err)
		}
		return n, oldest
	}
	// Before base-90m: epochs 0..3; two a call.
	for _, want := range []struct{ deleted, left, oldest int }{{2, 3, 2}, {2, 1, 4}, {0, 1, 4}} {
		n, err := b.store.PruneHistory(ctx, b.term, base, base.Add(-90*time.Minute), 2)
		if err != nil || int(n) != want.deleted {
			t.Fatalf("prune: %d rows, %v; want %d", n, err, want.deleted)
		}
		if l, o := left(); l != want.left || o != want.oldest {
			t.Fatalf("left %d (oldest epoch %d), want %d (oldest %d)", l, o, want.left, want.oldest)
		}
	}
}

package lifecycle_test

import (
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// The board's timeline moves at a promotion, read by a role with no
// privilege beyond its database (as reaperd's is): the kube runner's
// watch for a failover that may have lost a dispatch rests on it.
func TestTimelineMovesAtAPromotion(t *testing.T) {
	t.Parallel()
	primary, standby := pgtest.NewFailoverPair(t, "board", pgtest.StandbyOptions{Synchronous: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn := pgtest.FailoverDSN("board", primary, standby)
	admin := openPool(t, dsn)
	if _, err := admin.Exec(ctx, `CREATE ROLE timeline_reader LOGIN PASSWORD 'reader-pw'`); err != nil {
		t.Fatal(err)
	}
	// Synchronous: the role reaches the standby before the promotion.
	plain := regexp.MustCompile(`user=\S+ password=\S+`).ReplaceAllString(dsn, "user=timeline_reader password=reader-pw")
	w := lifecycle.New(openPool(t, plain), lifecycle.Options{})

	before, err := w.Timeline(ctx)
	if err != nil || before < 1 {
		t.Fatalf("timeline before the failover: %d, %v", before, err)
	}
	if again, err := w.Timeline(ctx); err != nil || again != before {
		t.Fatalf("timeline read again: %d, %v, want %d", again, err, before)
	}
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	var after int64
	for {
		if after, err = w.Timeline(ctx); err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("timeline after the promotion: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // the pool finding the promoted server, not a threshold
	}
	if after <= before {
		t.Fatalf("timeline after the promotion %d, before %d: want it moved on", after, before)
	}
}

func openPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	cfg, err := board.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

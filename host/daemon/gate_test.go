package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/sdktest"
	"github.com/dexaflow/reaper/testkit/eventually"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

// TestSchemaGate drives the gate on a fake clock over a real database: it
// stays closed, saying why, while the database is not migrated, opens at
// the first check after the migration, and never lets a binary below the
// floor through, logging that line once; its retries back off up to the
// cap.
func TestSchemaGate(t *testing.T) {
	t.Parallel()
	ctx := context.Background() // the subtests run after this function returns

	t.Run("OpensOnceMigrated", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewEmptyDB(t)
		clk := clock.NewFake(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
		g := &schemaGate{pool: pool, clock: clk, log: hclog.NewNullLogger(), maxRetry: 2 * time.Second}
		if opened, reason := g.state(); !opened.IsZero() || reason != gateFirstCheck {
			t.Fatalf("before the first check: %v %q", opened, reason)
		}
		done := make(chan error, 1)
		go func() { done <- g.wait(ctx) }()
		eventually.True(t, 10*time.Second, "the gate to say the database is not migrated", func() bool {
			_, reason := g.state()
			return strings.Contains(reason, "not migrated") && strings.Contains(reason, "reaperd migrate")
		})
		// Its retries: 500ms, 1s, then the cap of 2s.
		for _, d := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 2 * time.Second} {
			if err := clk.BlockUntil(ctx, 1); err != nil {
				t.Fatal(err)
			}
			clk.Advance(d - time.Millisecond)
			if clk.Waiters() != 1 {
				t.Fatalf("the gate retried before %s", d)
			}
			clk.Advance(time.Millisecond)
			eventually.True(t, 10*time.Second, "the retry after "+d.String(), func() bool { return clk.Waiters() == 1 })
		}
		if _, err := board.Migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
		clk.Advance(2 * time.Second)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if opened, reason := g.state(); !opened.Equal(clk.Now()) || reason != "" {
			t.Fatalf("open: %v %q", opened, reason)
		}
	})

	t.Run("BelowTheFloorStaysClosed", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewDB(t)
		known := board.SchemaVersion()
		breaking := fmt.Sprintf("%03d_breaking.sql", known+1)
		if _, err := pool.Exec(ctx, "INSERT INTO schema_migrations (version, name, floor) VALUES ($1, $2, $1)", known+1, breaking); err != nil {
			t.Fatal(err)
		}
		clk := clock.NewFake(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
		var logs sdktest.LogBuffer
		g := &schemaGate{pool: pool, clock: clk, log: hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Info})}
		lease := gatedLease{gate: g} // no lease behind it: the gate must answer first
		_, ok, err := lease.TryAcquire(ctx, "h", time.Second, clk.Now())
		var se *board.SchemaError
		if ok || !errors.As(err, &se) || se.Floor != known+1 || se.FloorSetBy != breaking {
			t.Fatalf("acquisition below the floor: %v %v", ok, err)
		}
		wctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- g.wait(wctx) }()
		for i := 0; i < 5; i++ {
			if err := clk.BlockUntil(ctx, 1); err != nil {
				t.Fatal(err)
			}
			clk.Advance(gateRetryMax)
		}
		stop()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("wait: %v", err)
		}
		_, reason := g.state()
		if want := "reaperd cannot start: " + se.Error(); reason != want {
			t.Fatalf("reason %q, want %q", reason, want)
		}
		if n := strings.Count(logs.String(), reason); n != 1 {
			t.Fatalf("the line logged %d times in %s, want once:\n%s", n, 5*gateRetryMax, logs.String())
		}
		clk.Advance(gateRelogEvery)
		if err := g.check(ctx); err == nil {
			t.Fatal("opened below the floor")
		}
		if n := strings.Count(logs.String(), reason); n != 2 {
			t.Fatalf("after %s the line is logged again: %d times", gateRelogEvery, n)
		}
	})

	// A replica that passed the gate before a migration raised the floor
	// above it takes no term after that migration: every acquisition
	// reads the schema again, and the refusal closes the gate.
	t.Run("AFloorRaisedWhileOpenRefusesTheNextTerm", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewDB(t)
		clk := clock.NewFake(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
		g := &schemaGate{pool: pool, clock: clk, log: hclog.NewNullLogger()}
		lease := gatedLease{Lease: leaseStore{board.New(pool, board.Options{})}, gate: g}
		if _, ok, err := lease.TryAcquire(ctx, "h", time.Second, clk.Now()); err != nil || !ok {
			t.Fatalf("first term: %v %v", ok, err)
		}
		opened, _ := g.state()
		clk.Advance(2 * time.Second) // the first term's lease has run out
		if _, ok, err := lease.TryAcquire(ctx, "h", time.Second, clk.Now()); err != nil || !ok {
			t.Fatalf("second term, the schema unchanged: %v %v", ok, err)
		}
		if again, _ := g.state(); !again.Equal(opened) {
			t.Fatalf("a recheck that passed moved the gate's opening from %v to %v", opened, again)
		}
		known := board.SchemaVersion()
		breaking := fmt.Sprintf("%03d_breaking.sql", known+1)
		if _, err := pool.Exec(ctx, "INSERT INTO schema_migrations (version, name, floor) VALUES ($1, $2, $1)", known+1, breaking); err != nil {
			t.Fatal(err)
		}
		clk.Advance(2 * time.Second)
		_, ok, err := lease.TryAcquire(ctx, "h", time.Second, clk.Now())
		var se *board.SchemaError
		if ok || !errors.As(err, &se) || se.Floor != known+1 {
			t.Fatalf("a term after the floor rose above this binary: %v %v", ok, err)
		}
		if opened, reason := g.state(); !opened.IsZero() || !strings.Contains(reason, "reaperd cannot start") {
			t.Fatalf("the gate after the refusal: opened %v, %q; want closed, saying why", opened, reason)
		}
	})
}

package pgtest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/testkit/pgtest"
)

// replicated starts a primary with a database "app" holding a table t of
// ids, and a standby of it; both are stopped, and their directories
// removed, when the test ends.
func replicated(t *testing.T, opts pgtest.StandbyOptions) (primary, standby *pgtest.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary = start(t, pgtest.Options{Replication: true})
	if err := primary.CreateDatabase(ctx, "app", ""); err != nil {
		t.Fatal(err)
	}
	pool := connect(t, primary.DSN("app"))
	if _, err := pool.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	standby, err := primary.Standby(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("standby (synchronous=%v) made and streaming in %v", opts.Synchronous, time.Since(began).Round(time.Millisecond))
	stopWithTest(t, standby)
	return primary, standby
}

func start(t *testing.T, opts pgtest.Options) *pgtest.Server {
	t.Helper()
	srv, err := pgtest.Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	stopWithTest(t, srv)
	return srv
}

// stopWithTest stops srv when the test ends and checks that it left
// neither a process nor its directory.
func stopWithTest(t *testing.T, srv *pgtest.Server) {
	t.Helper()
	t.Cleanup(func() {
		pid := srv.PID()
		if err := srv.Stop(); err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(srv.Dir()); !os.IsNotExist(err) {
			t.Errorf("%s is still there after stop", srv.Dir())
		}
		if pid != 0 && processRunning(pid) {
			t.Errorf("postmaster %d still runs after stop", pid)
		}
	})
}

func connect(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func insert(t *testing.T, pool *pgxpool.Pool, ids ...int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, id := range ids {
		if _, err := pool.Exec(ctx, "INSERT INTO t (id) VALUES ($1)", id); err != nil {
			t.Fatalf("insert %d: %v", id, err)
		}
	}
}

func ids(t *testing.T, pool *pgxpool.Pool) []int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := pool.Query(ctx, "SELECT id FROM t ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var id int
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		out = append(out, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// failover kills primary and promotes standby, timing the promotion.
func failover(t *testing.T, primary, standby *pgtest.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("standby promoted in %v", time.Since(began).Round(time.Millisecond))
}

func TestStandby(t *testing.T) {
	t.Parallel()

	t.Run("SynchronousKeepsEveryAcknowledgedCommit", func(t *testing.T) {
		t.Parallel()
		primary, standby := replicated(t, pgtest.StandbyOptions{Synchronous: true})
		insert(t, connect(t, primary.DSN("app")), 1, 2, 3)
		// No WaitCaughtUp: each commit returned only once the standby had
		// it.
		failover(t, primary, standby)
		if got := ids(t, connect(t, standby.DSN("app"))); !slices.Equal(got, []int{1, 2, 3}) {
			t.Fatalf("rows on the promoted standby = %v, want [1 2 3]", got)
		}
		insert(t, connect(t, standby.DSN("app")), 4) // a primary now
	})

	t.Run("SynchronousCommitWaitsForTheStandby", func(t *testing.T) {
		t.Parallel()
		primary, standby := replicated(t, pgtest.StandbyOptions{Synchronous: true})
		pool := connect(t, primary.DSN("app"))
		insert(t, pool, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := standby.StopStreaming(ctx); err != nil {
			t.Fatal(err)
		}
		// The commit is written on the primary but not acknowledged: it
		// waits for a standby that no longer streams.
		short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancelShort()
		_, err := pool.Exec(short, "INSERT INTO t (id) VALUES (2)")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a commit with the synchronous standby gone returned %v, want it to wait", err)
		}
	})

	t.Run("AsynchronousLosesWhatItHadNotReceived", func(t *testing.T) {
		t.Parallel()
		primary, standby := replicated(t, pgtest.StandbyOptions{})
		pool := connect(t, primary.DSN("app"))
		insert(t, pool, 1, 2)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := standby.WaitCaughtUp(ctx, primary); err != nil {
			t.Fatal(err)
		}
		at, err := standby.ReplayLSN(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := standby.StopStreaming(ctx); err != nil {
			t.Fatal(err)
		}
		insert(t, pool, 3, 4) // acknowledged by the primary, never sent
		end, err := primary.InsertLSN(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if now, err := standby.ReplayLSN(ctx); err != nil || now != at {
			t.Fatalf("the standby replayed on after it stopped streaming: %v -> %v (%v)", at, now, err)
		}
		t.Logf("standby at %v, primary at %v when it dies", at, end)
		failover(t, primary, standby)
		if got := ids(t, connect(t, standby.DSN("app"))); !slices.Equal(got, []int{1, 2}) {
			t.Fatalf("rows on the promoted standby = %v, want [1 2]: 3 and 4 were acknowledged after it stopped streaming", got)
		}
	})

	t.Run("DesynchronizedLosesWhatItHadNotReceived", func(t *testing.T) {
		t.Parallel()
		primary, standby := replicated(t, pgtest.StandbyOptions{Synchronous: true})
		pool := connect(t, primary.DSN("app"))
		insert(t, pool, 1, 2)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := standby.Desynchronize(ctx, primary); err != nil {
			t.Fatal(err)
		}
		if err := standby.StopStreaming(ctx); err != nil {
			t.Fatal(err)
		}
		// No longer waited for: the commits return, and are lost.
		short, cancelShort := context.WithTimeout(ctx, 5*time.Second)
		defer cancelShort()
		for _, id := range []int{3, 4} {
			if _, err := pool.Exec(short, "INSERT INTO t (id) VALUES ($1)", id); err != nil {
				t.Fatalf("insert %d with the standby desynchronized and stopped: %v", id, err)
			}
		}
		failover(t, primary, standby)
		if got := ids(t, connect(t, standby.DSN("app"))); !slices.Equal(got, []int{1, 2}) {
			t.Fatalf("rows on the promoted standby = %v, want [1 2]: 3 and 4 were acknowledged after it stopped streaming", got)
		}
		if err := primary.Desynchronize(ctx, standby); err == nil {
			t.Error("a primary desynchronized as if it were a standby")
		}
	})

	t.Run("NeedsAReplicationPrimary", func(t *testing.T) {
		t.Parallel()
		if _, err := pgtest.Current(t).Standby(context.Background(), pgtest.StandbyOptions{}); err == nil {
			t.Fatal("a standby of a server started without Replication")
		}
	})
}

func TestKill(t *testing.T) {
	t.Parallel()
	srv := start(t, pgtest.Options{})
	pool := connect(t, srv.DSN("postgres"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	pid := srv.PID()
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	if processRunning(pid) {
		t.Fatalf("postmaster %d runs after Kill", pid)
	}
	if _, err := pool.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("a query succeeded on a killed server")
	}
	if _, err := os.Stat(srv.Dir()); err != nil {
		t.Fatalf("Kill removed the directory: %v", err)
	}
}

func TestFreezeStallsUntilThaw(t *testing.T) {
	t.Parallel()
	srv := start(t, pgtest.Options{})
	pool := connect(t, srv.DSN("postgres"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx) // an open session, as a replica holds
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	defer srv.Thaw()

	answered := make(chan error, 1)
	go func() { // ends when the query answers or ctx ends
		var one int
		answered <- conn.QueryRow(ctx, "SELECT 1").Scan(&one)
	}()
	var queryErr error
	queried := false
	defer func() { // before the connection goes back to the pool
		if !queried {
			_ = srv.Thaw()
			cancel()
			<-answered
		}
	}()
	// A stall, not a death: no answer and no error while frozen...
	stall := time.NewTimer(300 * time.Millisecond)
	defer stall.Stop()
	select {
	case err := <-answered:
		queried = true
		t.Fatalf("a query on a frozen server answered: %v", err)
	case <-stall.C:
	}
	// ... nor is a new connection refused: it waits for its handshake.
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	if err := pool.Ping(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ping on a frozen server: %v, want it to wait", err)
	}
	if err := srv.Thaw(); err != nil {
		t.Fatal(err)
	}
	queryErr, queried = <-answered, true
	if queryErr != nil {
		t.Fatalf("the query that waited through the freeze: %v, want its answer", queryErr)
	}
}

// processRunning reports whether pid exists and is not a zombie.
func processRunning(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

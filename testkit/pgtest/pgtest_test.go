package pgtest_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestNewDB(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("HoldsTheCurrentSchema", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewDB(t)
		if err := board.CheckSchema(ctx, pool); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("IsIsolatedFromOtherTests", func(t *testing.T) {
		t.Parallel()
		a, b := pgtest.NewDB(t), pgtest.NewDB(t)
		if _, err := a.Exec(ctx, `INSERT INTO runs (run_id, dag_id, state, updated_at) VALUES ('r', 'd', 'queued', now())`); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := b.QueryRow(ctx, "SELECT count(*) FROM runs").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatalf("a row written in one test's database is visible in another's: %d rows", n)
		}
	})

	t.Run("EmptyHasNoSchema", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewEmptyDB(t)
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatalf("an empty database holds %d tables", n)
		}
	})

	t.Run("DSNReachesTheSameDatabase", func(t *testing.T) {
		t.Parallel()
		dsn := pgtest.NewDSN(t)
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if err := conn.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

func TestServerRunsUnprivileged(t *testing.T) {
	t.Parallel()
	srv := pgtest.Current(t)
	st, err := os.Stat(filepath.Join(srv.Dir(), "data"))
	if err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 && statUID(st) == 0 {
		t.Fatal("the data directory belongs to root: the server would refuse to run")
	}
}

func TestStartAndStop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, detached := range []bool{false, true} {
		srv, err := pgtest.Start(ctx, pgtest.Options{Detached: detached})
		if err != nil {
			t.Fatal(err)
		}
		conn, err := pgx.Connect(ctx, srv.DSN("postgres"))
		if err != nil {
			srv.Stop()
			t.Fatal(err)
		}
		conn.Close(ctx)
		dir := srv.Dir()
		if detached {
			err = pgtest.StopDir(dir)
		} else {
			err = srv.Stop()
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Fatalf("detached=%v: %s is still there after stop", detached, dir)
		}
		if _, err := pgx.Connect(ctx, srv.DSN("postgres")); err == nil {
			t.Fatalf("detached=%v: the server still answers after stop", detached)
		}
	}
}

func TestPauseAndResume(t *testing.T) {
	ctx := context.Background()
	srv, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	pool, err := pgxpool.New(ctx, srv.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("ping before pause: %v", err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := pool.Ping(ctx); err == nil {
		t.Fatal("ping succeeded while paused")
	}
	if err := srv.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("ping after resume: %v", err)
	}
}

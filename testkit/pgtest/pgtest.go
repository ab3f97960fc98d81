package pgtest

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
)

// TemplateDB is the database, migrated to the board's schema, that every
// NewDB database is copied from.
const TemplateDB = "reaper_template"

// harness is the server of the running test binary. It is the package's one
// piece of mutable state: TestMain sets it once, before any test runs, and
// clears it after the last; the testing package offers no other way to hand
// a value from TestMain to the tests.
var harness atomic.Pointer[Server]

// Main is a TestMain: it starts the test binary's server, makes the
// migrated template database, runs the tests, then stops the server and
// removes its directory, and exits with the tests' code.
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
func Main(m *testing.M) {
	os.Exit(Run(m))
}

// Run is Main without the exit, for a TestMain that has set-up or clean-up
// of its own around the tests: it returns the tests' exit code.
func Run(m *testing.M) int {
	ctx := context.Background()
	srv, err := Start(ctx, Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		harness.Store(nil)
		if err := srv.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	if err := makeTemplate(ctx, srv); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	harness.Store(srv)
	return m.Run()
}

func makeTemplate(ctx context.Context, srv *Server) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := srv.CreateBoardDatabase(ctx, TemplateDB); err != nil {
		return err
	}
	// No connection may linger on a template that is being copied.
	if _, err := srv.admin.Exec(ctx, "ALTER DATABASE "+TemplateDB+" WITH ALLOW_CONNECTIONS false"); err != nil {
		return fmt.Errorf("pgtest: seal the template: %w", err)
	}
	return nil
}

// CreateBoardDatabase creates database name holding the board's schema,
// migrated: on a server of a test's own (a primary whose standbys are made
// before or after), where there is no template to copy.
func (s *Server) CreateBoardDatabase(ctx context.Context, name string) error {
	if err := s.CreateDatabase(ctx, name, ""); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, s.DSN(name))
	if err != nil {
		return fmt.Errorf("pgtest: connect to %s: %w", name, err)
	}
	_, err = board.Migrate(ctx, pool)
	pool.Close()
	if err != nil {
		return fmt.Errorf("pgtest: migrate %s: %w", name, err)
	}
	return nil
}

// Current returns the test binary's server. It fails t when the package's
// TestMain does not call Main.
func Current(t testing.TB) *Server {
	t.Helper()
	srv := harness.Load()
	if srv == nil {
		t.Fatal("pgtest: no server: the package's TestMain must call pgtest.Main(m)")
	}
	return srv
}

// NewDB returns a pool on a fresh database that holds the board's schema
// and nothing else. The pool is closed and the database dropped when the
// test ends.
func NewDB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return newDB(t, TemplateDB)
}

// NewEmptyDB returns a pool on a fresh database with no schema at all (for
// migration tests).
func NewEmptyDB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return newDB(t, "template0")
}

// NewDSN makes a fresh database that holds the board's schema and returns
// its connection string, for tests that hand it to another process. The
// database is dropped when the test ends.
func NewDSN(t testing.TB) string {
	t.Helper()
	srv := Current(t)
	name := createDB(t, srv, TemplateDB)
	return srv.DSN(name)
}

// DSN returns the connection string a pool was made from.
func DSN(pool *pgxpool.Pool) string { return pool.Config().ConnString() }

func newDB(t testing.TB, template string) *pgxpool.Pool {
	t.Helper()
	srv := Current(t)
	name := createDB(t, srv, template)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, srv.DSN(name))
	if err != nil {
		t.Fatalf("pgtest: connect to %s: %v", name, err)
	}
	t.Cleanup(pool.Close) // runs before the drop registered earlier
	return pool
}

func createDB(t testing.TB, srv *Server, template string) string {
	t.Helper()
	name := srv.UniqueName("test")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.CreateDatabase(ctx, name, template); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.DropDatabase(ctx, name); err != nil {
			t.Error(err)
		}
	})
	return name
}

// NewOwnBoard starts a server of the test's own (one a fault may freeze,
// kill or restart without touching the other tests' databases) holding a
// database with the board's schema, named from prefix, and returns the
// server and the database's DSN. The server is stopped, and its directory
// removed, when the test ends.
func NewOwnBoard(t testing.TB, prefix string) (*Server, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	name := srv.UniqueName(prefix)
	if err := srv.CreateBoardDatabase(ctx, name); err != nil {
		t.Fatal(err)
	}
	return srv, srv.DSN(name)
}

// NewFailoverPair starts a primary of the test's own (Options.Replication)
// holding database, with the board's schema, and a standby of it made with
// opts, for failover tests: the test may Kill the primary and Promote the
// standby (FailoverDSN names both). Both are stopped, and their directories
// removed, when the test ends.
func NewFailoverPair(t testing.TB, database string, opts StandbyOptions) (primary, standby *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary, err := Start(ctx, Options{Replication: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopOrFail(t, primary) })
	if err := primary.CreateBoardDatabase(ctx, database); err != nil {
		t.Fatal(err)
	}
	if standby, err = primary.Standby(ctx, opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopOrFail(t, standby) })
	return primary, standby
}

func stopOrFail(t testing.TB, srv *Server) {
	if err := srv.Stop(); err != nil {
		t.Error(err)
	}
}

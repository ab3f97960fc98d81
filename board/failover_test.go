package board_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// failoverPool is the pool reaperd would open on dsn: board.ParseDSN, then
// pgxpool.NewWithConfig.
func failoverPool(t *testing.T, dsn string) *pgxpool.Pool {
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

// serverPort is the port of the server that answers a call on pool, and
// whether it is a primary.
func serverPort(ctx context.Context, pool *pgxpool.Pool) (port int, primary bool, err error) {
	err = pool.QueryRow(ctx, "SELECT inet_server_port(), NOT pg_is_in_recovery()").Scan(&port, &primary)
	return port, primary, err
}

// TestMultiHostDSNFollowsAPromotion: a pool opened as reaperd opens it, on
// a DSN naming the primary and its standby with
// target_session_attrs=read-write, reaches the primary while it lives
// (whichever server the DSN names first), says why it cannot write while
// no server is primary, and once the standby is promoted makes its new
// connections there, without being opened again.
func TestMultiHostDSNFollowsAPromotion(t *testing.T) {
	t.Parallel()
	primary, standby := pgtest.NewFailoverPair(t, "board", pgtest.StandbyOptions{Synchronous: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	pool := failoverPool(t, pgtest.FailoverDSN("board", primary, standby))
	standbyFirst := failoverPool(t, pgtest.FailoverDSN("board", standby, primary))
	for name, p := range map[string]*pgxpool.Pool{"primary first": pool, "standby first": standbyFirst} {
		if port, isPrimary, err := serverPort(ctx, p); err != nil || port != primary.Port() || !isPrimary {
			t.Fatalf("%s: the pool reached port %d (primary %v, err %v), want the primary's %d", name, port, isPrimary, err,
				primary.Port())
		}
	}
	store := board.New(pool, board.Options{})
	if _, ok, err := store.TryAcquire(ctx, "A", leaseTTL, base); err != nil || !ok {
		t.Fatalf("acquire on the primary: ok=%v err=%v", ok, err)
	}
	// Several connections open on the primary, as a replica's pool holds.
	var held []*pgxpool.Conn
	for range 4 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	for _, c := range held {
		c.Release()
	}

	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	// No primary: a new connection finds only the standby, and says so.
	fresh := failoverPool(t, pgtest.FailoverDSN("board", primary, standby))
	err := fresh.Ping(ctx)
	if err == nil {
		t.Fatal("a connection was made while no server accepts writes")
	}
	if got := board.ConnProblem(err); !strings.Contains(got, "no server of the DSN accepts writes") {
		t.Fatalf("ConnProblem with the primary dead and the standby not promoted = %q (%v)", got, err)
	}

	began := time.Now()
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	// The pool's connections to the dead primary fail their next call
	// and are dropped; new ones reach the promoted standby.
	var failed int
	for {
		l, ok, err := store.CurrentLeader(ctx)
		if err == nil {
			if !ok || l.Holder != "A" {
				t.Fatalf("leader on the promoted standby = %+v (found %v), want A's: the standby was synchronous", l, ok)
			}
			break
		}
		if failed++; ctx.Err() != nil || failed > 100 {
			t.Fatalf("the pool never reached the promoted standby (%d calls failed): %v", failed, err)
		}
	}
	t.Logf("promotion %v; %d calls failed on the dead primary's connections, then the pool answered from the new primary %v after the promotion",
		promoted.Sub(began).Round(time.Millisecond), failed, time.Since(promoted).Round(time.Millisecond))
	for range 8 { // every connection now: none is left on the dead server
		if port, isPrimary, err := serverPort(ctx, pool); err != nil || port != standby.Port() || !isPrimary {
			t.Fatalf("after the promotion the pool reached port %d (primary %v, err %v), want the promoted standby's %d",
				port, isPrimary, err, standby.Port())
		}
	}
	if _, ok, err := store.Renew(ctx, 1, "A", leaseTTL, base.Add(time.Minute)); err != nil || !ok {
		t.Fatalf("renew on the promoted standby: ok=%v err=%v", ok, err)
	}
}

// TestMultiHostDSNPassesAStalledPrimary: when the old primary hangs rather
// than refuses (its processes stopped, as by a frozen disk) and the standby
// is promoted, a connection through a multi-host DSN that gives no
// connect_timeout gives up on the stalled server after
// board.ConnectTimeoutMultiHostDefault and reaches the promoted standby,
// within a call's bound; without that default it would wait on the stalled
// server for the whole bound.
func TestMultiHostDSNPassesAStalledPrimary(t *testing.T) {
	t.Parallel()
	primary, standby := pgtest.NewFailoverPair(t, "board", pgtest.StandbyOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := primary.Freeze(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	dsn := pgtest.FailoverDSN("board", primary, standby)
	bound := 2 * board.ConnectTimeoutMultiHostDefault

	pool := failoverPool(t, dsn)
	call, cancelCall := context.WithTimeout(ctx, bound)
	defer cancelCall()
	began := time.Now()
	if port, isPrimary, err := serverPort(call, pool); err != nil || port != standby.Port() || !isPrimary {
		t.Fatalf("with the primary stalled the pool reached port %d (primary %v, err %v), want the promoted standby's %d",
			port, isPrimary, err, standby.Port())
	}
	t.Logf("reached the promoted standby past the stalled primary in %v", time.Since(began).Round(time.Millisecond))

	// The same DSN parsed without the default: the stalled server takes
	// the whole bound.
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	call2, cancelCall2 := context.WithTimeout(ctx, bound)
	defer cancelCall2()
	if conn, err := pgx.ConnectConfig(call2, cfg); err == nil {
		conn.Close(ctx)
		t.Fatal("without a connect timeout, a connection passed the stalled primary: the test proves nothing")
	}
}

// TestFollowPrimary: ParseDSN fits a DSN naming more than one server to a
// failover (only a server accepting writes, a connect timeout per server)
// and leaves one naming a single server as pgx parses it, its TLS fallback
// of sslmode=prefer included.
func TestFollowPrimary(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, dsn  string
		readWrite  bool
		timeout    time.Duration
		validation bool // any ValidateConnect
	}{
		{"OneServer", "host=db port=5432 dbname=board", false, 0, false},
		{"OneServerURL", "postgres://u@db:5432/board?sslmode=prefer", false, 0, false},
		{"OneServerTwice", "host=db,db port=5432,5432 dbname=board", false, 0, false},
		{"TwoServers", "host=a,b port=5432,5433 dbname=board", true, board.ConnectTimeoutMultiHostDefault, true},
		{"TwoServersURL", "postgres://u@a:5432,b:5433/board", true, board.ConnectTimeoutMultiHostDefault, true},
		{"TwoServersAny", "host=a,b dbname=board target_session_attrs=any", true, board.ConnectTimeoutMultiHostDefault, true},
		{"TwoServersOwnTimeout", "host=a,b dbname=board target_session_attrs=read-write connect_timeout=7", true, 7 * time.Second, true},
		{"TwoServersPrimary", "host=a,b dbname=board target_session_attrs=primary", false, board.ConnectTimeoutMultiHostDefault, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := board.ParseDSN(tc.dsn)
			if err != nil {
				t.Fatal(err)
			}
			cc := cfg.ConnConfig
			if got := cc.ConnectTimeout; got != tc.timeout {
				t.Errorf("connect timeout = %v, want %v", got, tc.timeout)
			}
			if got := cc.ValidateConnect != nil; got != tc.validation {
				t.Fatalf("a connection validated: %v, want %v", got, tc.validation)
			}
			if got := fmt.Sprintf("%p", cc.ValidateConnect) == fmt.Sprintf("%p", pgconn.ValidateConnectTargetSessionAttrsReadWrite); tc.validation && got != tc.readWrite {
				t.Errorf("read-write validation: %v, want %v", got, tc.readWrite)
			}
		})
	}
}

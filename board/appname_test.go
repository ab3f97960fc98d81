package board_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// A pool's connections carry the name given (reaperd's: its holder) as
// their application_name, so pg_stat_activity (and a trigger) tells which
// replica holds which; a DSN that names its application keeps its own
// name, and a name longer than the server keeps is cut whole characters
// at a time.
func TestNameConnections(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDSN(t)
	holder := "node-1/4242/0a1b2c3d"
	cfg, err := board.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	board.NameConnections(cfg, holder)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var got string
	if err := pool.QueryRow(context.Background(),
		`SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != holder {
		t.Errorf("the connection's application_name is %q, want the holder %q", got, holder)
	}

	own, err := board.ParseDSN(dsn + "&application_name=operators-own")
	if err != nil {
		t.Fatal(err)
	}
	board.NameConnections(own, holder)
	if n := own.ConnConfig.RuntimeParams["application_name"]; n != "operators-own" {
		t.Errorf("a DSN's own application_name became %q", n)
	}

	long := strings.Repeat("h", board.MaxApplicationName-1) + "é/1/abcd"
	cut, _ := board.ParseDSN(dsn)
	board.NameConnections(cut, long)
	if n := cut.ConnConfig.RuntimeParams["application_name"]; n != strings.Repeat("h", board.MaxApplicationName-1) {
		t.Errorf("a long holder became %q (%d bytes), want it cut before the split character", n, len(n))
	}
}

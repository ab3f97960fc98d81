package daemon

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// A restarted container's reaperd has its predecessor's host name and
// process id (PID 1 in the same pod): its leader identity must differ all
// the same, or it would take the predecessor's Lease and term as its own.
func TestDefaultHolderIsOneProcesssOwn(t *testing.T) {
	host, _ := os.Hostname()
	prefix := fmt.Sprintf("%s/%d/", host, os.Getpid())
	a, b := defaultHolder(), defaultHolder()
	if !strings.HasPrefix(a, prefix) || !strings.HasPrefix(b, prefix) {
		t.Fatalf("holders %q %q, want them to start with %q", a, b, prefix)
	}
	if a == b {
		t.Fatalf("two processes with the same host and pid got one holder %q", a)
	}
}

// reaperd's connections carry its holder as their application_name, so
// pg_stat_activity (and a trigger) tells which replica holds which; a DSN
// that names its application keeps its own name, and a holder longer than
// the server keeps is cut whole characters at a time.
func TestConnectionsNamedByHolder(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDSN(t)
	holder := defaultHolder()
	cfg, err := board.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	nameConnections(cfg, holder)
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
	nameConnections(own, holder)
	if n := own.ConnConfig.RuntimeParams["application_name"]; n != "operators-own" {
		t.Errorf("a DSN's own application_name became %q", n)
	}

	long := strings.Repeat("h", maxApplicationName-1) + "é/1/abcd"
	cut, _ := board.ParseDSN(dsn)
	nameConnections(cut, long)
	if n := cut.ConnConfig.RuntimeParams["application_name"]; n != strings.Repeat("h", maxApplicationName-1) {
		t.Errorf("a long holder became %q (%d bytes), want it cut before the split character", n, len(n))
	}
}

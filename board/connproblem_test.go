package board_test

import (
	"context"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// TestConnProblem: each way a DSN goes wrong against a real server is said
// in one line that carries nothing of the DSN: no password, user, host,
// port or database name.
func TestConnProblem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	good, err := url.Parse(pgtest.NewDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	const secret = "s3cret-canary-7f"
	with := func(f func(u *url.URL)) string {
		u := *good
		f(&u)
		q := u.Query()
		q.Set("connect_timeout", "5")
		u.RawQuery = q.Encode()
		return u.String()
	}
	for _, tc := range []struct {
		name, dsn, want string
	}{
		{"WrongPassword", with(func(u *url.URL) { u.User = url.UserPassword(u.User.Username(), secret) }), "refused the password"},
		{"NoSuchDatabase", with(func(u *url.URL) { u.Path = "/nodb_" + secret }), "does not exist"},
		{"NothingListens", with(func(u *url.URL) { u.Host = closed }), "connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := board.ParseDSN(tc.dsn)
			if err != nil {
				t.Fatal(err)
			}
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			err = pool.Ping(pctx)
			line := board.ConnProblem(err)
			if err == nil || !strings.Contains(line, tc.want) {
				t.Fatalf("ping: %v; said %q, want %q", err, line, tc.want)
			}
			for _, part := range []string{secret, good.User.Username(), good.Hostname(), good.Port(), strings.TrimPrefix(good.Path, "/"), "\n"} {
				if strings.Contains(line, part) {
					t.Errorf("%q carries %q of the DSN", line, part)
				}
			}
		})
	}
	t.Run("Malformed", func(t *testing.T) {
		t.Parallel()
		_, err := board.ParseDSN("postgres://reaper:" + secret + "@db:notaport/reaper")
		if err != board.ErrDSNInvalid || strings.Contains(board.ConnProblem(err), secret) {
			t.Fatalf("%v", err)
		}
	})
	if board.ConnProblem(nil) != "" {
		t.Error("nil is no problem")
	}
}

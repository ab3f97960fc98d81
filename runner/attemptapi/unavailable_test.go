package attemptapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// A call whose board write fails is answered 503 unavailable (the agent
// retries it) in the server's own fixed words: the database's error, which
// names its host, database, role, tables or statements, goes to the log
// only, never to whoever holds a token. Each case breaks the API's board
// on a real PostgreSQL in its own way.
func TestUnavailableAnswerCarriesNoDatabaseText(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// board returns the API's broken board, and the words of the
		// database's error the log is to hold.
		board func(t *testing.T, b *bundle) (*pgxpool.Pool, []string)
	}{
		{"TheDatabaseRefusesTheConnection", func(t *testing.T, b *bundle) (*pgxpool.Pool, []string) {
			cfg, err := pgxpool.ParseConfig(pgtest.DSN(b.pool))
			if err != nil {
				t.Fatal(err)
			}
			cfg.ConnConfig.Database = "reaper_board_that_is_not_there"
			return newPool(t, cfg), []string{"reaper_board_that_is_not_there"}
		}},
		{"TheBoardsTablesAreMissing", func(t *testing.T, b *bundle) (*pgxpool.Pool, []string) {
			return pgtest.NewEmptyDB(t), []string{"task_instances", "SQLSTATE"}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var dbWords []string
			b := setupWith(t, func(b *bundle, c *attemptapi.ServerConfig) {
				var broken *pgxpool.Pool
				broken, dbWords = tc.board(t, b)
				c.Board = lifecycle.New(broken, lifecycle.Options{CredentialCeiling: ceiling})
			})
			a := sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1}
			token, _, err := b.keys.get().Mint(a, b.clk.Now(), ttl)
			if err != nil {
				t.Fatal(err)
			}
			status, body := rawCall(t, b, attemptapi.PathRunning, token, a)
			var eb attemptapi.ErrorBody
			if err := json.Unmarshal(body, &eb); err != nil || status != http.StatusServiceUnavailable ||
				eb.Code != attemptapi.CodeUnavailable {
				t.Fatalf("answer %d %s (decode: %v), want 503 %s", status, body, err, attemptapi.CodeUnavailable)
			}
			dsn := pgtest.DSN(b.pool)
			for _, leak := range append([]string{"SQLSTATE", "FATAL", "ERROR", "pgx", "postgres", "does not exist",
				"relation", "dial", "127.0.0.1", "localhost", dsn}, dbWords...) {
				if strings.Contains(string(body), leak) {
					t.Fatalf("the 503 body %s carries the database's text %q", body, leak)
				}
			}
			logged := b.log.String()
			for _, w := range dbWords {
				if !strings.Contains(logged, w) {
					t.Fatalf("the log lacks the database's error (%q):\n%s", w, logged)
				}
			}
			if got := b.meter.Count("running/" + attemptapi.CodeUnavailable); got != 1 {
				t.Fatalf("%d calls metered unavailable, want 1", got)
			}
		})
	}
}

func newPool(t *testing.T, cfg *pgxpool.Config) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// rawCall posts the call for a with token and returns the answer's status
// and its whole body, as anyone holding the token reads it.
func rawCall(t *testing.T, b *bundle, path, token string, a sdk.Attempt) (int, []byte) {
	t.Helper()
	tr, err := attemptapi.NewTransport(b.ca)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: tr}
	t.Cleanup(tr.CloseIdleConnections)
	raw, err := json.Marshal(attemptapi.Request{RunID: a.RunID, TaskID: a.TaskID, Try: a.Try, Epoch: a.Epoch})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.url+path, bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, body
}

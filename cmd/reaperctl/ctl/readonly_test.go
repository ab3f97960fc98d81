package ctl

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/sdk"
)

// readOnlySQL is the role file the project ships for operators who only
// look (deploy/sql).
var readOnlySQL = filepath.Join("..", "..", "..", "deploy", "sql", "reaper-readonly.sql")

var loginSeq atomic.Int64

// readOnly applies the shipped role file to the bundle's board (as its
// owner), makes a login that is a member of reaper_readonly and nothing
// else, and returns a configuration file naming the board through it, and
// its DSN.
func (b *bundle) readOnly(t *testing.T) (cfgPath, dsn string) {
	t.Helper()
	ctx := context.Background()
	sql, err := os.ReadFile(readOnlySQL)
	if err != nil {
		t.Fatal(err)
	}
	// The file as an operator runs it, twice: it may be run again.
	for range 2 {
		if _, err := b.pool.Exec(ctx, string(sql)); err != nil {
			t.Fatalf("apply %s: %v", readOnlySQL, err)
		}
	}
	login := fmt.Sprintf("ctl_viewer_%d_%d", os.Getpid(), loginSeq.Add(1))
	if _, err := b.pool.Exec(ctx, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD 'viewer' IN ROLE reaper_readonly", login)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = b.pool.Exec(context.Background(), "DROP OWNED BY "+login+"; DROP ROLE "+login) })
	u, err := url.Parse(b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(login, "viewer")
	return writeConfig(t, u.String(), ""), u.String()
}

// viewerBoard is heldBoard with a finished run and decisions in the audit,
// so that every read command has something to read.
func viewerBoard(t *testing.T) *bundle {
	t.Helper()
	b := heldBoard(t)
	b.createRun(t, "done", base.Add(-3*time.Hour), "x")
	b.succeeded(t, first("done", "x"), base.Add(-170*time.Minute), base.Add(-169*time.Minute), base.Add(-160*time.Minute))
	b.decide(t, base.Add(-30*time.Minute), sdk.Decision{Reaper: "agentlost", Label: sdk.LabelAgentLost, Applied: true,
		Attempt: first("r", "a"), Detail: "no heartbeat for 6m", Evidence: map[string]string{"heartbeat_age": "6m"}})
	return b
}

// TestReadCommandsWorkWithTheShippedReadOnlyRole: with a login that holds
// only deploy/sql/reaper-readonly.sql's grants, every read command prints
// exactly what it prints for the board's owner (so none of them writes:
// the role may not), and every writing command is refused with one line
// saying the role may not write the board, exits 1 and changes nothing.
func TestReadCommandsWorkWithTheShippedReadOnlyRole(t *testing.T) {
	t.Parallel()
	b := viewerBoard(t)
	viewer := *b
	var dsn string
	viewer.cfgPath, dsn = b.readOnly(t)

	t.Run("TheRoleReadsNoMoreAndWritesNothing", func(t *testing.T) {
		// The control: the login is not privileged some other way.
		pool, err := pgxpool.New(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		for _, sql := range []string{
			"SELECT count(*) FROM warm_worker_claims",
			"SELECT count(*) FROM worker_credential_exchanges",
			"UPDATE runs SET updated_at = now()",
			"INSERT INTO reap_decisions (at, term, reaper, label, applied, dry_run) VALUES (now(), 0, 'x', 'y', true, false)",
			"DELETE FROM attempt_log",
		} {
			if _, err := pool.Exec(context.Background(), sql); !isInsufficientPrivilege(err) {
				t.Fatalf("%s: %v, want insufficient_privilege", sql, err)
			}
		}
	})

	reads := [][]string{
		{"status"}, {"status", "-v"}, {"status", "r"}, {"status", "-json", "r"},
		{"explain", "r", "a"}, {"explain", "-json", "r", "a"},
		{"tune"}, {"tune", "-json"},
		{"replay"}, {"replay", "-o", "json"},
		{"shadow"}, {"shadow", "-o", "json"},
		{"held"}, {"held", "-json"},
	}
	for _, args := range reads {
		t.Run("Reads/"+strings.Join(args, "_"), func(t *testing.T) {
			want := b.ctl(t, args[0], args[1:]...).ok(t)
			got := viewer.ctl(t, args[0], args[1:]...).ok(t)
			if got.stdout != want.stdout {
				t.Fatalf("the read-only role reads\n%s\nthe owner\n%s", got.stdout, want.stdout)
			}
		})
	}

	writes := [][]string{
		{"submit", "-run", "new", "--", "true"},
		{"mark", "-by", "alice", "r", "d", "failed"},
		{"release", "-by", "alice", "r", "a"},
	}
	for _, args := range writes {
		t.Run("RefusesWrite/"+args[0], func(t *testing.T) {
			before := b.snapshot(t)
			audit := b.auditCount(t)
			viewer.ctl(t, args[0], args[1:]...).failed(t, exitFail, "the database role may not write the board")
			b.unchanged(t, before)
			if n := b.auditCount(t); n != audit {
				t.Fatalf("the audit grew from %d to %d rows", audit, n)
			}
		})
	}
}

// auditCount is how many rows the audit and the try logs hold.
func (b *bundle) auditCount(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(),
		"SELECT (SELECT count(*) FROM reap_decisions) + (SELECT count(*) FROM attempt_log)").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestWritingCommandsNameTheOperatorInTheAudit: submit, mark and release
// audit the operator with the action (-by, else the OS user), and a
// malformed name is refused before anything is read or written.
func TestWritingCommandsNameTheOperatorInTheAudit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	operatorOf := func(t *testing.T, b *bundle, runID, taskID, label string) string {
		t.Helper()
		recs, err := b.store.DecisionsFor(ctx, runID, taskID, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.Label == label {
				return r.Evidence["operator"]
			}
		}
		t.Fatalf("no %s decision about %s/%s in %+v", label, runID, taskID, recs)
		return ""
	}

	t.Run("Submit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		b.ctl(t, "submit", "-by", "carol", "-run", "new", "--", "true").ok(t)
		if got := operatorOf(t, b, "new", "", sdk.LabelOperatorSubmit); got != "carol" {
			t.Fatalf("operator_submit names %q, want carol", got)
		}
	})

	t.Run("Mark", func(t *testing.T) {
		t.Parallel()
		b := heldBoard(t)
		b.ctl(t, "mark", "-by", "alice", "r", "d", "failed").ok(t)
		if got := operatorOf(t, b, "r", "d", sdk.LabelOperatorMark); got != "alice" {
			t.Fatalf("operator_mark names %q, want alice", got)
		}
	})

	t.Run("ReleaseByDefaultNamesTheOSUser", func(t *testing.T) {
		t.Parallel()
		b := heldBoard(t)
		b.ctl(t, "release", "r", "a").ok(t)
		want := defaultOperator()
		if got := operatorOf(t, b, "r", "a", sdk.LabelOperatorRelease); got != want || got == "" {
			t.Fatalf("operator_release names %q, want the OS user %q", got, want)
		}
		log, err := b.store.AttemptLog(ctx, "r", "a")
		if err != nil || len(log) == 0 || log[len(log)-1].Line != "hold released by operator "+want {
			t.Fatalf("try log %+v %v", log, err)
		}
	})

	t.Run("ReleaseBy", func(t *testing.T) {
		t.Parallel()
		b := heldBoard(t)
		b.ctl(t, "release", "-by", "bob", "r", "a").ok(t)
		if got := operatorOf(t, b, "r", "a", sdk.LabelOperatorRelease); got != "bob" {
			t.Fatalf("operator_release names %q, want bob", got)
		}
	})

	t.Run("AMalformedNameIsRefusedAndChangesNothing", func(t *testing.T) {
		t.Parallel()
		b := heldBoard(t)
		before, audit := b.snapshot(t), b.auditCount(t)
		for _, args := range [][]string{
			{"submit", "-by", "two words", "-run", "new", "--", "true"},
			{"mark", "-by", "two words", "r", "d", "failed"},
			{"release", "-by", "", "r", "a"},
		} {
			b.ctl(t, args[0], args[1:]...).failed(t, exitUsage, "-by:")
		}
		b.unchanged(t, before)
		if n := b.auditCount(t); n != audit {
			t.Fatalf("the audit grew from %d to %d rows", audit, n)
		}
	})
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/eventually"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// ProbeTag is the build tag that adds the upgrade probe's migration
// (board/migrations/probe): an additive no-op one past the product's
// newest.
const probeTag = "reaper_upgrade_probe"

// probeVersion is the version the probe build is stamped with.
const probeVersion = "v0.0.0-upgrade-probe"

// probeBuild builds, once per test binary, a second reaperd from the same
// code with the upgrade probe's migration and a version of its own:
//
//	go build -tags reaper_upgrade_probe -ldflags "-X github.com/dexaflow/reaper/sdk.BuildVersion=VERSION" -o OUT ./cmd/reaperd
var probeBuild = sync.OnceValues(func() (string, error) {
	out := filepath.Join(binDir, "probe", "reaperd")
	cmd := exec.Command("go", "build", "-tags", probeTag,
		"-ldflags", "-X github.com/dexaflow/reaper/sdk.BuildVersion="+probeVersion, "-o", out, ".")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build -tags %s: %v\n%s", probeTag, err, b)
	}
	return out, nil
})

// migrateWith runs `reaperd migrate` of the binary bin on the database of
// dsn and returns its exit code and output.
func migrateWith(t *testing.T, bin, dsn string) (int, string) {
	t.Helper()
	config := writeConfig(t, dsn, "")
	cmd := exec.Command(bin, "migrate", "-config", config)
	cmd.Env = append(os.Environ(), "REAPER_DSN=", "REAPER_DSN_FILE=")
	out, err := cmd.CombinedOutput()
	if err != nil && cmd.ProcessState == nil {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

// startBinary is startDaemon of another reaperd binary.
func startBinary(t *testing.T, bin, config string) *reaperdProc {
	t.Helper()
	return startDaemonCmd(t, exec.Command(bin, "run", "-config", config))
}

// TestMigrationFloor: the upgrade probe's build (a second release of the
// same code, one additive no-op migration more) migrates the database
// forward; the product's binary, one schema older, still runs on it (a
// rollback across an additive migration serves on) and its `reaperd
// migrate` applies nothing and succeeds. Once a migration has raised the
// floor above it, the older binary refuses to start: it stays up, live but
// not ready, with one line naming its version and schema, the floor and
// the migration that raised it, in its log and its readiness; its migrate
// refuses with the same line.
func TestMigrationFloor(t *testing.T) {
	t.Parallel()
	probe, err := probeBuild()
	if err != nil {
		t.Fatal(err)
	}
	product := filepath.Join(binDir, "reaperd")
	known := board.SchemaVersion()
	// The floor the product's migrations leave: their newest's, which an
	// additive migration keeps where the one before it left it.
	ms, err := board.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	floor := ms[len(ms)-1].Floor
	dsn := pgtest.DSN(pgtest.NewEmptyDB(t))

	// The product's migrate: its own migrations, the probe's not among them.
	code, out := migrateWith(t, product, dsn)
	if code != 0 || strings.Contains(out, "upgrade_probe") || !strings.Contains(out, fmt.Sprintf("schema is at version %d (floor %d)", known, floor)) {
		t.Fatalf("product migrate: %d\n%s", code, out)
	}
	// The probe's: its one migration more, additive.
	probeName := fmt.Sprintf("%03d_upgrade_probe.sql", known+1)
	code, out = migrateWith(t, probe, dsn)
	if code != 0 || out != fmt.Sprintf("applied %s\nschema is at version %d (floor %d)\n", probeName, known+1, floor) {
		t.Fatalf("probe migrate: %d\n%s", code, out)
	}
	if code, out = migrateWith(t, probe, dsn); code != 0 || !strings.Contains(out, "up to date") {
		t.Fatalf("probe migrate again: %d\n%s", code, out)
	}
	// Back to the product's binary: it applies nothing and runs.
	code, out = migrateWith(t, product, dsn)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("schema is at version %d, newer than this binary's %d; its floor %d", known+1, known, floor)) {
		t.Fatalf("product migrate on the probe's database: %d\n%s", code, out)
	}
	config := writeConfig(t, dsn, "reaper \"echo\" {}\n")
	older := startBinary(t, product, config)
	eventually.True(t, 30*time.Second, "the older binary ready and leading on the newer, additive schema", func() bool {
		code, body := older.health(t)
		return code == http.StatusOK && strings.Contains(body, `"leading":true`)
	})
	if !older.logged("newer than this binary, and its floor admits it") {
		t.Error("the older binary did not say it runs on a newer schema")
	}
	older.stop(t)

	// A migration that raised the floor above the product's binary (and
	// the probe's): both refuse.
	breaking := fmt.Sprintf("%03d_breaking.sql", known+2)
	exec1(t, dsn, "INSERT INTO schema_migrations (version, name, floor) VALUES ($1, $2, $1)", known+2, breaking)
	for _, bin := range []struct {
		path, version string
		schema        int
	}{{product, sdk.BuildVersion, known}, {probe, probeVersion, known + 1}} {
		line := fmt.Sprintf("this binary (version %s, schema %d) is below the database's floor %d, raised by migration %s "+
			"(the database is at schema %d): upgrade this binary to a release of schema %d or newer",
			bin.version, bin.schema, known+2, breaking, known+2, known+2)
		code, out := migrateWith(t, bin.path, dsn)
		if code != 1 || out != "reaperd migrate: "+line+"\n" {
			t.Errorf("%s migrate below the floor: %d\n%s\nwant the line %q", bin.version, code, out, line)
		}
		d := startBinary(t, bin.path, config)
		var body string
		eventually.True(t, 30*time.Second, "readiness 503 with the floor's line", func() bool {
			var code int
			code, body = d.health(t)
			return code == http.StatusServiceUnavailable && strings.Contains(body, "floor")
		})
		var rep struct{ Reason, Loop string }
		if err := json.Unmarshal([]byte(body), &rep); err != nil || rep.Reason != "reaperd cannot start: "+line || rep.Loop != "waiting" {
			t.Errorf("%s readiness: %s\nwant the reason %q", bin.version, body, line)
		}
		if code, _ := d.get(t, "/monitor/health?probe=liveness"); code != http.StatusOK {
			t.Errorf("%s liveness below the floor: %d, want 200", bin.version, code)
		}
		if n := d.count("reaperd cannot start: " + line); n != 1 {
			t.Errorf("%s logged the floor's line %d times, want once", bin.version, n)
		}
		if d.logged("gained leadership") {
			t.Errorf("%s below the floor led or served", bin.version)
		}
		select {
		case <-d.done:
			t.Errorf("%s exited below the floor", bin.version)
		default:
		}
		d.stop(t)
	}
}

// exec1 runs one statement on dsn's database.
func exec1(t *testing.T, dsn, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

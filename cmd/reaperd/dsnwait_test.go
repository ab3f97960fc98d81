package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/testkit/eventually"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// dsnCanary is the password of the wrong DSNs below: it must appear in
// nothing reaperd writes or serves.
const dsnCanary = "canary-pw-5c1d"

// dsnFileConfig writes a configuration whose DSN comes from dsnFile, with
// the telemetry on a fixed address (so that the address the waiting
// reaperd serves is the one the started one serves).
func dsnFileConfig(t *testing.T, dsnFile, telemetry string) string {
	t.Helper()
	ladder := strings.Replace(fastLadder, "listen = \"127.0.0.1:0\"\n}\nattempt_api", fmt.Sprintf("listen = %q\n}\nattempt_api", telemetry), 1)
	if ladder == fastLadder {
		t.Fatal("the ladder's telemetry block moved")
	}
	path := filepath.Join(t.TempDir(), "reaper.hcl")
	src := fmt.Sprintf("edition = \"lite\"\nplugin_dir = %q\nstore {\n  dsn_file = %q\n}\n%s\nsubstrate \"lite\" {}\nreaper \"echo\" {}\n",
		binDir, dsnFile, ladder)
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// readiness is the daemon's readiness answer: the code and the report.
func readiness(t *testing.T, d *reaperdProc) (int, struct{ Status, Database, Loop, Reason string }, string) {
	t.Helper()
	code, body := d.health(t)
	var r struct{ Status, Database, Loop, Reason string }
	_ = json.Unmarshal([]byte(body), &r)
	return code, r, body
}

// waitReason waits for readiness to answer 503 with a reason holding want,
// and checks that liveness answers 200 meanwhile.
func waitReason(t *testing.T, d *reaperdProc, want string) {
	t.Helper()
	var last string
	eventually.True(t, 30*time.Second, "readiness 503 saying "+want, func() bool {
		code, r, body := readiness(t, d)
		last = body
		return code == http.StatusServiceUnavailable && strings.Contains(r.Reason, want)
	})
	if code, body := d.get(t, "/monitor/health?probe=liveness"); code != http.StatusOK {
		t.Fatalf("liveness while not ready (%s): %d %s", last, code, body)
	}
	select {
	case <-d.done:
		t.Fatalf("reaperd exited while waiting (%s)", last)
	default:
	}
}

func writeDSN(t *testing.T, path, text string) {
	t.Helper()
	// Written aside and renamed in, as a Secret volume swaps its files.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestDSNSecretBadOrLate runs the real reaperd with its DSN file as a user
// gets it wrong: missing at start (a Secret not created yet), empty, not a
// connection string, then with a wrong password, and an unreachable host.
// Each time reaperd stays up, live, and not ready, with readiness saying
// why in one line that carries nothing of the DSN, and logs that line;
// once the file holds a good DSN it starts without a restart.
func TestDSNSecretBadOrLate(t *testing.T) {
	t.Parallel()
	good := pgtest.NewDSN(t)
	u, err := url.Parse(good)
	if err != nil {
		t.Fatal(err)
	}
	wrongPassword := *u
	wrongPassword.User = url.UserPassword(u.User.Username(), dsnCanary)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	nobody := *u
	nobody.Host = closed
	nobody.User = url.UserPassword(u.User.Username(), dsnCanary)

	checkNoSecret := func(t *testing.T, d *reaperdProc, what ...string) {
		t.Helper()
		_, _, body := readiness(t, d)
		d.mu.Lock()
		all := strings.Join(d.logs, "\n") + "\n" + body
		d.mu.Unlock()
		for _, s := range append(what, dsnCanary, u.User.String()) {
			if strings.Contains(all, s) {
				t.Errorf("reaperd's log or readiness holds %q of a DSN", s)
			}
		}
	}

	t.Run("MissingEmptyMalformedThenGood", func(t *testing.T) {
		t.Parallel()
		dsnFile := filepath.Join(t.TempDir(), "dsn")
		d := startDaemon(t, dsnFileConfig(t, dsnFile, attemptapitest.FreeAddr(t)))
		waitReason(t, d, "reaperd is waiting for its DSN: DSN file "+dsnFile+" does not exist")
		if n := d.count("reaperd is waiting for its DSN: DSN file " + dsnFile + " does not exist"); n != 1 {
			t.Errorf("the missing file logged %d times, want once", n)
		}
		writeDSN(t, dsnFile, "")
		waitReason(t, d, "DSN file "+dsnFile+" is empty")
		malformed := "postgres://reaper:" + dsnCanary + "@%zz/reaper"
		writeDSN(t, dsnFile, malformed+"\n")
		waitReason(t, d, "DSN file "+dsnFile+" does not hold a valid DSN")
		checkNoSecret(t, d, "%zz")
		writeDSN(t, dsnFile, good+"\n")
		eventually.True(t, 30*time.Second, "ready and leading once the DSN is good", func() bool {
			code, body := d.health(t)
			return code == http.StatusOK && strings.Contains(body, `"leading":true`)
		})
		checkNoSecret(t, d, good)
	})

	t.Run("WrongPasswordThenFixed", func(t *testing.T) {
		t.Parallel()
		dsnFile := filepath.Join(t.TempDir(), "dsn")
		writeDSN(t, dsnFile, wrongPassword.String()+"\n")
		d := startDaemon(t, dsnFileConfig(t, dsnFile, attemptapitest.FreeAddr(t)))
		waitReason(t, d, "the database refused the password (SQLSTATE 28P01)")
		checkNoSecret(t, d, wrongPassword.String(), u.Host)
		if d.logged("gained leadership") {
			t.Fatal("led with a DSN the database refused")
		}
		// The Secret put right: the same process starts with it.
		writeDSN(t, dsnFile, good+"\n")
		eventually.True(t, 30*time.Second, "ready and leading once the password is right", func() bool {
			code, body := d.health(t)
			return code == http.StatusOK && strings.Contains(body, `"leading":true`)
		})
		if !d.logged("starting again with the new DSN") {
			t.Error("no line says the daemon took the new DSN")
		}
	})

	t.Run("NothingListens", func(t *testing.T) {
		t.Parallel()
		dsnFile := filepath.Join(t.TempDir(), "dsn")
		writeDSN(t, dsnFile, nobody.String()+"\n")
		d := startDaemon(t, dsnFileConfig(t, dsnFile, attemptapitest.FreeAddr(t)))
		waitReason(t, d, "connection refused: nothing listens at the host and port of the DSN")
		checkNoSecret(t, d, nobody.String(), closed)
	})
}

package main

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/dexaflow/reaper/host/loader"
	"github.com/dexaflow/reaper/testkit/eventually"
)

// sockets lists the unix sockets under root.
func sockets(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.Type()&fs.ModeSocket != 0 {
			out = append(out, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A host run with real plugin binaries keeps every go-plugin socket (the
// plugins' listeners and its own broker listeners) in its own directory
// under $TMPDIR, and leaves nothing there when it stops: after SIGTERM, and
// after kill -9 once the next host has started.
func TestHostRunLeavesNoSocketBehind(t *testing.T) {
	store, w, dsn := migratedStore(t)
	a := runningSilentAttempt(t, w, "alive-run")
	cfg := writeConfig(t, dsn, "reaper \"echo\" {}\n")
	tmp := shortTempDir(t)
	root := filepath.Join(tmp, loader.SocketRootPrefix+strconv.Itoa(os.Getuid()))
	ctx := context.Background()

	// reaped waits until the host has run the reaper: by then every plugin
	// and the host have listened on their sockets.
	reaped := func(d *reaperdProc) {
		t.Helper()
		eventually.True(t, 20*time.Second, "a pass of the echo reaper", func() bool {
			l, ok, err := store.CurrentLeader(ctx)
			if err != nil || !ok || !d.holds(l.Holder) {
				return false
			}
			for _, r := range decisions(t, store, a) {
				if r.Reaper == "echo" && r.Term == l.Term {
					return true
				}
			}
			return false
		})
	}
	expectNothingLeft := func(when string) {
		t.Helper()
		if s := sockets(t, tmp); len(s) != 0 {
			t.Errorf("%s: sockets left in $TMPDIR: %v", when, s)
		}
		if _, err := os.Lstat(root); err == nil {
			t.Errorf("%s: the socket root %s is still there", when, root)
		}
	}

	t.Run("SIGTERM", func(t *testing.T) {
		d := startDaemon(t, cfg, "TMPDIR="+tmp)
		reaped(d)
		// The host's substrate sweeps through the broker every cycle: both
		// ends' sockets exist, and all of them under the host's root.
		if s := sockets(t, root); len(s) < 3 {
			t.Fatalf("sockets under the host's directory while it runs: %v, want the plugins' and the host's", s)
		}
		if all := sockets(t, tmp); len(all) != len(sockets(t, root)) {
			t.Fatalf("sockets outside the host's directory: %v", all)
		}
		d.stopCleanly(t)
		expectNothingLeft("after SIGTERM")
	})

	t.Run("KillNineThenTheNextStartSweeps", func(t *testing.T) {
		first := startDaemon(t, cfg, "TMPDIR="+tmp)
		reaped(first)
		plugins := childPIDs(t, first.cmd.Process.Pid)
		first.cmd.Process.Signal(syscall.SIGKILL)
		<-first.done
		eventually.True(t, 10*time.Second, "the killed host's plugins to die with it", func() bool {
			for _, pid := range plugins {
				if syscall.Kill(pid, 0) == nil {
					return false
				}
			}
			return true
		})
		if len(sockets(t, root)) == 0 {
			t.Fatal("kill -9 left no socket: nothing for the next start to sweep")
		}
		second := startDaemon(t, cfg, "TMPDIR="+tmp)
		reaped(second)
		second.stopCleanly(t)
		expectNothingLeft("after kill -9 and a clean restart")
	})
}

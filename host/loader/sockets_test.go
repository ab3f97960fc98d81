package loader_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dexaflow/reaper/host/loader"
	"github.com/dexaflow/reaper/sdk"
)

// entries lists what is left in dir.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path != dir {
			rel, _ := filepath.Rel(dir, path)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// shortTempDir is a fresh TMPDIR short enough for a Unix socket's path
// (t.TempDir's names carry the test's).
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sk")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	t.Setenv("TMPDIR", dir)
	return dir
}

// killPlugin kills the plugin process with SIGKILL, never anything else.
func killPlugin(p *loader.Plugin) error {
	pid := loader.PID(p)
	if pid <= 1 {
		return fmt.Errorf("no plugin pid (%d)", pid)
	}
	return syscall.Kill(pid, syscall.SIGKILL)
}

func TestPluginSockets(t *testing.T) {
	t.Run("AKilledPluginLeavesNoSocketBehind", func(t *testing.T) {
		tmp := shortTempDir(t)
		p, err := launch(t, loader.Spec{Kind: sdk.KindReaper, Name: "echo"})
		if err != nil {
			t.Fatal(err)
		}
		got := entries(t, tmp)
		if len(got) != 3 || got[0] != "reaperd-"+strconv.Itoa(os.Getpid()) || !strings.Contains(got[2], "/plugin") {
			t.Fatalf("while it runs the plugin's sockets live in a directory of its own in the host's: %v", got)
		}
		if err := killPlugin(p); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for !p.Exited() {
			if time.Now().After(deadline) {
				t.Fatal("the killed plugin never exited")
			}
			time.Sleep(10 * time.Millisecond)
		}
		p.Kill() // what the supervisor does once it sees the plugin gone
		if got := entries(t, tmp); len(got) != 0 {
			t.Fatalf("left behind by a plugin killed with SIGKILL: %v", got)
		}
	})
	t.Run("TheHostsBrokerSocketsGoWithThePlugin", func(t *testing.T) {
		tmp := shortTempDir(t)
		p, err := launch(t, loader.Spec{Kind: sdk.KindReaper, Name: "echo"})
		if err != nil {
			t.Fatal(err)
		}
		configure(t, p, "normal")
		// A pass serves the board and the substrate to the plugin through
		// the host's broker: listeners of the host's, in the same directory.
		if _, err := p.Reaper().Reap(context.Background(), sdk.Pass{Now: time.Now()}, &recordingBoard{}, scriptedExec{}, &sdk.Collector{}); err != nil {
			t.Fatal(err)
		}
		for _, e := range entries(t, tmp) {
			if !strings.HasPrefix(e, "reaperd-") {
				t.Fatalf("%s: a socket outside the host's directory", e)
			}
		}
		if err := killPlugin(p); err != nil {
			t.Fatal(err)
		}
		p.Kill()
		if got := entries(t, tmp); len(got) != 0 {
			t.Fatalf("left behind: %v", got)
		}
	})
	t.Run("TheSocketDirectoriesOfDeadHostsAreSweptAtTheFirstLaunch", func(t *testing.T) {
		tmp := shortTempDir(t)
		gone := exec.Command("true")
		if err := gone.Run(); err != nil {
			t.Fatal(err)
		}
		dead := filepath.Join(tmp, "reaperd-"+strconv.Itoa(gone.Process.Pid))
		live := filepath.Join(tmp, "reaperd-1") // pid 1 always runs
		other := filepath.Join(tmp, "not-ours")
		for _, d := range []string{dead, live, other} {
			if err := os.Mkdir(d, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(d, "plugin0"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		p, err := launch(t, loader.Spec{Kind: sdk.KindReaper, Name: "echo"})
		if err != nil {
			t.Fatal(err)
		}
		p.Kill()
		if _, err := os.Stat(dead); !os.IsNotExist(err) {
			t.Fatalf("the directory of a dead host is still there: %v", err)
		}
		for _, d := range []string{live, other} {
			if _, err := os.Stat(d); err != nil {
				t.Fatalf("%s was removed: %v", d, err)
			}
		}
	})
}

package loader_test

import (
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

func TestPluginSockets(t *testing.T) {
	t.Run("AKilledPluginLeavesNoSocketBehind", func(t *testing.T) {
		tmp := shortTempDir(t)
		p, err := launch(t, loader.Spec{Kind: sdk.KindReaper, Name: "echo"})
		if err != nil {
			t.Fatal(err)
		}
		if got := entries(t, tmp); len(got) != 2 || !strings.HasPrefix(got[0], "rpsock-") {
			t.Fatalf("while it runs the plugin's socket lives in a directory of its own: %v", got)
		}
		if err := syscall.Kill(loader.PID(p), syscall.SIGKILL); err != nil {
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
	t.Run("TheSocketDirectoriesOfDeadHostsAreSweptAtTheFirstLaunch", func(t *testing.T) {
		tmp := shortTempDir(t)
		gone := exec.Command("true")
		if err := gone.Run(); err != nil {
			t.Fatal(err)
		}
		dead := filepath.Join(tmp, "rpsock-"+strconv.Itoa(gone.Process.Pid)+"-123")
		live := filepath.Join(tmp, "rpsock-1-456") // pid 1 always runs
		other := filepath.Join(tmp, "not-ours")
		for _, d := range []string{dead, live, other} {
			if err := os.Mkdir(d, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(d, "plugin0"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := launch(t, loader.Spec{Kind: sdk.KindReaper, Name: "echo"}); err != nil {
			t.Fatal(err)
		}
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

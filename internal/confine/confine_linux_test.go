//go:build linux

package confine_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/dexaflow/reaper/internal/confine"
)

// onConfinedThread runs fn on a thread confined by HideFiles(hidden), then
// lets the thread end.
func onConfinedThread(t *testing.T, hidden []string, fn func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := confine.HideFiles(hidden); err != nil {
			done <- err
			return
		}
		fn()
		done <- nil
	}()
	if err := <-done; errors.Is(err, confine.ErrNoLandlock) {
		t.Skipf("no Landlock here: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
}

// HideFiles refuses the hidden files (and all beneath a hidden directory),
// also through a symlink and when created only after the confinement,
// and leaves every other file open, beside them included.
func TestHideFilesRefusesOnlyTheHiddenPaths(t *testing.T) {
	base := t.TempDir()
	write := func(rel string) string {
		p := filepath.Join(base, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	key := write("keys/signing.key")
	cert := write("keys/tls.crt")
	token := write("sa/token")
	other := write("other/file")
	if err := os.Symlink(key, filepath.Join(base, "link-to-key")); err != nil {
		t.Fatal(err)
	}
	later := filepath.Join(base, "keys", "dsn") // hidden before it exists
	got := map[string]error{}
	onConfinedThread(t, []string{key, filepath.Join(base, "sa"), later}, func() {
		if err := os.WriteFile(later, []byte("x"), 0o600); err == nil {
			got["created later"] = nil
		} else {
			got["created later"] = err
		}
		for name, p := range map[string]string{"key": key, "token": token, "cert": cert, "other": other,
			"symlink to the key": filepath.Join(base, "link-to-key"), "/etc/hostname": "/etc/hostname"} {
			_, err := os.ReadFile(p)
			got[name] = err
		}
		// Writing a hidden file is refused as well.
		f, err := os.OpenFile(key, os.O_WRONLY|os.O_TRUNC, 0)
		if err == nil {
			f.Close()
		}
		got["key for writing"] = err
	})
	for _, name := range []string{"key", "token", "symlink to the key", "key for writing", "created later"} {
		if !errors.Is(got[name], fs.ErrPermission) {
			t.Errorf("%s: %v, want EACCES", name, got[name])
		}
	}
	for _, name := range []string{"cert", "other", "/etc/hostname"} {
		if got[name] != nil && !errors.Is(got[name], fs.ErrNotExist) {
			t.Errorf("%s: %v, want it readable", name, got[name])
		}
	}
	// This thread, never confined, reads them all.
	if _, err := os.ReadFile(key); err != nil {
		t.Fatalf("the test's own thread: %v", err)
	}
}

// A confined process still reads what the Lite liveness checks read of
// processes outside its domain (an agent, non-dumpable, or here init):
// /proc/<pid>/stat with the start time, and signal 0.
func TestHideFilesLeavesProcStatAndSignalZero(t *testing.T) {
	var (
		stat    []byte
		statErr error
		killErr error
	)
	onConfinedThread(t, []string{t.TempDir()}, func() {
		stat, statErr = os.ReadFile("/proc/1/stat")
		killErr = syscall.Kill(os.Getppid(), 0)
	})
	if statErr != nil {
		t.Fatalf("/proc/1/stat: %v", statErr)
	}
	// The start time is the 22nd field, the 20th after the command's ")".
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(fields) < 20 || fields[19] == "0" {
		t.Errorf("/proc/1/stat shows no start time: %q", stat)
	}
	if killErr != nil {
		t.Errorf("signal 0 to the parent: %v", killErr)
	}
}

package loader_test

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/dexaflow/reaper/host/loader"
)

func TestSocketDir(t *testing.T) {
	root := func(t *testing.T) string {
		t.Helper()
		// A short path: a unix socket's path is limited to about 100 bytes.
		dir, err := os.MkdirTemp("", "sk")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		return filepath.Join(dir, "r")
	}
	exists := func(path string) bool {
		_, err := os.Lstat(path)
		return !errors.Is(err, fs.ErrNotExist)
	}

	t.Run("CloseRemovesTheDirectoryAndTheEmptyRoot", func(t *testing.T) {
		r := root(t)
		d, err := loader.OpenSocketDir(r, nil)
		if err != nil {
			t.Fatal(err)
		}
		if st, err := os.Stat(r); err != nil || st.Mode().Perm() != 0o700 {
			t.Fatalf("root %v, %v; want mode 0700", st, err)
		}
		ln, err := net.Listen("unix", filepath.Join(d.Path(), "s"))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		if exists(d.Path()) || exists(r) {
			t.Fatalf("left behind: dir %v, root %v", exists(d.Path()), exists(r))
		}
	})

	t.Run("StartSweepsTheDirectoriesOfHostsThatAreGone_AndSparesLiveOnes", func(t *testing.T) {
		r := root(t)
		live, err := loader.OpenSocketDir(r, nil)
		if err != nil {
			t.Fatal(err)
		}
		// A host killed with kill -9: its directory, its lock file (the
		// kernel dropped the lock) and a socket nobody listens on.
		dead := filepath.Join(r, "1234")
		if err := os.MkdirAll(filepath.Join(dead, "plugin-dir1"), 0o700); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"lock", "plugin-dir1/plugin1"} {
			if err := os.WriteFile(filepath.Join(dead, f), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		next, err := loader.OpenSocketDir(r, nil)
		if err != nil {
			t.Fatal(err)
		}
		if exists(dead) {
			t.Error("the dead host's directory was not swept")
		}
		if !exists(live.Path()) {
			t.Error("a live host's directory was swept")
		}
		live.Close()
		next.Close()
		if exists(r) {
			t.Error("the root outlived the last host")
		}
	})

	t.Run("UnsafeRootRefused", func(t *testing.T) {
		r := root(t)
		if err := os.Mkdir(r, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(r, 0o777); err != nil {
			t.Fatal(err)
		}
		if _, err := loader.OpenSocketDir(r, nil); err == nil {
			t.Fatal("a world-writable root was accepted")
		}
		link := r + "-link"
		if err := os.Symlink(t.TempDir(), link); err != nil {
			t.Fatal(err)
		}
		if _, err := loader.OpenSocketDir(link, nil); err == nil {
			t.Fatal("a symlinked root was accepted")
		}
	})
}

package loader

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/dexaflow/reaper/internal/ownerdir"
)

// SocketRootPrefix starts the name of the default socket root; the user id
// ends it.
const SocketRootPrefix = "reaperd-"

// lockName is the file each host holds locked for as long as it lives.
const lockName = "lock"

// unlockedGrace spares a host directory without a lock file for this long:
// its host may be between making the directory and locking it.
const unlockedGrace = time.Minute

// DefaultSocketRoot is $TMPDIR/reaperd-<uid>.
func DefaultSocketRoot() string {
	return filepath.Join(os.TempDir(), SocketRootPrefix+strconv.Itoa(os.Getuid()))
}

// SocketDir is one host's directory for its plugins' unix sockets: a fresh
// directory under a root shared by the hosts of one user, holding a lock
// file the host keeps locked while it lives. The kernel drops the lock when
// the host dies, even by kill -9 (its plugins die with it), so the next host
// to start removes what the dead one left; Close removes the directory on a
// clean exit, and the root too when no other host uses it.
type SocketDir struct {
	root, path string
	lock       *os.File
}

// OpenSocketDir sweeps root ("" means DefaultSocketRoot) of the directories
// of hosts that are gone, then makes and locks this host's directory. The
// root is refused if it is a symlink, is owned by another user or is
// writable by group or others: whoever can write there could put sockets in
// the plugins' way.
func OpenSocketDir(root string, logger hclog.Logger) (*SocketDir, error) {
	if root == "" {
		root = DefaultSocketRoot()
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	// Another host's Close may remove an empty root between our mkdir and
	// our MkdirTemp: try again a few times.
	var err error
	for range 3 {
		var d *SocketDir
		d, err = openSocketDir(root, logger)
		if err == nil {
			return d, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			break
		}
	}
	return nil, fmt.Errorf("plugin socket directory in %s: %w", root, err)
}

func openSocketDir(root string, logger hclog.Logger) (*SocketDir, error) {
	if err := os.Mkdir(root, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	if err := checkRoot(root); err != nil {
		return nil, err
	}
	sweep(root, logger)
	path, err := os.MkdirTemp(root, "")
	if err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(filepath.Join(path, lockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err == nil {
		err = unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			// A sweep that ran between the open and the lock removed the
			// directory: the lock is then on a file nobody can find.
			err = sameFile(lock, filepath.Join(path, lockName))
		}
		if err != nil {
			lock.Close()
		}
	}
	if err != nil {
		os.RemoveAll(path)
		return nil, err
	}
	return &SocketDir{root: root, path: path, lock: lock}, nil
}

func sameFile(f *os.File, path string) error {
	a, err := f.Stat()
	if err != nil {
		return err
	}
	b, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !os.SameFile(a, b) {
		return fmt.Errorf("%s was replaced while being locked: %w", path, fs.ErrNotExist)
	}
	return nil
}

func checkRoot(root string) error {
	var st unix.Stat_t
	if err := unix.Lstat(root, &st); err != nil {
		return err
	}
	if err := ownerdir.Refusal(&st); err != nil {
		return fmt.Errorf("refused: %w", err)
	}
	return nil
}

// sweep removes the directories of hosts that are gone: those whose lock
// file can be locked (nobody holds it), and those left without one for
// longer than a host takes to make it.
func sweep(root string, logger hclog.Logger) {
	entries, err := os.ReadDir(root)
	if err != nil {
		logger.Warn("cannot sweep the plugin socket directory", "dir", root, "error", err)
		return
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(root, e.Name())
		if !gone(dir) {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			logger.Warn("cannot remove the socket directory of a host that is gone", "dir", dir, "error", err)
			continue
		}
		logger.Info("removed the socket directory of a host that is gone", "dir", dir)
	}
}

// gone reports whether the host that made dir no longer runs.
func gone(dir string) bool {
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		st, err := os.Stat(dir)
		return err == nil && time.Since(st.ModTime()) > unlockedGrace
	}
	if err != nil {
		return false
	}
	defer f.Close() // releases the lock taken below
	return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil
}

// Path is the host's socket directory (for Loader.SocketDir).
func (d *SocketDir) Path() string { return d.path }

// Close removes the host's directory and, when no other host uses it, the
// root. Plugins must have been killed first.
func (d *SocketDir) Close() error {
	err := os.RemoveAll(d.path)
	d.lock.Close()
	_ = os.Remove(d.root) // fails, as it should, while another host has a directory there
	if err != nil {
		return fmt.Errorf("remove the plugin socket directory: %w", err)
	}
	return nil
}

package loader

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// PassedEnv names the variables of the host's environment a plugin
// inherits; nothing else of it reaches a plugin (no DSN, no PG*, no
// credential of any kind). The plugin also gets what go-plugin sets for its
// handshake (the magic cookie, the protocol versions, the port range, the
// client certificate of AutoMTLS, the socket directory) and what the host
// passes on purpose (Loader.Env).
var PassedEnv = []string{
	"PATH", "HOME", "TMPDIR", "TZ", "LANG", "LC_ALL",
	// The Go runtime's own knobs, which an operator may set for every
	// process of the host.
	"GOGC", "GOMEMLIMIT", "GOMAXPROCS", "GODEBUG", "GOTRACEBACK",
	// A substrate reaching the API server with its pod's service account
	// (client-go's in-cluster configuration reads these two).
	"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT",
}

// passedEnv is the part of environ (KEY=value entries) a plugin inherits.
func passedEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		key, _, _ := strings.Cut(kv, "=")
		for _, k := range PassedEnv {
			if key == k {
				out = append(out, kv)
				break
			}
		}
	}
	return out
}

// openBinary opens the plugin binary at path once, for both its checks and
// its run: the host hashes and executes this open file, never the path
// again, so a file swapped in at the path after the checks never runs.
//
// A symlink, at the path or on the way to it, is followed, and what it
// resolves to is checked: the binary and the directory it is in, and the
// plugin directory the path names, must each be owned by reaperd's user
// (or root) and writable by nobody else; the binary must be a regular,
// executable file. The binary is opened relative to its verified directory
// and not through a further symlink.
func openBinary(path string) (*os.File, error) {
	real, err := filepath.EvalSymlinks(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errors.New("binary not found (build it with make build, or set plugin_dir)")
	}
	if err != nil {
		return nil, fmt.Errorf("resolve binary: %w", err)
	}
	if err := checkDir(filepath.Dir(path)); err != nil {
		return nil, err
	}
	dir, err := os.Open(filepath.Dir(real))
	if err != nil {
		return nil, fmt.Errorf("open the binary's directory: %w", err)
	}
	defer dir.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(dir.Fd()), &st); err != nil {
		return nil, fmt.Errorf("stat %s: %w", dir.Name(), err)
	}
	if err := refusal(dir.Name(), &st, unix.S_IFDIR); err != nil {
		return nil, err
	}
	fd, err := unix.Openat(int(dir.Fd()), filepath.Base(real), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open binary %s: %w", real, err)
	}
	f := os.NewFile(uintptr(fd), real)
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("stat %s: %w", real, err)
	}
	if err := refusal(real, &st, unix.S_IFREG); err != nil {
		f.Close()
		return nil, err
	}
	if st.Mode&0o111 == 0 {
		f.Close()
		return nil, errors.New("binary is not executable")
	}
	return f, nil
}

// checkDir checks the plugin directory the configuration names (resolved).
func checkDir(dir string) error {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return fmt.Errorf("resolve the plugin directory: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(real, &st); err != nil {
		return fmt.Errorf("stat the plugin directory: %w", err)
	}
	return refusal(real, &st, unix.S_IFDIR)
}

// refusal says why the file st describes is refused, naming it: not of
// the type wanted, owned by a user other than reaperd's or root, or
// writable by group or others.
func refusal(name string, st *unix.Stat_t, typ uint32) error {
	uid := os.Geteuid()
	switch {
	case st.Mode&unix.S_IFMT != typ && typ == unix.S_IFDIR:
		return fmt.Errorf("refused: %s is not a directory", name)
	case st.Mode&unix.S_IFMT != typ:
		return fmt.Errorf("refused: %s is not a regular file", name)
	case int(st.Uid) != uid && st.Uid != 0:
		return fmt.Errorf("refused: %s is owned by uid %d, not by reaperd's user (uid %d) or root", name, st.Uid, uid)
	case st.Mode&0o022 != 0:
		return fmt.Errorf("refused: %s is writable by group or others (mode %04o)", name, st.Mode&0o7777)
	}
	return nil
}

// ErrChecksum is wrapped when the binary does not match its configured
// sha256.
var ErrChecksum = errors.New("checksum mismatch: the binary does not match the configured sha256")

// checkSum hashes the open binary (from its start, whatever its offset)
// and compares it with want, a hex sha256.
func checkSum(f *os.File, want string) error {
	sum, err := hex.DecodeString(want)
	if err != nil || len(sum) != sha256.Size {
		return fmt.Errorf("bad sha256 %q: want %d hex bytes", want, sha256.Size)
	}
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat binary: %w", err)
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, st.Size())); err != nil {
		return fmt.Errorf("hash binary: %w", err)
	}
	if subtle.ConstantTimeCompare(h.Sum(nil), sum) != 1 {
		return fmt.Errorf("%w (sha256 %x)", ErrChecksum, h.Sum(nil))
	}
	return nil
}

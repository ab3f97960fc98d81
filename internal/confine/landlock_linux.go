//go:build linux

package confine

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// LandlockABI is the kernel's Landlock ABI version. Without Landlock (a
// kernel without it, Landlock not enabled at boot, or its system calls
// filtered out by seccomp, as an old systemd's @system-service does) the
// error wraps ErrNoLandlock.
func LandlockABI() (int, error) {
	v, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	switch errno {
	case 0:
		return int(v), nil
	case unix.ENOSYS, unix.EOPNOTSUPP, unix.EPERM:
		return 0, fmt.Errorf("%w (%s)", ErrNoLandlock, unix.ErrnoName(errno))
	}
	return 0, fmt.Errorf("asking the kernel's Landlock ABI: %w", errno)
}

// HideFiles confines the calling thread, and every program it executes, to
// opening (to read or to write) any file except those at the paths hidden:
// a hidden directory hides everything beneath it. Paths are resolved
// (symlinks followed as far as they exist), so a hidden file cannot be
// reached through another name. The thread gets no_new_privs (Landlock
// needs it). The caller must hold the thread (runtime.LockOSThread) and
// discard it: the confinement cannot be undone.
//
// Landlock can only allow. "Everything but these paths" is built as: for
// each directory on the way from / to a hidden path, every entry in it
// that is neither hidden nor itself on such a way is allowed, with all
// beneath it. The entries are listed now: one created later directly in
// such a directory is refused too. Listing a directory, walking through it
// and executing files are not restricted; only opening file contents is.
func HideFiles(hidden []string) error {
	abi, err := LandlockABI()
	if err != nil {
		return err
	}
	access := uint64(unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE)
	if abi >= 3 {
		access |= unix.LANDLOCK_ACCESS_FS_TRUNCATE
	}
	allowed, err := allowedAround(hidden)
	if err != nil {
		return err
	}
	defer func() {
		for _, fd := range allowed {
			unix.Close(fd)
		}
	}()
	attr := unix.LandlockRulesetAttr{Access_fs: access}
	rfd, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr), 0)
	if errno != 0 {
		return fmt.Errorf("creating a Landlock ruleset: %w", errno)
	}
	defer unix.Close(int(rfd))
	for _, fd := range allowed {
		rule := unix.LandlockPathBeneathAttr{Allowed_access: access, Parent_fd: int32(fd)}
		if _, _, errno := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, rfd, unix.LANDLOCK_RULE_PATH_BENEATH,
			uintptr(unsafe.Pointer(&rule)), 0, 0, 0); errno != 0 {
			return fmt.Errorf("adding a Landlock rule: %w", errno)
		}
	}
	if err := NoNewPrivs(); err != nil {
		return err
	}
	if _, _, errno := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, rfd, 0, 0); errno != 0 {
		return fmt.Errorf("applying the Landlock ruleset: %w", errno)
	}
	return nil
}

// allowedAround opens (O_PATH) every entry to allow around the hidden
// paths: see HideFiles.
func allowedAround(hidden []string) (fds []int, err error) {
	hide := map[string]bool{}
	for _, h := range hidden {
		if h == "" {
			continue
		}
		r, err := resolve(h)
		if err != nil {
			return nil, err
		}
		if r == "/" {
			return nil, fmt.Errorf("refusing to hide %s: it is the root directory", h)
		}
		hide[r] = true
	}
	underHidden := func(p string) bool {
		for h := range hide {
			if p == h || strings.HasPrefix(p, h+"/") {
				return true
			}
		}
		return false
	}
	onWay := map[string]bool{}
	for h := range hide {
		for d := filepath.Dir(h); ; d = filepath.Dir(d) {
			onWay[d] = true
			if d == "/" {
				break
			}
		}
	}
	dirs := make([]string, 0, len(onWay))
	for d := range onWay {
		if !underHidden(d) {
			dirs = append(dirs, d)
		}
	}
	slices.Sort(dirs)
	defer func() {
		if err != nil {
			for _, fd := range fds {
				unix.Close(fd)
			}
			fds = nil
		}
	}()
	for _, d := range dirs {
		names, err := listNames(d)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
			// On the way to a hidden path that does not exist yet, or a
			// directory this user may cross but not list (mode 0711):
			// nothing in it is allowed but the way through.
			continue
		}
		if err != nil {
			return fds, fmt.Errorf("listing %s to allow its entries beside a hidden path: %w", d, err)
		}
		for _, name := range names {
			p := filepath.Join(d, name)
			if onWay[p] || underHidden(p) {
				continue
			}
			fd, err := unix.Open(p, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if errors.Is(err, unix.ENOENT) {
				continue // gone since listed
			}
			if err != nil {
				return fds, fmt.Errorf("opening %s to allow it: %w", p, err)
			}
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil {
				unix.Close(fd)
				return fds, fmt.Errorf("stat %s: %w", p, err)
			}
			if st.Mode&unix.S_IFMT == unix.S_IFLNK {
				// A symlink is followed to its target, which is judged
				// where it lives.
				unix.Close(fd)
				continue
			}
			fds = append(fds, fd)
		}
	}
	return fds, nil
}

func listNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}

// resolve makes p absolute and follows its symlinks as far as the path
// exists; the part that does not exist is kept as written.
func resolve(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("resolving %s: %w", p, err)
	}
	rest := ""
	for cur := abs; ; {
		real, err := filepath.EvalSymlinks(cur)
		if err == nil {
			return filepath.Join(real, rest), nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("resolving %s: %w", p, err)
		}
		if cur == "/" {
			return abs, nil
		}
		rest = filepath.Join(filepath.Base(cur), rest)
		cur = filepath.Dir(cur)
	}
}

// Package ownerdir holds the one rule for a directory whose contents only its
// owner may decide (the Lite record directory, the host's plugin socket
// directory): a real directory, not a symlink, owned by the effective user,
// writable by nobody else.
package ownerdir

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Refusal says why the directory st describes (from lstat or fstat) is
// refused, or is nil when it is acceptable.
func Refusal(st *unix.Stat_t) error {
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return errors.New("it is a symlink")
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return errors.New("it is not a directory")
	case int(st.Uid) != os.Geteuid():
		return fmt.Errorf("it is owned by uid %d, not by uid %d", st.Uid, os.Geteuid())
	case st.Mode&0o022 != 0:
		return fmt.Errorf("it is writable by group or others (mode %04o)", st.Mode&0o7777)
	}
	return nil
}

// Package secretfile holds the rule for the files reaperd reads its secrets
// from (the attempt API's TLS key, the signing key file) and for the
// certificates beside them.
//
// A private key is accepted when nobody but its owner and, for a file owned
// by root, root's chosen group can read it, and nobody else can write it:
// owned by the effective user with no group or other access (0600 or
// less), or owned by root with at most group read (0640 or less; what a
// Kubernetes Secret volume gives a pod's fsGroup). PostgreSQL holds its
// server key to the same rule. A certificate is public, but one that others
// can write could be swapped: that is a warning.
package secretfile

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// PrivateKey refuses the key file at path unless only its owner (and, for
// root's files, their group) can read it and only its owner can write it.
// The error names the file. A file that does not exist is no refusal here
// (reading it reports that).
func PrivateKey(path string) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return fmt.Errorf("checking the key file %s: %w", path, err)
	}
	mode := st.Mode & 0o7777
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fmt.Errorf("key file %s refused: it is not a regular file", path)
	case int(st.Uid) == os.Geteuid() && mode&0o077 != 0:
		return fmt.Errorf("key file %s refused: mode %04o lets group or others at it (want 0600 or less)", path, mode)
	case st.Uid == 0 && mode&0o037 != 0:
		return fmt.Errorf("key file %s refused: mode %04o lets others read it or group write it (want 0640 or less for a file of root's)", path, mode)
	case int(st.Uid) != os.Geteuid() && st.Uid != 0:
		return fmt.Errorf("key file %s refused: it is owned by uid %d, neither this user (uid %d) nor root", path, st.Uid, os.Geteuid())
	}
	return nil
}

// Certificate returns a warning naming the certificate file at path when
// group or others can write it, else "". A file that cannot be read is no
// warning here (loading it reports that).
func Certificate(path string) string {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return ""
	}
	if mode := st.Mode & 0o7777; mode&0o022 != 0 {
		return fmt.Sprintf("certificate file %s is writable by group or others (mode %04o): whoever can write it can swap the certificate", path, mode)
	}
	return ""
}

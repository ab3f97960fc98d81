// Package unpriv gives tests an unprivileged account to run a process as
// (a host, an agent, a prober), and copies a binary where that account may
// execute it. Tests that use it switch users, so they run as root (as CI
// does) and skip otherwise.
package unpriv

import (
	"io"
	"os"
	"os/user"
	"strconv"
	"syscall"
	"testing"
)

// Account is a local user other than root.
type Account struct {
	Name     string
	UID, GID int
}

// Credential runs a child as the account, with no supplementary group.
func (a Account) Credential() *syscall.Credential {
	return &syscall.Credential{Uid: uint32(a.UID), Gid: uint32(a.GID), Groups: []uint32{}}
}

// Find returns the first of nobody and postgres that exists and is not
// root (as testkit/pgtest picks one for PostgreSQL). It skips the test when
// the test does not run as root (it could not switch to the account) or no
// such account exists.
func Find(t testing.TB) Account {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: to run a process as an unprivileged user")
	}
	for _, name := range []string{"nobody", "postgres"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.Atoi(u.Uid)
		gid, err2 := strconv.Atoi(u.Gid)
		if err1 != nil || err2 != nil || uid == 0 {
			continue
		}
		return Account{Name: name, UID: uid, GID: gid}
	}
	t.Skip("no unprivileged account (nobody, postgres)")
	return Account{}
}

// CopyFile copies from to a new file to (which must not exist) with mode:
// a test binary copied where the account may execute it, say.
func CopyFile(t testing.TB, from, to string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_EXCL, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// CopySelf copies the running test binary to path, mode 0755.
func CopySelf(t testing.TB, path string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	CopyFile(t, self, path, 0o755)
}

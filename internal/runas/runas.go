// Package runas resolves the user Lite runs its tasks as (the Lite
// runner's run_as) and checks that this process may switch to it.
//
// Without run_as a Lite task runs as reaperd's own user and can read what
// that user can: the configuration file, the attempt API's signing key, the
// record directory. With it, the agent (still reaperd's user) starts each
// task as the named user, with that user's primary and supplementary
// groups and nothing of reaperd's, so the task can read none of those
// files and cannot signal or trace its agent. Switching users needs root,
// or CAP_SETUID and CAP_SETGID.
package runas

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"
)

// User is a resolved run_as user.
type User struct {
	Name string // the login name
	UID  uint32
	GID  uint32
	// Groups are its supplementary groups (the primary one included).
	Groups []uint32
	Home   string
}

// Credential is what a process started as u is given: its uid, gid and
// groups, and none of the starter's supplementary groups.
func (u User) Credential() *syscall.Credential {
	return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: append([]uint32(nil), u.Groups...)}
}

// Env is the environment entries that name u (HOME, USER, LOGNAME): a task
// started as u must not be told it is the starter.
func (u User) Env() []string {
	return []string{"HOME=" + u.Home, "USER=" + u.Name, "LOGNAME=" + u.Name}
}

// Lookup resolves name (a login name, or a numeric uid) and refuses root
// and the user of this process: run_as is for another, unprivileged user.
func Lookup(name string) (User, error) {
	if name == "" {
		return User{}, errors.New("run_as: no user named")
	}
	u, err := user.Lookup(name)
	if err != nil {
		var unknown user.UnknownUserError
		if _, nerr := strconv.ParseUint(name, 10, 32); nerr == nil && errors.As(err, &unknown) {
			u, err = user.LookupId(name)
		}
	}
	if err != nil {
		return User{}, fmt.Errorf("run_as %q: %w", name, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return User{}, fmt.Errorf("run_as %q: uid %q or gid %q is not numeric: %w", name, u.Uid, u.Gid, err)
	}
	switch {
	case uid == 0:
		return User{}, fmt.Errorf("run_as %q: is root; name an unprivileged user", name)
	case int(uid) == os.Geteuid():
		return User{}, fmt.Errorf("run_as %q: is reaperd's own user (uid %d); name another user, or leave run_as out", name, uid)
	}
	out := User{Name: u.Username, UID: uint32(uid), GID: uint32(gid), Home: u.HomeDir}
	ids, err := u.GroupIds()
	if err != nil {
		ids = []string{u.Gid} // no group database to read: its primary group alone
	}
	for _, g := range ids {
		n, err := strconv.ParseUint(g, 10, 32)
		if err != nil {
			return User{}, fmt.Errorf("run_as %q: group id %q is not numeric", name, g)
		}
		if n == 0 {
			continue // never root's group, even if the database lists it
		}
		out.Groups = append(out.Groups, uint32(n))
	}
	if out.Home == "" {
		out.Home = "/"
	}
	return out, nil
}

// Capabilities this process needs to switch users.
const (
	capSetGID = 6
	capSetUID = 7
)

// CheckCanSwitch says why this process cannot start a process as another
// user, or nil: it needs to be root, or to hold CAP_SETUID and CAP_SETGID.
func CheckCanSwitch() error {
	if os.Geteuid() == 0 {
		return nil
	}
	eff, err := effectiveCaps()
	if err != nil {
		return fmt.Errorf("run_as: cannot tell whether uid %d may switch users: %w", os.Geteuid(), err)
	}
	if eff&(1<<capSetUID) != 0 && eff&(1<<capSetGID) != 0 {
		return nil
	}
	return fmt.Errorf("run_as needs reaperd to run as root or with CAP_SETUID and CAP_SETGID; uid %d has neither", os.Geteuid())
}

func effectiveCaps() (uint64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("/proc/self/status has no CapEff line")
}

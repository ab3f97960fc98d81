// Package proc answers the questions about local processes that the Lite
// substrate and the Lite agent ask: does a process or a process group exist,
// when did a process start, has it already exited (a zombie that runs
// nothing), and which boot of the host this is.
//
// Start times are opaque numbers that are only compared with each other on
// one boot of one host: clock ticks since boot on Linux (/proc/<pid>/stat),
// microseconds since the epoch on macOS (sysctl kern.proc.pid). Elsewhere
// they cannot be read, Stat returns ErrUnsupported, and callers must treat
// the liveness of a process group as unknown.
//
// Every function that sends a real signal refuses PIDs and group ids of 1 or
// less and the caller's own process group, so a garbled number can never turn
// into kill(-1) or into the caller stopping itself.
package proc

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Errors reported by this package.
var (
	// ErrNotExist: no process has that PID (any more).
	ErrNotExist = errors.New("no such process")
	// ErrUnsupported: this platform gives no process start times.
	ErrUnsupported = errors.New("process start times are not readable on this platform")
	// ErrIncomplete: not every process of the host is visible to this user
	// (for example /proc mounted with hidepid), so a scan cannot prove that
	// a group has no running member.
	ErrIncomplete = errors.New("not every process is visible to this user")
)

// Info is what Stat reads about one process.
type Info struct {
	PID  int
	PPID int
	PGID int
	// Start is the process's start time, comparable only with other start
	// times read on the same boot of the same host. Never 0 when read.
	Start uint64
	// Zombie: the process has exited and waits to be reaped. It runs no
	// code and holds its PID (and its group id) until it is reaped.
	Zombie bool
}

// Supported reports whether start times can be read on this platform.
const Supported = supported

// Exists probes pid with signal 0. A process owned by another user (EPERM)
// exists. A zombie exists too: use Stat to tell it apart.
func Exists(pid int) (bool, error) {
	if pid <= 0 {
		return false, fmt.Errorf("probing pid %d: not a process id", pid)
	}
	return probe(pid, unix.Kill(pid, 0))
}

// GroupExists probes the process group pgid with signal 0: true while any
// process of the group, zombies included, is left.
func GroupExists(pgid int) (bool, error) {
	if pgid <= 1 {
		return false, fmt.Errorf("probing process group %d: not a group id", pgid)
	}
	return probe(pgid, unix.Kill(-pgid, 0))
}

func probe(id int, err error) (bool, error) {
	switch {
	case err == nil, errors.Is(err, unix.EPERM):
		return true, nil
	case errors.Is(err, unix.ESRCH):
		return false, nil
	default:
		return false, fmt.Errorf("probing %d with signal 0: %w", id, err)
	}
}

// SignalGroup sends sig to every process of group pgid. It refuses group ids
// of 1 or less and the caller's own group. A group that is already gone is
// not an error: it reports false.
func SignalGroup(pgid int, sig unix.Signal) (bool, error) {
	if pgid <= 1 {
		return false, fmt.Errorf("signalling process group %d: refused: not a group id", pgid)
	}
	if pgid == unix.Getpgrp() {
		return false, fmt.Errorf("signalling process group %d: refused: it is the caller's own group", pgid)
	}
	err := unix.Kill(-pgid, sig)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ESRCH):
		return false, nil
	default:
		return false, fmt.Errorf("sending %s to process group %d: %w", unix.SignalName(sig), pgid, err)
	}
}

// Signal sends sig to the single process pid. It refuses PIDs of 1 or less
// and the caller itself. A process that is already gone reports false.
func Signal(pid int, sig unix.Signal) (bool, error) {
	if pid <= 1 {
		return false, fmt.Errorf("signalling pid %d: refused: not a process id", pid)
	}
	if pid == unix.Getpid() {
		return false, fmt.Errorf("signalling pid %d: refused: it is the caller", pid)
	}
	err := unix.Kill(pid, sig)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ESRCH):
		return false, nil
	default:
		return false, fmt.Errorf("sending %s to pid %d: %w", unix.SignalName(sig), pid, err)
	}
}

// Groups is one look at which process groups have a running member (one that
// is not a zombie).
type Groups struct {
	running map[int]struct{}
}

// Running reports whether group pgid had a running member when scanned.
func (g *Groups) Running(pgid int) bool {
	_, ok := g.running[pgid]
	return ok
}

// GroupRunning reports whether any process of group pgid still runs. Signal 0
// answers first; when it says members are left, a scan of the process table
// tells whether any of them is more than a zombie (on a host whose init does
// not reap orphans, the members of a killed group can stay zombies forever).
// A group is reported gone on a scan only when two scans agree, so a member
// forked while the first scan ran is not missed. When the scan cannot be
// trusted (unsupported, or processes hidden from this user) the signal's
// answer stands.
func GroupRunning(pgid int) (bool, error) {
	for range 2 {
		exists, err := GroupExists(pgid)
		if err != nil || !exists {
			return exists, err
		}
		g, err := ScanGroups()
		if errors.Is(err, ErrUnsupported) || errors.Is(err, ErrIncomplete) {
			return true, nil
		}
		if err != nil {
			return true, err
		}
		if g.Running(pgid) {
			return true, nil
		}
	}
	return false, nil
}

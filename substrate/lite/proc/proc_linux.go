//go:build linux

package proc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

const supported = true

// Stat reads /proc/<pid>/stat. A process that is gone returns an error that
// wraps ErrNotExist.
func Stat(pid int) (Info, error) {
	if pid <= 0 {
		return Info{}, fmt.Errorf("reading process %d: not a process id", pid)
	}
	path := "/proc/" + strconv.Itoa(pid) + "/stat"
	// A stat line is a few hundred bytes; 1 KiB holds the longest one.
	var buf [1024]byte
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return Info{}, statErr(path, err)
	}
	n, err := unix.Read(fd, buf[:])
	_ = unix.Close(fd)
	if err != nil {
		return Info{}, statErr(path, err)
	}
	info, err := parseStat(buf[:n])
	if err != nil {
		return Info{}, fmt.Errorf("reading %s: %w", path, err)
	}
	if info.PID != pid {
		return Info{}, fmt.Errorf("reading %s: it names pid %d", path, info.PID)
	}
	return info, nil
}

func statErr(path string, err error) error {
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("reading %s: %w", path, ErrNotExist)
	}
	return fmt.Errorf("reading %s: %w", path, err)
}

// parseStat reads the fields this package needs from one /proc/<pid>/stat
// line: "pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt
// majflt cmajflt utime stime cutime cstime priority nice num_threads
// itrealvalue starttime ...". comm may hold spaces and parentheses, so the
// fields after it are found from the last ')'.
func parseStat(b []byte) (Info, error) {
	open := bytes.IndexByte(b, '(')
	closing := bytes.LastIndexByte(b, ')')
	if open < 1 || closing < open {
		return Info{}, errors.New("malformed stat line")
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b[:open])))
	if err != nil {
		return Info{}, fmt.Errorf("malformed stat line: pid: %w", err)
	}
	rest := b[closing+1:]
	// Field numbers after comm, counted from 3 (state) as in proc(5).
	var (
		state      byte
		ppid, pgrp int
		threads    int
		start      uint64
	)
	field := 2
	for len(rest) > 0 {
		// skip separators
		i := 0
		for i < len(rest) && rest[i] == ' ' {
			i++
		}
		rest = rest[i:]
		if len(rest) == 0 || rest[0] == '\n' {
			break
		}
		j := bytes.IndexAny(rest, " \n")
		if j < 0 {
			j = len(rest)
		}
		tok := rest[:j]
		rest = rest[j:]
		field++
		switch field {
		case 3:
			state = tok[0]
		case 4:
			ppid, err = strconv.Atoi(string(tok))
		case 5:
			pgrp, err = strconv.Atoi(string(tok))
		case 20:
			threads, err = strconv.Atoi(string(tok))
		case 22:
			start, err = strconv.ParseUint(string(tok), 10, 64)
		}
		if err != nil {
			return Info{}, fmt.Errorf("malformed stat line: field %d: %w", field, err)
		}
		if field == 22 {
			break
		}
	}
	if field < 22 {
		return Info{}, fmt.Errorf("malformed stat line: %d fields", field)
	}
	return Info{
		PID:  pid,
		PPID: ppid,
		PGID: pgrp,
		// Linux counts from boot; add 1 so a start at tick 0 is still not 0.
		Start: start + 1,
		// A thread group leader that exited while other threads run on is
		// shown as Z too; the process is a zombie only with no thread left.
		Zombie: (state == 'Z' || state == 'X') && threads <= 1,
	}, nil
}

// BootID names this boot of the host (/proc/sys/kernel/random/boot_id).
func BootID() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("reading the boot id: %w", err)
	}
	return string(bytes.TrimSpace(b)), nil
}

// ScanGroups reads every process of /proc once. It returns ErrIncomplete when
// this user cannot see every process (hidepid): then a group with no
// visible running member may still have one.
func ScanGroups() (*Groups, error) {
	if os.Geteuid() != 0 {
		if _, err := Stat(1); err != nil {
			return nil, fmt.Errorf("scanning /proc: %w (%v)", ErrIncomplete, err)
		}
	}
	d, err := os.Open("/proc")
	if err != nil {
		return nil, fmt.Errorf("scanning /proc: %w", err)
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("scanning /proc: %w", err)
	}
	g := &Groups{running: make(map[int]struct{})}
	for _, name := range names {
		if name == "" || name[0] < '0' || name[0] > '9' {
			continue
		}
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		info, err := Stat(pid)
		if errors.Is(err, ErrNotExist) {
			continue // exited while we looked
		}
		if err != nil {
			return nil, fmt.Errorf("scanning /proc: %w", err)
		}
		if !info.Zombie {
			g.running[info.PGID] = struct{}{}
		}
	}
	return g, nil
}

//go:build darwin

package proc

import (
	"fmt"

	"golang.org/x/sys/unix"
)

const supported = true

// sZomb is the p_stat value of a zombie (sys/proc.h SZOMB).
const sZomb = 5

// Stat reads one process with sysctl kern.proc.pid. A process that is gone
// returns an error that wraps ErrNotExist.
func Stat(pid int) (Info, error) {
	if pid <= 0 {
		return Info{}, fmt.Errorf("reading process %d: not a process id", pid)
	}
	kps, err := unix.SysctlKinfoProcSlice("kern.proc.pid", pid)
	if err != nil {
		return Info{}, fmt.Errorf("reading process %d: %w", pid, err)
	}
	if len(kps) == 0 {
		return Info{}, fmt.Errorf("reading process %d: %w", pid, ErrNotExist)
	}
	return infoOf(&kps[0]), nil
}

func infoOf(kp *unix.KinfoProc) Info {
	tv := kp.Proc.P_starttime
	return Info{
		PID:    int(kp.Proc.P_pid),
		PPID:   int(kp.Eproc.Ppid),
		PGID:   int(kp.Eproc.Pgid),
		Start:  uint64(tv.Sec)*1_000_000 + uint64(tv.Usec) + 1,
		Zombie: kp.Proc.P_stat == sZomb,
	}
}

// BootID names this boot of the host (kern.boottime).
func BootID() (string, error) {
	tv, err := unix.SysctlTimeval("kern.boottime")
	if err != nil {
		return "", fmt.Errorf("reading kern.boottime: %w", err)
	}
	return fmt.Sprintf("%d.%06d", tv.Sec, tv.Usec), nil
}

// ScanGroups reads every process once with sysctl kern.proc.all.
func ScanGroups() (*Groups, error) {
	kps, err := unix.SysctlKinfoProcSlice("kern.proc.all")
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	g := &Groups{running: make(map[int]struct{})}
	for i := range kps {
		info := infoOf(&kps[i])
		if !info.Zombie {
			g.running[info.PGID] = struct{}{}
		}
	}
	return g, nil
}

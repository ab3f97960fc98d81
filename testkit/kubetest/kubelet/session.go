package kubelet

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// killSession SIGKILLs every process of session sid (the container's
// processes: the player starts each container as a session leader, and
// the processes it starts stay in its session unless they leave it with
// setsid). It reads /proc (Linux).
func killSession(sid int) error {
	var errs []error
	for range 3 { // a process may fork while the scan runs
		pids, err := sessionMembers(sid)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("killing %d: %w", pid, err))
			}
		}
	}
	return errors.Join(errs...)
}

// sessionMembers lists the live processes of session sid.
func sessionMembers(sid int) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// After "pid (comm) ": state ppid pgrp session ...
		s := string(data)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 4 || f[0] == "Z" {
			continue
		}
		if n, err := strconv.Atoi(f[3]); err == nil && n == sid {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

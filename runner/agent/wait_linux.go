//go:build linux

package agent

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// waitExit returns once the process has exited, without reaping it (waitid
// with WNOWAIT): its zombie holds its PID, and so its group id, until reap.
func waitExit(p *os.Process) *os.ProcessState {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, p.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			// Cannot wait without reaping: reap now.
			st, _ := p.Wait()
			return st
		}
		return nil
	}
}

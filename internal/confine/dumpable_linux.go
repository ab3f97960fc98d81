//go:build linux

package confine

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Undumpable makes the calling process non-dumpable (PR_SET_DUMPABLE 0):
// its /proc/<pid>/environ, mem, maps, fd and the like become root's, and
// neither they nor ptrace are open to a process of the same user without
// CAP_SYS_PTRACE. The flag is the process's (every thread's), and an exec
// resets it: what the caller starts is dumpable again. /proc/<pid>/stat
// stays readable, which the Lite liveness checks read of agents.
func Undumpable() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("making the process non-dumpable: %w", err)
	}
	return nil
}

//go:build linux

package agent

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Undumpable makes the calling process non-dumpable (PR_SET_DUMPABLE 0):
// its /proc/<pid>/environ, mem, maps, fd and the like become root's, and
// neither they nor ptrace are open to a process of the same user without
// CAP_SYS_PTRACE. The agent calls it first thing, before it reads any
// credential: its task runs as its user and must not read the attempt's
// or the worker's token out of the agent. A task's own exec makes it
// dumpable again; only the agent is covered.
func Undumpable() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("making the agent non-dumpable: %w", err)
	}
	return nil
}

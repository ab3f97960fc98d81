package pgtest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Every process of a server is the postmaster or one of its children. The
// children make themselves leaders of sessions of their own at birth, so a
// signal to the postmaster's process group reaches the postmaster alone:
// they are found through /proc instead. The postmaster is stopped first, so
// that it forks no child the list would miss.

// Kill crashes the server: the postmaster and every one of its processes
// are stopped, then killed with SIGKILL, as a machine that loses power or
// an OOM killer that takes them all would. Nothing is shut down: what was
// not yet flushed is lost, sessions see their connections cut, and a client
// connecting afterwards is refused. The directory stays until Stop. It
// needs a server started without Detached.
func (s *Server) Kill() error {
	if s.detached || s.cmd == nil {
		return fmt.Errorf("pgtest: kill: the server is detached or not running")
	}
	pm := s.cmd.Process.Pid
	if err := stopAndWait(pm); err != nil {
		return fmt.Errorf("pgtest: kill: %w", err)
	}
	children := childrenOf(pm)
	for _, pid := range children {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd, s.exited = nil, nil
	// Dead, not dying: no child of the killed server writes another byte.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, pid := range children {
		if err := poll(ctx, func() (bool, error) { return !alive(pid), nil }); err != nil {
			return fmt.Errorf("pgtest: kill: process %d outlived SIGKILL: %w", pid, err)
		}
	}
	return nil
}

// Freeze stalls the server without killing it: the postmaster and every
// one of its processes are stopped with SIGSTOP, as a disk whose I/O hangs
// would stall them. Connections stay open and a query on one waits without
// an answer; a new connection is accepted by the kernel and then waits for
// its handshake; nothing errors, nothing is lost. Thaw resumes it; Stop and
// Kill work on a frozen server too. It returns once every process is
// stopped.
func (s *Server) Freeze() error {
	pm := s.PID()
	if pm == 0 || !processExists(pm) {
		return fmt.Errorf("pgtest: freeze: the server is not running")
	}
	if err := stopAndWait(pm); err != nil {
		return fmt.Errorf("pgtest: freeze: %w", err)
	}
	for _, pid := range childrenOf(pm) {
		if err := stopAndWait(pid); err != nil {
			return fmt.Errorf("pgtest: freeze: %w", err)
		}
	}
	return nil
}

// Thaw resumes a server that Freeze stalled (SIGCONT to its processes, the
// children first). On a server that is not frozen it does nothing.
func (s *Server) Thaw() error {
	pm := s.PID()
	if pm == 0 || !processExists(pm) {
		return nil
	}
	for _, pid := range childrenOf(pm) {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
	if err := syscall.Kill(pm, syscall.SIGCONT); err != nil {
		return fmt.Errorf("pgtest: thaw: %w", err)
	}
	return nil
}

// stopAndWait sends SIGSTOP to pid and waits until it is stopped.
func stopAndWait(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stop process %d: %w", pid, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := poll(ctx, func() (bool, error) {
		st, _, err := procStat(pid)
		if errors.Is(err, fs.ErrNotExist) {
			return true, nil // gone: nothing left to stop
		}
		if err != nil {
			return false, err
		}
		// Stopped, or dead (a zombie its stopped parent has not reaped).
		return st == 'T' || st == 't' || st == 'Z' || st == 'X', nil
	})
	if err != nil {
		return fmt.Errorf("wait for process %d to stop: %w", pid, err)
	}
	return nil
}

// childrenOf lists the processes whose parent is pid.
func childrenOf(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, ppid, err := procStat(child); err == nil && ppid == pid {
			out = append(out, child)
		}
	}
	return out
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	st, _, err := procStat(pid)
	return err == nil && st != 'Z' && st != 'X'
}

// procStat reads the state letter and the parent of process pid from
// /proc/pid/stat.
func procStat(pid int) (state byte, ppid int, err error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0, err
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, errors.New("unreadable /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 || len(f[0]) != 1 {
		return 0, 0, errors.New("unreadable /proc stat")
	}
	ppid, err = strconv.Atoi(f[1])
	return f[0][0], ppid, err
}

//go:build linux

package confine

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// ClearInheritable empties the calling thread's ambient and inheritable
// capability sets; its effective and permitted sets are left alone. A
// program the thread then executes, not being root and carrying no file
// capabilities, starts with empty permitted, effective and ambient sets:
// whatever capabilities the caller was given stop at it. The caller must
// hold the thread (runtime.LockOSThread) until it has executed the program.
// restore puts both sets back as they were, so that the thread may run
// other goroutines again (a thread that ends takes with it the
// parent-death signal of every child it started: go.dev/issue/27505).
func ClearInheritable() (restore func() error, err error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return nil, fmt.Errorf("reading the capability sets: %w", err)
	}
	saved := data
	var ambient []uintptr
	for c := uintptr(0); c < 64; c++ {
		set, err := unix.PrctlRetInt(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_IS_SET, c, 0, 0)
		if err != nil {
			break // past the last capability this kernel knows
		}
		if set == 1 {
			ambient = append(ambient, c)
		}
	}
	restore = func() error {
		h := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		d := saved
		if err := unix.Capset(&h, &d[0]); err != nil {
			return fmt.Errorf("restoring the inheritable capability set: %w", err)
		}
		for _, c := range ambient {
			if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE, c, 0, 0); err != nil {
				return fmt.Errorf("restoring ambient capability %d: %w", c, err)
			}
		}
		return nil
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("clearing the ambient capability set: %w", err)
	}
	if data[0].Inheritable == 0 && data[1].Inheritable == 0 {
		return restore, nil
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return nil, fmt.Errorf("clearing the inheritable capability set: %w", err)
	}
	return restore, nil
}

// NoNewPrivs sets no_new_privs on the calling thread: neither it nor what
// it executes can gain a privilege by executing a set-user-ID program or
// one with file capabilities. Landlock needs it of a thread without
// CAP_SYS_ADMIN.
func NoNewPrivs() error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("setting no_new_privs: %w", err)
	}
	return nil
}

// AsUser runs fn on an OS thread locked to it whose effective user id is
// uid, and returns its error. Linux keeps user ids per thread (the C
// library and Go's syscall.Setuid make them the process's by changing
// every thread): here only the one thread changes, with a raw setresuid,
// and it is switched back before it runs anything else. Switching to
// another uid needs CAP_SETUID (or root); it is what lets a process that
// started a task as another user (Lite's run_as) signal it without
// CAP_KILL. Should the switch back fail, the thread is left locked and
// ends with fn's goroutine.
func AsUser(uid uint32, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		own := uintptr(unix.Geteuid())
		if _, _, errno := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); errno != 0 {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("switching a thread to uid %d: %w", uid, errno)
			return
		}
		err := fn()
		if _, _, errno := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), own, ^uintptr(0)); errno == 0 {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}

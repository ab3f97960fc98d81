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
func ClearInheritable() error {
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clearing the ambient capability set: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("reading the capability sets: %w", err)
	}
	if data[0].Inheritable == 0 && data[1].Inheritable == 0 {
		return nil
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("clearing the inheritable capability set: %w", err)
	}
	return nil
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

// AsUser runs fn on an OS thread of its own whose effective user id is
// uid, and returns its error. Linux keeps user ids per thread (the C
// library and Go's syscall.Setuid make them the process's by changing
// every thread): here only the one thread changes, with a raw setresuid,
// and it ends with fn, never to run anything else. Switching to another
// uid needs CAP_SETUID (or root); it is what lets a process that started a
// task as another user (Lite's run_as) signal it without CAP_KILL.
func AsUser(uid uint32, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		// Never unlocked: the goroutine's exit ends the thread, with the
		// user it was switched to.
		runtime.LockOSThread()
		if _, _, errno := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); errno != 0 {
			done <- fmt.Errorf("switching a thread to uid %d: %w", uid, errno)
			return
		}
		done <- fn()
	}()
	return <-done
}

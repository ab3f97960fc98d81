package loader

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"

	"github.com/dexaflow/reaper/internal/confine"
)

// dieWithHost makes the kernel kill the plugin when the host dies, even by
// kill -9: a plugin outliving its host would hold ports, files and, for a
// substrate, nothing useful.
func dieWithHost(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}

// trampolineArg0 is the argv[0] under which the host's own executable,
// started again, is the trampoline that confines a plugin and executes it
// (see init).
const trampolineArg0 = "reaper-plugin-confined"

// execFile runs the open file bin, confined: the host's own executable is
// started again (/proc/self/exe) as the trampoline, with bin as its
// descriptor 3; the trampoline confines itself so that it can open none of
// the hidden paths and holds no capability, then executes
// /proc/self/fd/3, so what runs is the file that was checked and hashed,
// whatever is at path by then. argv[0] of the plugin stays path (a plugin
// may take its name from it). The trampoline becomes the plugin (same
// process), so the parent-death signal set on it stays with the plugin.
func execFile(path string, bin *os.File, hidden []string) *exec.Cmd {
	return &exec.Cmd{Path: "/proc/self/exe", Args: append([]string{trampolineArg0, path}, hidden...),
		ExtraFiles: []*os.File{bin}}
}

// init is the trampoline's main when the host's executable was started as
// one (execFile): it never returns then. In every other run it does
// nothing. It is an init, not a call in reaperd's main, so that every
// program that launches plugins through this package (reaperd, its tests,
// the demo) is a trampoline too.
func init() {
	if len(os.Args) < 2 || os.Args[0] != trampolineArg0 {
		return
	}
	err := trampoline(os.Args[1], os.Args[2:])
	fmt.Fprintf(os.Stderr, "reaper plugin %s not started: %v\n", os.Args[1], err)
	os.Exit(126)
}

// trampoline makes its thread into what a plugin inherits and executes the
// plugin on it (execve from one thread makes that thread's credentials the
// new program's):
//
//   - no capability: the ambient and inheritable sets are emptied, so the
//     capabilities reaperd may hold for Lite's run_as (CAP_SETUID,
//     CAP_SETGID) do not reach a plugin that is not root;
//   - no_new_privs: nothing the plugin executes gains a privilege;
//   - with Landlock, no opening of the hidden paths (reaperd's key files,
//     its DSN file, its API credentials): the plugin runs as reaperd's
//     user, so file modes cannot keep them from it. A kernel without
//     Landlock leaves this step out (the daemon warns once at start).
//
// It runs in a process of its own, not on a thread of the host's: a
// thread confined for good would have to end, and the kernel sends the
// parent-death signal of every child a thread started when that thread
// ends (go.dev/issue/27505).
func trampoline(path string, hidden []string) error {
	runtime.LockOSThread() // until the exec: the thread's sets are the plugin's
	if _, err := confine.ClearInheritable(); err != nil {
		return fmt.Errorf("confining the plugin: %w", err)
	}
	if err := confine.NoNewPrivs(); err != nil {
		return fmt.Errorf("confining the plugin: %w", err)
	}
	if len(hidden) > 0 {
		if err := confine.HideFiles(hidden); err != nil && !errors.Is(err, confine.ErrNoLandlock) {
			return fmt.Errorf("confining the plugin: %w", err)
		}
	}
	return syscall.Exec("/proc/self/fd/3", []string{path}, os.Environ())
}

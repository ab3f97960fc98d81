package loader

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"

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

// execFile runs the open file bin: it is handed to the child as its
// descriptor 3 and executed as /proc/self/fd/3, so what runs is the file
// that was checked and hashed, whatever is at path by then. argv[0] stays
// path (a plugin may take its name from it).
func execFile(path string, bin *os.File) *exec.Cmd {
	return &exec.Cmd{Path: "/proc/self/fd/3", Args: []string{path}, ExtraFiles: []*os.File{bin}}
}

// startConfined starts the plugin from an OS thread of its own, made first
// into what the plugin inherits:
//
//   - no capability: the thread's ambient and inheritable sets are emptied,
//     so the capabilities reaperd may hold for Lite's run_as
//     (CAP_SETUID, CAP_SETGID) do not reach a plugin that is not root;
//   - no_new_privs: nothing the plugin executes gains a privilege;
//   - with Landlock, no opening of the hidden paths (reaperd's key files,
//     its DSN file, the ServiceAccount token): the plugin runs as reaperd's
//     user, so file modes cannot keep them from it. A kernel without
//     Landlock leaves this step out (the daemon warns once at start).
//
// Each of these is a thread's own, so the thread must be the plugin's
// parent and must never run anything else: the goroutine holds it locked
// and keeps it until the plugin has exited (waiting without reaping, so
// that go-plugin's own Wait still collects it, once it has drained the
// plugin's output); then it ends without unlocking, and the thread ends
// with it. Keeping the thread for the plugin's life is also what
// dieWithHost needs: the kernel's parent-death signal follows the thread
// that started the child. The plugin is still executed from the open
// binary (execFile).
func (p *process) startConfined() error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		err := confineThread(p.hidden)
		if err == nil {
			err = p.cmd.Start()
		}
		started <- err
		if err != nil {
			return
		}
		var info unix.Siginfo
		for {
			err := unix.Waitid(unix.P_PID, p.cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
			if !errors.Is(err, unix.EINTR) {
				return
			}
		}
	}()
	return <-started
}

// confineThread makes the calling thread into what a plugin inherits (see
// startConfined).
func confineThread(hidden []string) error {
	if err := confine.ClearInheritable(); err != nil {
		return fmt.Errorf("confining the plugin: %w", err)
	}
	if err := confine.NoNewPrivs(); err != nil {
		return fmt.Errorf("confining the plugin: %w", err)
	}
	if len(hidden) == 0 {
		return nil
	}
	if err := confine.HideFiles(hidden); err != nil && !errors.Is(err, confine.ErrNoLandlock) {
		return fmt.Errorf("confining the plugin: %w", err)
	}
	return nil
}

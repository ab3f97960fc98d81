package loader

import (
	"os"
	"os/exec"
	"syscall"
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

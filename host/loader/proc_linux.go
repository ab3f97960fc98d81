package loader

import (
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

//go:build !linux

package loader

import (
	"os"
	"os/exec"
)

// dieWithHost has no portable equivalent outside Linux: there a plugin
// notices its host's death when the go-plugin connection drops.
func dieWithHost(*exec.Cmd) {}

// execFile runs the binary by its path where a process cannot execute an
// open file by a path of its own: a swap between the checks and the start
// is not excluded there.
func execFile(path string, _ *os.File) *exec.Cmd { return exec.Command(path) }

// startConfined starts the plugin as it is: outside Linux there is neither
// Landlock nor a thread's own capability sets.
func (p *process) startConfined() error { return p.cmd.Start() }

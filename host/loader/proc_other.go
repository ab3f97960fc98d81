//go:build !linux

package loader

import "os/exec"

// dieWithHost has no portable equivalent outside Linux: there a plugin
// notices its host's death when the go-plugin connection drops.
func dieWithHost(*exec.Cmd) {}

//go:build !linux

package agent

import "os"

// waitExit reaps the process when it exits: this platform has no portable
// way to wait without reaping.
func waitExit(p *os.Process) *os.ProcessState {
	st, _ := p.Wait()
	return st
}

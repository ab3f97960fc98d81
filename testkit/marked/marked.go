// Package marked finds and kills the processes a test harness started, by
// a marker in their environment (KEY=value) that every child inherits: a
// harness that gives its daemons, agents and tasks one can find what is
// left of them in /proc however they were started, and leave the machine
// as it found it.
package marked

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dexaflow/reaper/substrate/lite/proc"
)

// Process is a live process that carries the marker.
type Process struct {
	PID     int
	Cmdline string // its arguments, space-separated
	Task    string // REAPER_TASK_ID from its environment, or the agent's -task flag
}

// Processes lists the live processes (zombies excepted, and never this
// one) whose environment holds key=value. It reads /proc: elsewhere it
// finds none.
func Processes(key, value string) []Process {
	want := []byte(key + "=" + value)
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []Process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		found, task := false, ""
		for _, v := range bytes.Split(env, []byte{0}) {
			if bytes.Equal(v, want) {
				found = true
			}
			if t, ok := bytes.CutPrefix(v, []byte("REAPER_TASK_ID=")); ok {
				task = string(t)
			}
		}
		if !found {
			continue
		}
		if info, err := proc.Stat(pid); err != nil || info.Zombie {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		cmdline := strings.TrimSpace(string(bytes.ReplaceAll(cmd, []byte{0}, []byte(" "))))
		if task == "" {
			for _, arg := range strings.Fields(cmdline) {
				if t, ok := strings.CutPrefix(arg, "-task="); ok {
					task = t
				}
			}
		}
		out = append(out, Process{PID: pid, Cmdline: cmdline, Task: task})
	}
	return out
}

// KillAll sends SIGKILL to every process carrying key=value, and again to
// whatever carries it 100ms later (a child forked meanwhile), three rounds
// at most.
func KillAll(key, value string) {
	for range 3 {
		ps := Processes(key, value)
		if len(ps) == 0 {
			return
		}
		for _, p := range ps {
			_ = syscall.Kill(p.PID, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

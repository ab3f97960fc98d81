package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// cleanup removes what a demo left in dir: agents and tasks still running
// (found by their command line naming dir, or by their working directory
// inside it: the kube demo's containers), a reaperd whose config is in dir,
// the kube demo's control plane (its programs name their directory inside
// dir) and what its real node made, a database server whose data is in
// dir, and dir itself. It reports
// whether there was anything to clean.
func cleanup(dir string) bool {
	if _, err := os.Stat(dir); err != nil {
		return false
	}
	for _, pid := range processesMentioning(dir) {
		if pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			_ = syscall.Kill(-pid, syscall.SIGKILL) // an agent's task leads its own group
		}
	}
	// Task processes whose agent was killed: found through the records'
	// group ids is overkill here; they are sleeps that end on their own, but
	// kill the groups the records name anyway.
	for _, pgid := range recordedGroups(filepath.Join(dir, "records")) {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
	// The kube demo's real node: its containers, shims, mounts, cgroups,
	// network namespaces and bridge (nothing when the machine's node is
	// another live cluster's).
	if cluster := filepath.Join(dir, "cluster"); exists(filepath.Join(cluster, "node")) {
		_ = kubetest.StopDir(cluster)
	}
	pgDirs, _ := filepath.Glob(filepath.Join(dir, "reaper-pgtest-*"))
	for _, d := range pgDirs {
		_ = pgtest.StopDir(d)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(processesMentioning(dir)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	_ = os.RemoveAll(dir)
	return true
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func processesMentioning(s string) []int {
	var out []int
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmd), s) {
			out = append(out, pid)
			continue
		}
		if cwd, err := os.Readlink(filepath.Join("/proc", p.Name(), "cwd")); err == nil &&
			(cwd == s || strings.HasPrefix(cwd, s+string(filepath.Separator))) {
			out = append(out, pid)
		}
	}
	return out
}

// recordedGroups reads the pgid= lines of the .pgid records in dir.
func recordedGroups(dir string) []int {
	files, _ := filepath.Glob(filepath.Join(dir, "*.pgid"))
	var out []int
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "pgid="); ok {
				if n, err := strconv.Atoi(v); err == nil && n > 1 {
					out = append(out, n)
				}
			}
		}
	}
	return out
}

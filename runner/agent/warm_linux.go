//go:build linux

package agent

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/dexaflow/reaper/substrate/lite/proc"
)

// becomeSubreaper makes this process a child subreaper: orphans among its
// descendants are reparented to it.
func becomeSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl PR_SET_CHILD_SUBREAPER: %w", err)
	}
	return nil
}

// sweepRoundsMax bounds a sweep's rounds; each round stops or kills what
// the last one could not see, so a handful is the most a real tree needs.
const sweepRoundsMax = 64

// sweepDescendants ends every descendant of this process outside the
// trees rooted at spare: it stops them all first (so none forks during the
// sweep; a round that stopped someone new reads the tree again), then kills
// them, reaps those that are its children, and starts over until none is
// left. A process it may not signal (one that took another uid through a
// set-uid program) is left, and named in the error. It returns how many it
// killed.
func sweepDescendants(spare map[int]bool) (int, error) {
	self := os.Getpid()
	stopped, denied := map[int]bool{}, map[int]bool{}
	killed := 0
	for range sweepRoundsMax {
		procs, err := readProcs()
		if err != nil {
			return killed, err
		}
		var targets []int
		for _, p := range descendants(self, procs, spare) {
			if !denied[p] {
				targets = append(targets, p)
			}
		}
		if len(targets) == 0 {
			if len(denied) > 0 {
				return killed, fmt.Errorf("%d escaped processes could not be signalled (another uid)", len(denied))
			}
			return killed, nil
		}
		fresh := false
		for _, p := range targets {
			if stopped[p] || procs[p].zombie {
				continue
			}
			if err := unix.Kill(p, unix.SIGSTOP); errors.Is(err, unix.EPERM) {
				denied[p] = true
				continue
			}
			stopped[p], fresh = true, true
		}
		if fresh {
			continue
		}
		for _, p := range targets {
			if denied[p] {
				continue
			}
			if !procs[p].zombie {
				if err := unix.Kill(p, unix.SIGKILL); err != nil {
					denied[p] = errors.Is(err, unix.EPERM)
					continue
				}
				killed++
			}
			if procs[p].ppid == self {
				reap(p)
			}
		}
	}
	return killed, fmt.Errorf("descendants still left after %d rounds", sweepRoundsMax)
}

// reap waits for the child pid (killed, or a zombie) and collects it.
func reap(pid int) {
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(pid, &ws, 0, nil)
		if !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

type procInfo struct {
	ppid   int
	zombie bool
}

// readProcs reads every process's parent, and whether it is a zombie, from
// /proc (through proc.Stat, which the Lite liveness checks read with).
func readProcs() (map[int]procInfo, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	out := make(map[int]procInfo, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		info, err := proc.Stat(pid)
		if err != nil {
			continue // gone meanwhile
		}
		out[pid] = procInfo{ppid: info.PPID, zombie: info.Zombie}
	}
	return out, nil
}

// descendants are root's descendants in procs, less the trees rooted at
// spare.
func descendants(root int, procs map[int]procInfo, spare map[int]bool) []int {
	children := map[int][]int{}
	for p, in := range procs {
		children[in.ppid] = append(children[in.ppid], p)
	}
	var out []int
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			if spare[c] {
				continue
			}
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// Package confine holds what reaperd and its agents do to keep their own
// secrets from the processes they start, which run code they do not trust
// (plugins, tasks), often as the same user:
//
//   - Undumpable closes the calling process's memory and /proc files
//     (environ, mem) to every process of the same user without
//     CAP_SYS_PTRACE. reaperd and every agent mode call it first in main.
//   - ClearInheritable empties the calling thread's ambient and inheritable
//     capability sets, so that a program it executes starts with no
//     capability (unless it runs as root): the capabilities reaperd is
//     given for run_as reach neither the plugins nor the tasks.
//   - HideFiles (Landlock) lets the calling thread, and what it executes,
//     open every file but the ones named: a plugin runs as reaperd's user,
//     so file modes cannot keep reaperd's key files, its DSN file or its
//     ServiceAccount token from it.
//   - AsUser runs a function on a thread of its own whose effective user is
//     another: the agent signals a run_as task with the task's own uid,
//     which needs no CAP_KILL.
//
// Capabilities, no_new_privs, Landlock domains and user ids are each a
// thread's own on Linux. Every function here that changes them changes
// only the calling thread; the callers run them on a goroutine locked to
// its OS thread which exits without unlocking it, so that the Go runtime
// ends that thread with it and no other goroutine ever runs with it.
package confine

import "errors"

// ErrNoLandlock is wrapped when the kernel offers no Landlock (not built
// in, disabled at boot, or its system calls filtered out): HideFiles then
// hides nothing.
var ErrNoLandlock = errors.New("the kernel offers no Landlock")

// ServiceAccountDir is where Kubernetes mounts a pod's ServiceAccount token
// (with its CA and namespace).
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

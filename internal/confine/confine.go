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
// only the calling thread, which the caller holds (runtime.LockOSThread).
// A thread must not simply end with such a change: the kernel sends the
// parent-death signal of every child a thread started when that thread
// ends (go.dev/issue/27505). So what can be undone is undone before the
// thread is released (ClearInheritable's restore, AsUser), and what cannot
// (no_new_privs, Landlock) is done in a process of its own that then
// executes the program (the plugin loader's trampoline).
package confine

import "errors"

// ErrNoLandlock is wrapped when the kernel offers no Landlock (not built
// in, disabled at boot, or its system calls filtered out): HideFiles then
// hides nothing.
var ErrNoLandlock = errors.New("the kernel offers no Landlock")

// ServiceAccountDir is where Kubernetes mounts a pod's ServiceAccount token
// (with its CA and namespace).
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

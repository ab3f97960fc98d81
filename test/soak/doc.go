// Package soak is the randomized fault soak of the Lite edition: `make
// soak`. It is not part of `make test`: TestSoak skips unless REAPER_SOAK
// names a duration.
//
// For that long it runs the whole system for real, the way an operator
// would: a PostgreSQL server (internal/pgtest), three reaperd replicas of
// the binaries `make build` made, each with the Lite runner and the three
// Lite reapers, a steady stream of runs of short shell tasks (tasks that
// succeed, fail and retry, ignore SIGTERM, fork children, leave a child
// behind with setsid, or run into their execution timeout), and an injector
// that, at random from the seed, throws overlapping faults at it: kill -9
// of an agent, of an agent and its task group, of an escaped child, of the
// leading reaperd (restarted after), of a reaper or substrate plugin;
// SIGSTOP/SIGCONT of an agent and of the leading reaperd (a leader paused
// past its lease that then resumes: the fencing case); a PostgreSQL
// restart; a burst of new runs.
//
// The invariants (invariants.go) are judged from accounts the board cannot
// colour: every agent keeps a journal of its own (REAPER_AGENT_JOURNAL_DIR,
// see package agent), the soak watches the process table, and triggers the
// soak installs in its database record every change of a task instance, a
// run and the leader row with the database's own clock and the term
// current in that transaction. They are checked every few seconds while
// the system runs and once more at the end; the first violation stops the
// soak with its evidence, and keeps its directory (logs, journals) for
// study.
//
// The seed is printed at the start and taken back from REAPER_SOAK_SEED:
// the same seed makes the same choices (which fault, when, which target
// among those sorted by attempt), though the processes' own timing differs
// from run to run.
package soak

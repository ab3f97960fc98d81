// Package e2e is the fault suite: the whole Lite system run for real
// (reaperd with its runner, reaper-agent processes running shell tasks, the
// three Lite reaper plugins behind the settling gate, a PostgreSQL board)
// while faults are injected into it, with figures at the end.
//
// Each scenario gets its own database, record directory, log directory,
// task files and telemetry port, so they all run side by side:
//
//  1. an agent killed with SIGKILL while its task runs on;
//  2. an agent and its whole task group killed;
//  3. a task whose child leaves the group with setsid (the documented
//     boundary: the escaped process neither keeps its attempt alive nor is
//     stopped with it);
//  4. reaperd killed with SIGKILL mid-cycle and restarted, an agent dying
//     while it is down;
//  5. PostgreSQL stopped past the lease and agent_lost, then restarted;
//  6. two replicas, the leader killed;
//  7. a reaper plugin that crashes in every pass;
//  8. a reaper plugin that hangs in every pass until its budget ends it;
//  9. and 10. at the specification's cycle and stop timings (30 s; SIGTERM,
//     10 s, SIGKILL, 5 s), an agent killed while its task group ignores
//     SIGTERM: the stop outlasts the reaper's share of the reap phase and
//     goes on in the substrate, the mark lands on the pass that finds the
//     group gone, with agentlost first in the order (9) and last (10), and
//     no plugin is recycled for it (about two and a half minutes: these
//     two set the suite's wall time);
//  11. two replicas, PostgreSQL's processes stopped (SIGSTOP: every query
//     hangs rather than fails) past the lease, then resumed;
//  12. the board's primary killed and its synchronous standby promoted,
//     every replica's DSN naming both: they follow without a restart and
//     nothing the board acknowledged is lost;
//  13. the primary killed and an asynchronous standby promoted that missed
//     the last term increment, so that a restarted replica is handed the
//     term another replica (frozen across the failover, and renewing
//     seldom) still believes it holds: the fence's holder check refuses
//     the old holder's writes and it steps down;
//  14. two replicas, the leader cut off from PostgreSQL by a partition that
//     drops its packets (its connections hang) while the other sees the
//     database: the leader stops leading on its own clock, the other takes
//     over once the lease has run out, and after the heal the old leader
//     stands by (the database listens on a second loopback address, and an
//     iptables DROP rule on it is the partition).
//
// Every scenario runs one run of a victim task (or two) next to bystanders
// and checks the same three promises: the attempts the test did not harm
// ran once, succeeded at try 1 epoch 0 and have no applied reaper decision
// in the audit; no task ever ran twice at once (each execution appends
// start and end lines to its task's file, and a killed one is watched in
// /proc until its group is gone); and nothing is wedged at the end (the run
// is final, and no process carrying the scenario's marker is left).
//
// Each scenario is also judged by its fault history (package
// testkit/history, history.jsonl in its directory): triggers installed in
// its database before any replica starts (package testkit/boardhistory)
// record every write with its writer, term and fence; at the finish those
// writes, the executions of the task files (a killed one ended at the scan
// that found its group gone), the faults thrown and the board's final rows
// are written out and checked. Each violation fails the scenario with the
// checker's text.
//
// The suite prints one table: per scenario and in total, faults injected,
// faults recovered within the SLA (the fault's threshold plus one interval,
// from the fault to the reaping decision), false reaps, double executions,
// wedged attempts, and the history's writes applied, executions, terms and
// violations; under it, each scenario's own figures (for the PostgreSQL
// nemeses: the longest time without a leader, the time from the fault to
// the first cycle on the recovered or promoted board, the writes the fence
// refused).
//
//	go test -v -run TestFaultSuite ./test/e2e/
//
// Everything lives in the package's _test files; this file documents them.
package e2e

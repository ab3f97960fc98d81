// Package kubee2e is the kube edition's fault suite: the whole Kubernetes
// edition run for real while faults are injected into it, with a figures
// table at the end.
//
// What is real: PostgreSQL (the board), kube-apiserver, etcd and
// kube-controller-manager (Pod GC, the eviction and disruption
// controllers), two reaperd processes per scenario on leader "kubernetes"
// (a real Lease), each with the kube substrate, the five reapers as plugin
// binaries over go-plugin, the kube runner creating the task pods and the
// attempt API the agents report to, and the reaper-agent binary in pod
// mode.
//
// What is simulated, because KWOK runs no containers and the test cluster
// has no scheduler:
//
//   - the scheduler: each scenario's binder (kubetest.Binder) binds its
//     unbound pods to its newest KWOK node;
//   - the kubelet: the player (testkit/kubetest/kubelet) runs each Running
//     pod's agent as a local process and writes what a kubelet would into
//     the pod's status: container states, exit codes, the termination
//     message from the agent's record file; it stops the process when the
//     pod is deleted (SIGTERM, then SIGKILL after the pod's grace). One
//     player runs the task pods (selected by the run label), a second the
//     warm pool's worker pods (by the pool's label);
//   - OOMKilled: the player's OOM annotation kills the task's process
//     session and writes the container OOMKilled (exit 137);
//   - preemption: the DisruptionTarget condition with reason
//     PreemptionByScheduler is written through the status subresource,
//     then the pod deleted, as the scheduler would do it (nothing in the
//     test cluster preempts);
//   - the tasks are shell commands on the test's host.
//
// Each scenario has its own namespace, node(s), database and reaperd
// pair, so they run side by side on one cluster (four at a time); the API
// server outage runs on a cluster of its own. The pod create unavailable
// for more than 15 minutes runs reaperd in process (host/daemon) on a fake
// clock, with the Postgres lease, so the 15 minutes pass in seconds; the
// API server answers its creates 500 through a validating webhook that
// cannot be called. The orphan run restarts the replicas without the
// runner: the scheduler gone, the reapers and the attempt API left. The
// leader cut off from the API server reaches it through a proxy
// (testkit/netfault) whose cut holds every byte, so that replica's
// requests hang while the other replica and the cluster see the API
// server; the leader cut off from PostgreSQL reaches the board the same
// way (a proxy its DSN names) while both replicas see the API server, and
// the other must take the Lease and its term within a bound of the cut
// (boardCutTakeover). The PostgreSQL nemeses (pgnemesis_test.go) run on
// boards of their own: a server frozen (pgtest Freeze) past the lease; a
// primary with a synchronous standby killed -9 and the standby promoted,
// the replicas' DSN naming both; and a standby left asynchronous and
// behind while a second replica, on a Kubernetes Lease of its own, takes
// the next term on the primary alone, is frozen, and is thawed after the
// promotion into a term the promoted board handed to another replica (the
// fence refuses it for its holder). Every scenario checks the same promises:
// each task's exact end (state, try, re-placed or not); no false reap (an
// applied reaper decision on an attempt or run the test did not harm); no
// double execution (each execution of a task holds an flock on the task's
// lock file for its whole life, and one that finds it taken says so); and
// nothing wedged (the run final, no pod of it pending or running, no
// process of the scenario left once its reaperds stop). Each fault's SLA is
// its threshold, or the reaping term's settling gate when later, plus one
// interval, from the fault to the reaping decision.
//
// Each scenario is also judged by its fault history (package
// testkit/history, history.jsonl in its directory): triggers installed in
// its database before any replica starts (package testkit/boardhistory)
// record every write with its writer, term and fence; at the finish those
// writes, the executions its task logs record, the faults thrown and the
// board's final rows are written out and checked, and each violation fails
// the scenario with the checker's text. Each execution's start and end
// line carries its time; one killed writes no end, so the harness writes a
// killed line when it establishes the execution gone: on the player's
// tier the first scan of the process table that finds its group gone, on
// the real node the moment the scenario tells the ledger the execution
// can never end. The table's history columns are the writes applied,
// executions, terms and violations.
//
//	make e2e-kube
//
// Everything lives in the package's _test files; this file documents them.
package kubee2e

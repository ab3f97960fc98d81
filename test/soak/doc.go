// Package soak is the randomized fault soak of both editions: `make soak`
// (Lite) and `make soak EDITION=kube`. It is not part of `make test`:
// TestSoak skips unless REAPER_SOAK names a duration. A run takes its
// duration plus about a minute: the start (a kube cluster's start counts
// 10 to 40 seconds under load), the recovery after the last fault, the
// report.
//
// For that long it runs the whole system for real, the way an operator
// would: a PostgreSQL server (testkit/pgtest), three reaperd replicas of
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
// Both editions also throw three nemeses, drawn from the seed like the rest.
// The database is a primary started for replication with one synchronous
// standby (testkit/pgtest), and each replica reaches it through links of
// its own: a testkit/netfault proxy per server, named in the replica's
// multi-host connection string (REAPER_DSN, target_session_attrs=read-write)
// in the servers' order. A partition Cuts one replica's proxies (the
// leader's, or a slot drawn) for a time drawn either side of the lease:
// its connections hang, nothing is refused, the others see the database;
// Heal lets what was held through, late (a deposed leader's write meets
// the fence). A proxy per server, not the primary's alone, so that the cut
// holds whichever server is the primary, after a failover too. A freeze
// SIGSTOPs every process of the primary (pgtest Freeze: a stalled disk)
// for a time drawn either side of the lease, then Thaws it. A failover,
// drawn at most once (no standby is left after it), kills the primary -9,
// waits a drawn moment and promotes the standby, in one of two modes its
// draw picks (asyncfailover_test.go). Synchronous: nothing the primary
// acknowledged is lost, which the invariants and the checker judge on the
// promoted server's copy of the triggers' tables. Asynchronous: the
// standby is first made asynchronous and stops receiving WAL (pgtest
// Desynchronize, StopStreaming), the leading replica is killed, and for a
// window drawn from the lease to past the settling grace the system writes
// on to the primary alone before it is killed; what it acknowledged then
// is lost (marks, reports, runs submitted, a successor's term), and the
// promoted board hands a lost term's number out again, to whichever
// replica acquires next: the fence's holder check is what keeps two holders
// of one number from both writing, and the checker's one-writer rules
// judge it unexcused. The fault keeps the window [standby made
// asynchronous, primary killed] and the history carries it (a fault event
// with lost_from). The checker excuses, and counts (excused_by_lost_window),
// only a task the promoted board never had all of whose executions started
// in the window (its run was submitted there); the invariants only an
// agent told should_terminate whose execution started in the window,
// before the promotion, and whose attempt the promoted board had not
// recorded running by then (its running report, or its dispatch, was
// lost), and on kube a pod torn down under such an execution on the same
// terms. Two executions of one task at once, a mark while an agent lives,
// an outcome lost from the promoted board's own writes are never excused.
// The soak forgets the audit and heartbeat rows it had read and reads the
// promoted board's afresh (their ids are handed out again). The report
// gives the rows and terms lost, each lost term as the promoted board
// handed it out again, the fence's refusals after the promotion and what
// was excused. The restart and the freeze act on whichever server is
// the primary then; the three database faults take the database one at a
// time. The soak's own connections name both servers directly, so its
// judge is never partitioned. The report gives each nemesis its faults,
// the fence's refusals scraped in its windows (from the fault to its end
// plus the lease and the grace), the longest time without a leader that
// began in one, its recovery (from its end until a leader holds the lease
// and the board has applied a fenced write), and the checker's violations
// placed in its windows; the soak reads the leader row every 200 ms and
// the fence counters every second for that.
//
// The invariants (invariants.go) are judged from accounts the board cannot
// colour: every agent keeps a journal of its own (REAPER_AGENT_JOURNAL_DIR,
// see package agent), the soak watches the process table, and triggers the
// soak installs in its database (package testkit/boardhistory, which the
// fault suites share) record every change of a task instance, a
// run and the leader row with the database's own clock and the term
// current in that transaction. They are checked every few seconds while
// the system runs and once more at the end; the first violation stops the
// soak with its evidence, and keeps its directory (logs, journals) for
// study.
//
// At the end the soak writes its run's fault history (history.jsonl in its
// directory; Record, judgeHistory) from the same accounts, with the
// board's final rows, and the independent checker of package
// testkit/history judges it: its verdict ends the report, and each of its
// violations fails the soak as the soak's own invariants do. The triggers
// record, for that, who wrote each change (the connection's
// application_name: reaperd names its connections by its holder) and
// whether its transaction was fenced (it share-locked the leader row); a
// fenced write is put under its writer's own term, the latest the leader
// row's history shows it acquiring. The fence's refusals leave no row: the
// report counts them from the replicas' reaper_fence_refused_total.
//
// The kube edition (REAPER_SOAK_EDITION=kube, kube_test.go) runs the same
// PostgreSQL, replicas, stream, invariants and report against a local
// kube-apiserver with KWOK and kube-controller-manager (testkit/kubetest):
// the replicas run edition "kube" on leader "kubernetes" (the Lease) with
// the kube runner dispatching pods, the kube substrate and its four reapers
// (dispatchlost, podlost, agentlost, orphanrun); a binder (kubetest.Binder)
// plays the scheduler the cluster lacks, spreading the pods over three
// nodes by their names, and the
// kubelet player (testkit/kubetest/kubelet) runs each Running pod's agent
// as a local process with the soak's journal and marker, so the agents'
// journals and the process table tell the same story as on Lite. Its
// faults are kill -9 of an agent (the container's process), a pod deleted,
// a node deleted (its pods then go by the controller manager's Pod GC), a
// pod evicted through the Eviction API, the API server paused
// (SIGSTOP/SIGCONT) past the lease, kill -9 and SIGSTOP/SIGCONT of the
// leading reaperd, a PostgreSQL restart, a burst of runs, the three
// database nemeses of Lite (the replicas linked to PostgreSQL the same
// way; the failover in either mode), and a fourth: one replica partitioned from the API server. Each
// replica has a configuration and a kubeconfig of its own, whose server is
// a netfault proxy of its own in front of kube-apiserver (the Lease's
// client, the substrate's and the runner's all go through it); the
// partition Cuts the leader's proxy or a drawn slot's for a time drawn
// either side of the lease, then Heals it, while the nodes, the player, the
// binder and the soak see the API server. The report gives it its figures
// as it does the others'. Tasks succeed, fail and retry, trap SIGTERM, fork
// children or run into their timeout.
// Two invariants judge what only a pod shows: no_live_pod_torn_down (every
// deletion or lowered deadline of a task pod the API server reported, the
// injector's own aside, met no running task of an attempt the board still
// held) and no_retry_spent_on_a_cluster_stop (a task whose pod the cluster
// stopped settles on the infra rail). On kube the reapers see heartbeats,
// not processes, so no_reap_of_a_live_attempt there refuses a mark made
// while the attempt's heartbeats still landed (a trigger records each), and
// lets one stand that follows agent_lost of silence: the spec's teardown of
// a silent agent's pod, whose durable record may still override the mark.
// What is simulated: KWOK runs no containers (the player does, without
// images, cgroups or a network of their own), and a deleted node's agents
// live on until Pod GC deletes their pods.
//
// With REAPER_SOAK_NODE=real (`make soak EDITION=kube NODE=real`,
// realnode_test.go) the kube edition runs its pods on the test cluster's
// real node instead (kubetest.Options.RealNode: a real kubelet, containerd
// and runc; root, one per machine), from a task image the soak imports, the
// agents reporting to the attempt API over the pod network, at most
// realMaxParallel attempts at once, the stream at half its rate. The
// invariants read the same accounts: each agent journals into its pod's
// scratch volume (a wrapper in the image sets the directory and the marker;
// the product's pod is unchanged), the soak hard-links each journal out of
// its pod's volume as it appears (the link outlives the volume), and
// resolves the pids it names (its pod's process namespace's) to the host's;
// an attempt reported running whose journal never reached the soak fails
// it. Its faults are the player edition's without the node deletion (one
// node), with the kubelet killed -9 and restarted, the kubelet frozen under
// the node monitor grace, the wedged agent, and a fifth nemesis: a teardown
// refused past the valve. A drawn running attempt's agent is SIGSTOPped
// inside its container while a validating webhook that cannot be called
// (failurePolicy Fail), selecting that attempt's pod by its labels, refuses
// every update and delete of it until the board has marked the attempt
// (agent_lost of silence, later when a leadership change falls in between;
// the soak reads the row) and then for the infra confirmation valve, an
// interval and a drawn moment: its stop in place and its delete are refused
// and owed, and the valve passes while the old container may still run; the
// runner must hold the mark rather than place a successor (the invariants
// find two executions of a task otherwise). Then the webhook goes, the owed
// teardown ends the pod, and the agent is resumed a drawn moment after if it
// still runs; the soak logs how often the runner held the mark and opened
// the valve while the refusal lasted. Only the real node throws it: KWOK
// writes a stopped pod's end at its deadline while the player's process
// still runs its grace.
//
// The seed is printed at the start and taken back from REAPER_SOAK_SEED:
// the same seed makes the same choices (which fault, when, which target
// among those sorted by attempt), though the processes' own timing differs
// from run to run.
package soak

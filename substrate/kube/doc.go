// Package kube is the Kubernetes substrate: the task pods of one namespace,
// watched through an informer, torn down one pinned attempt at a time, and
// reconciled by the sweep that runs before every reap phase.
//
// # Which pod is whose
//
// A task pod names its attempt with four labels and one annotation
// (labels.go): leoflow.io/run-id, leoflow.io/task-id (lossy: lowercased,
// "_" and "." turned into "-"), leoflow.io/try-number,
// leoflow.io/attempt-epoch (a pod without it counts as epoch 0) and the
// annotation leoflow.io/raw-task-id (the exact task id). A pod belongs to
// an attempt only when all of them agree; a pod without the annotation
// (created before it existed) is matched on its labels alone, except that
// its outcome settles (or overrides) only the attempt that recorded its
// UID on the board, never the one its lossy label names. So load_a
// and load-a, which share a task-id label, never read or stop each
// other's pod, and a newer try or epoch is never the one touched.
//
// Labels are no proof of who made a pod, so on top of them the UID the
// kube runner recorded on the attempt decides (foreign.go): a pod whose
// labels name an attempt that records another UID is foreign, made by
// someone else. It settles and overrides nothing (the board refuses it,
// pod_not_recorded), keeps no attempt alive, holds no confirmation back,
// and is never torn down, released or collected; it is logged once and
// reported once as a foreign_task_pod decision by the next sweep. An
// attempt that records no UID keeps the label rule.
//
// # Presence
//
// An informer lists and watches the namespace's pods that carry a run-id
// label. Its transform reduces each pod to what reaping reads (identity,
// the attempt labels, phase, reason and message, start time, the
// DisruptionTarget condition, the containers' states and termination
// messages), in a compact type of its own rather than a corev1.Pod, so the
// cache of 100,000 pods stays bounded. Synced reports its first full list.
//
// Liveness is a presence check. A cached Pending or Running pod of exactly
// the attempt answers alive with no API call. Everything else (a miss, a
// cached pod in another phase, a request for an authoritative read, a cache
// not yet synced) is read live, a whole page of attempts in one LIST with a
// set-based selector (run-id in (...), task-id in (...)), matched exactly
// on the client. A read error answers unknown, so the reaper defers. Read
// live, an attempt is alive while any pod of it is present: Pending or
// Running; Unknown (its node went silent, a container may run); or finished
// (a finished pod is a present pod, and its outcome is the reconciler's to
// settle, not a reaper's to guess). Pending is set when a Pending pod exists
// and none Running. Dead means no pod object of the attempt at all.
//
// # Teardown
//
// Teardown reads the attempt's pods (or the run's) live and acts on each
// pod it read, pinned by that pod's UID, so a pod created after the read is
// never touched:
//
//   - Succeeded or Failed: skipped, logged at INFO ("reap teardown: task
//     pod is already in a terminal phase"); its outcome record stays.
//   - started (a start time): stopped in place by lowering
//     activeDeadlineSeconds to 1 (a JSON patch that tests /metadata/uid
//     first, so the API server refuses it for a replaced pod); the kubelet
//     stops it and the pod object
//     stays with its record. A refused patch (a Role without patch, a
//     webhook) deletes the pod instead: TeardownDeleteFallback, which the
//     reaper meters as reap_teardown_delete_fallback.
//   - never started: deleted (a Pending pod can still start the task).
//   - phase Unknown: deleted: its node is not reporting, so no kubelet
//     would enforce a deadline, and the reconciler, which never settles or
//     collects an Unknown pod, would leave it behind.
//
// A pod that is gone or replaced by the time of the call (NotFound, or the
// UID precondition's Conflict) is left alone and reported as nothing done.
//
// # The durable outcome record
//
// The task container's termination message (at most 4096 bytes, the
// kubelet's limit) holds the attempt's outcome record, one JSON object:
//
//	{"dexaflow_outcome":1,"outcome":"SUCCESS","run_id":"r1","task_id":"load_a","try":2,"epoch":1,"exit_code":0}
//	{"dexaflow_outcome":1,"outcome":"INFRA","run_id":"r1","task_id":"load_a","try":2,"epoch":1,"reason":"Unavailable: GetTaskSpec"}
//
// dexaflow_outcome is the format's version (1); outcome is SUCCESS, FAILED,
// RESCHEDULE or INFRA (the infra marker); run_id, task_id, try and epoch
// name the execution that wrote it; exit_code is the task's exit code,
// absent when the task's code never ran; reason is the agent's own words.
// A message that is not such an object, or that names another attempt than
// the pod's labels (another epoch above all: a superseded execution wrote
// it), is no record: the pod settles by what the cluster says. Record and
// ParseRecord write and read it.
//
// # The reconcile sweep
//
// Sweep runs on a synced cache (until then it fails, and the settling gate
// holds) in four steps:
//
//  1. Settle every finished pod's attempt, the attempt its labels name and
//     no other (for a pod without the raw task id annotation: the attempt
//     whose recorded pod UID is the pod's, which the board resolves), from
//     queued or running, by judgeFinished: a SUCCESS or
//     RESCHEDULE record wins; an INFRA record with a reason and no exit code
//     settles on the infra rail as control_plane_unavailable (any other
//     shape is a task failure); a pod the cluster stopped (DisruptionTarget
//     True, or reason Evicted, Shutdown, NodeShutdown, Terminated, OutOfcpu,
//     OutOfmemory, UnexpectedAdmissionError) settles on the infra rail as
//     pod_disrupted, unless its task container was OOMKilled or the
//     kubelet's eviction message names a limit of the pod's own (task
//     failures); otherwise the phase decides, a FAILED record giving the
//     failure its words. Infra settlements are confirmed as they are made.
//     The finished pods include tombstones: the final state of finished
//     task pods the informer saw deleted since the last sweep (Pod GC
//     deletes what it stops at once), each offered once, never presence,
//     never collected; bounded in count and age (tombstone.go).
//  2. For each provisional infra mark of a kube attempt, read the
//     attempt's pods live: a SUCCESS record inside the infra confirmation
//     valve overrides the mark (the board also requires the run to be
//     running, and appends "outcome recovered from the durable record over
//     <mark>"); SweepResult.Overrides counts them by mark. Otherwise the
//     mark is confirmed when no pod of the attempt is left or every task
//     container has terminated; a container still running holds it back.
//  3. For each provisional infra mark of a warm attempt (no pod of its
//     own, no record), read the warm pool live after listing the page: the
//     mark is confirmed when its worker's pod is gone or every container
//     of it has terminated, or when the worker is alive and its last claim
//     (which the board carries on the candidate) was made strictly after
//     the mark and lists what it runs without the attempt (judgeWarmMark);
//     a live worker that claimed nothing since, still lists the attempt or
//     did not say what it runs holds it back, and a LIST error confirms
//     nothing (warm_worker_list_error).
//  4. Remove the outcome record finalizer (FinalizerOutcomeRecord, which
//     the kube runner puts on every task pod, never on a warm worker) from
//     each pod whose record has done its work: finished with its attempt
//     settled (unless a provisional mark inside the valve still waits on
//     its running container), or being deleted without ever starting. A
//     deletion before the sweep read a pod therefore leaves it present,
//     finished, and settled here like any other. The leak bound releases
//     the rest (LabelReconcileFinalizerLeak): settled long ago, deleted
//     with no grace and no end written past the grace rung, or ended more
//     than finalizer_max_age ago. Each removal is a JSON patch testing the
//     UID, the resourceVersion and the entry, removing only that entry
//     (finalizer.go, judgeRelease).
//  5. Delete, pinned by UID, every finished pod whose attempt is settled
//     and that finished more than CollectAfter (10 minutes) ago and no
//     longer carries the finalizer, except a pod whose attempt still holds
//     a provisional mark (for a pod without the annotation, a mark of any
//     task its label could name). Unknown is not finished: never settled,
//     never collected.
//
// # Kubernetes Events
//
// Each pod a teardown stops in place or deletes, and each whose attempt
// the sweep settles (step 1) or whose SUCCESS record overrides a mark
// (step 2), gets an events.k8s.io Event regarding it (name and UID),
// reported by "reaperd": the decision label is its reason, the action
// StopInPlace, Delete or Settle, the note says what was done and names
// the attempt, and a recorded failure makes it a Warning (events.go). A
// pod reaperd does not own is never acted on, so never written about.
// Client-go's broadcaster aggregates repeats into a series; a client of
// the Events' own bounds their rate apart from the substrate's; a failure
// to record fails nothing and is logged once a streak. events = false
// turns them off.
//
// The classification is pure functions of the pod (judgeFinished,
// judgeMark, judgeWarmMark, judgeTeardown, judgeRelease, collectible),
// tested rule by rule.
package kube

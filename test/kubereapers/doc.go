// Package kubereapers holds the integration tests of the reapers on the
// kube edition: every reaper's pass, in process, against a real
// kube-apiserver with KWOK playing the nodes (testkit/kubetest), the real
// kube substrate (substrate/kube) configured on a namespace of it, and a
// real PostgreSQL board (testkit/pgtest) whose rows the board's own
// lifecycle writer drives.
//
// Pods are made the way the kube runner makes them: the attempt's labels
// and raw-task-id annotation from kube.AttemptLabels, a container named
// "task". A pod placed on the KWOK node runs; an unplaced one stays Pending
// and never starts. What a kubelet would write when a container ends, the
// tests write through the status subresource.
//
// Only the reapers' clock is fake: a pass's time is moved across the
// thresholds instead of being waited for. Waiting is only ever for the
// cluster (a pod to run, to go, the informer to catch up), with a deadline.
//
// Everything lives in the package's _test files; this file only documents
// them.
package kubereapers

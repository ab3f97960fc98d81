// Package testkit holds the project's test harnesses, each a package of its
// own: pgtest (a throwaway PostgreSQL started as an unprivileged user),
// kubetest (a real kube-apiserver, etcd, KWOK and controller manager, a
// real node beside them, and the kubelet player), helmrelease (the chart
// installed from the image on that cluster as users install it: the
// install tier's and make demo-helm's), testbin (the project's
// binaries built once per test binary), validatetest, marked (processes a
// test left, by their marker), massbench (the mass recovery's workload), machinecpu
// (the whole machine's busy CPU time, for benchmarks), unpriv (an unprivileged
// account to run a process as), history (a fault history of guarded writes
// and executions, and the checker that judges it), boardhistory (the
// triggers that record the board's writes and their conversion to such a
// history, shared by the soak and the fault suites) and
// eventually (waiting for what is truly asynchronous).
//
// They import the product from above it; product code never imports them
// (TestNoProductPackageImportsTheTestKit). The demo and the tools that
// drive whole clusters (demo/, tools/) use them as tests do. They are no
// API of the project's: a plugin author tests against sdk/sdktest.
package testkit

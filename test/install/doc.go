// Package install holds the tier that installs reaper the way its users do:
// the container image (tools/image) imported into the test cluster's real
// node, the Helm chart (deploy/helm/reaper) installed with helm into a
// cluster that hosts in-cluster workloads (kubetest.Options.InCluster:
// kube-scheduler, kube-proxy, CoreDNS), a PostgreSQL the pods reach on the
// pod network's gateway as they would a managed one, and runs submitted
// from the machine with reaperctl. Its tests are the chart's promises to
// those users: both replicas Ready by their own probes, one Lease holder,
// task pods made by the in-cluster kube runner and their agents reporting
// through the attempt API's Service by its DNS name, every task succeeded,
// and an uninstall that leaves nothing of reaperd's behind.
//
// The install itself, and what the tests read of it, is
// testkit/helmrelease's, which make demo-helm takes too: the tests hold
// it to its promises.
//
// The tier needs the real node: where the machine cannot host one its
// tests skip saying why, and with REAPER_REQUIRE_REAL_NODE=1 (CI) they
// fail instead.
package install

// Command kube-proxy is the upstream kube-proxy, built from the pinned
// k8s.io/kubernetes module for the project's test cluster's real node: it
// programs the Services' ClusterIPs (iptables mode), the in-cluster
// kubernetes Service among them.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-proxy/app"
)

func main() {
	os.Exit(cli.Run(app.NewProxyCommand()))
}

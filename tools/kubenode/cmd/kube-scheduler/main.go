// Command kube-scheduler is the upstream kube-scheduler, built from the
// pinned k8s.io/kubernetes module for the project's test cluster when it
// hosts in-cluster workloads (a Deployment's pods are placed by it, not by
// a test).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand()))
}

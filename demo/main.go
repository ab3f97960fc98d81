// Command reaper-demo is `make demo`, `make demo-kube` and `make
// demo-helm`: it shows reaper doing its job on this machine, for real, in a
// minute or a few.
//
// Without flags it runs the Lite edition: a throwaway PostgreSQL (unless
// REAPER_DSN names one), reaperd with a shortened ladder and the Lite
// runner, a run of tasks as local processes, and agents killed with kill -9
// — some with their task still running, some together with it (lite.go).
//
// With -kube it runs the Kubernetes edition: a local control plane (etcd,
// kube-apiserver, KWOK and kube-controller-manager, built from source and
// cached the first time), two reaperd replicas on a Kubernetes Lease with
// the kube runner, and pods, a node, an eviction, an agent and the leading
// reaperd taken away under a running run (kube.go). The pods run on a real
// node (a real kubelet, containerd and runc, realnode.go) where the
// machine can host one, and on a kubelet player that runs each pod's agent
// as a local process otherwise; -node kwok asks for the player, -node real
// for the real node or a failure saying why. Its first lines say which.
//
// With -helm it installs the kube edition the way a user does (helm.go):
// the image built by tools/image, the Helm chart installed with helm into a
// local cluster that hosts in-cluster workloads (kube-scheduler,
// kube-proxy, CoreDNS and the real node; a machine that cannot host the
// real node fails it saying why), PostgreSQL on the pod network's gateway,
// a run submitted with reaperctl, the leading replica's pod and a task pod
// deleted under it, then helm uninstall. Its first lines say what it
// installs and how; it prints each step as the command a user types.
//
// They show the decisions as they happen, a progress line and a summary
// computed from the board and the agents' own records. They leave nothing
// running and nothing behind; a demo killed half way is cleaned up by the
// next one.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
)

func main() {
	kube := flag.Bool("kube", false, "run the Kubernetes edition's demo (local API server, KWOK, the kube runner)")
	node := flag.String("node", nodeAuto, "with -kube, where the pods run: "+nodeAuto+" (the real node where this machine can host one, else the kubelet player), "+
		nodeReal+" (the real node, or fail) or "+nodePlayer+" (the kubelet player)")
	helm := flag.Bool("helm", false, "install the kube edition by its Helm chart from its image into a local cluster with a real node")
	version := flag.String("version", "dev", "with -helm, the image's version (its tag)")
	flag.Parse()
	switch *node {
	case nodeAuto, nodeReal, nodePlayer:
	default:
		os.Exit(fail(fmt.Errorf("-node %q: want %s, %s or %s", *node, nodeAuto, nodeReal, nodePlayer)))
	}
	exe, err := os.Executable()
	if err != nil {
		os.Exit(fail(err))
	}
	bin := filepath.Dir(exe) // reaperd, the plugins and the agent are built beside the demo
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var code int
	switch {
	case *helm:
		code = runHelm(ctx, helmDemo(bin, *version))
	case *kube:
		sc := kubeDemo(bin)
		sc.node = *node
		code = runKube(ctx, sc)
	default:
		code = runLite(ctx, bin)
	}
	stop()
	os.Exit(code)
}

func fail(err error) int {
	fmt.Fprintln(os.Stderr, "demo:", err)
	return 1
}

// Command kubecluster builds, starts and stops the project's Kubernetes test
// cluster (etcd, kube-apiserver, kube-controller-manager and KWOK, on
// loopback) for people and scripts; tests use package kubetest directly.
//
//	kubecluster build                      build the binaries into the user's cache, with progress
//	kubecluster up [-dir DIR] [-nodes N]   start a cluster that outlives the command and print
//	               [-no-controller-manager] KUBECONFIG=<path> (an admin kubeconfig); -node real
//	               [-node kwok|real]        adds a real node (kubelet, containerd, runc)
//	                                       and what in-cluster workloads need
//	                                       (kube-scheduler, kube-proxy, CoreDNS)
//	kubecluster down [-dir DIR]            stop that cluster and remove DIR
//
// The Makefile's kube-build, kube-up and kube-down run these.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/dexaflow/reaper/testkit/kubetest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

const usage = "usage: kubecluster build | up [-dir DIR] [-nodes N] [-no-controller-manager] [-node kwok|real] | down [-dir DIR]"

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	fs := flag.NewFlagSet("kubecluster "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", defaultDir(), "the cluster's directory")
	switch args[0] {
	case "build":
		if err := fs.Parse(args[1:]); err != nil {
			return 2
		}
		bins, err := kubetest.Build(ctx, kubetest.BuildOptions{Progress: stderr})
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		fmt.Fprintf(stderr, "kubecluster: binaries in %s\n", bins.Dir)
		node, err := kubetest.BuildNode(ctx, kubetest.BuildOptions{Progress: stderr})
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		fmt.Fprintf(stderr, "kubecluster: real node binaries in %s\n", node.Dir)
		return 0
	case "up":
		nodes := fs.Int("nodes", 1, "KWOK nodes to create (kwok-node-1, ...)")
		noKCM := fs.Bool("no-controller-manager", false, "leave kube-controller-manager out")
		node := fs.String("node", "kwok", "kwok, or real: a real node (kubelet, containerd, runc) beside the KWOK nodes")
		if err := fs.Parse(args[1:]); err != nil {
			return 2
		}
		if *node != "kwok" && *node != "real" {
			fmt.Fprintf(stderr, "kubecluster: -node %q: want kwok or real\n", *node)
			return 2
		}
		return up(ctx, *dir, *nodes, *noKCM, *node == "real", stdout, stderr)
	case "down":
		if err := fs.Parse(args[1:]); err != nil {
			return 2
		}
		if _, err := os.Stat(*dir); os.IsNotExist(err) {
			fmt.Fprintf(stderr, "kubecluster: no cluster in %s\n", *dir)
			return 0
		}
		if err := kubetest.StopDir(*dir); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		fmt.Fprintf(stderr, "kubecluster: stopped, %s removed\n", *dir)
		return 0
	default:
		fmt.Fprintln(stderr, usage)
		return 2
	}
}

func up(ctx context.Context, dir string, nodes int, noKCM, real bool, stdout, stderr io.Writer) int {
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if _, err := os.Stat(dir); err == nil {
		fmt.Fprintf(stderr, "kubecluster: %s exists: a cluster may be running (stop it with make kube-down)\n", dir)
		if _, err := os.Stat(kubeconfig); err == nil {
			fmt.Fprintf(stdout, "KUBECONFIG=%s\n", kubeconfig)
		}
		return 1
	}
	c, err := kubetest.Start(ctx, kubetest.Options{
		Dir:                 dir,
		Detached:            true,
		NoControllerManager: noKCM,
		RealNode:            real,
		InCluster:           real,
		Build:               kubetest.BuildOptions{Progress: stderr},
	})
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	var names []string
	for i := 1; i <= nodes; i++ {
		name := fmt.Sprintf("kwok-node-%d", i)
		if _, err := c.CreateNode(ctx, name); err != nil {
			fmt.Fprintln(stderr, err)
			_ = c.Stop()
			return 1
		}
		names = append(names, name)
	}
	parts := "etcd, kube-apiserver " + kubetest.KubernetesVersion + ", kwok"
	if c.HasControllerManager() {
		parts += ", kube-controller-manager"
	}
	fmt.Fprintf(stderr, "kubecluster: running at %s (%s); KWOK nodes: %s\n", c.Host(), parts, strings.Join(names, " "))
	if real {
		if n, why := c.RealNode(); n != nil {
			fmt.Fprintf(stderr, "kubecluster: real node %s Ready in %s (kubelet %s, containerd and runc of the machine); pod network %s/16 on bridge %s\n",
				n.Name, n.Ready.Round(time.Millisecond), kubetest.KubernetesVersion, kubetest.NodeGateway, kubetest.NodeBridge)
			fmt.Fprintf(stderr, "kubecluster: in-cluster workloads: kube-scheduler, kube-proxy (iptables, Services in %s), cluster DNS %s on %s; the API server listens on %s\n",
				kubetest.ServiceRange, kubetest.ClusterDomain, kubetest.NodeGateway, c.Host())
		} else {
			fmt.Fprintf(stderr, "kubecluster: no real node: %s\n", why)
		}
	} else {
		fmt.Fprintf(stderr, "kubecluster: no scheduler: give pods spec.nodeName.\n")
	}
	fmt.Fprintf(stderr, "kubecluster: logs in %s/logs. Stop with: make kube-down\n", dir)
	fmt.Fprintf(stdout, "KUBECONFIG=%s\n", kubeconfig)
	return 0
}

// defaultDir is one fixed place per user, so that kube-down finds what
// kube-up made.
func defaultDir() string {
	return filepath.Join(os.TempDir(), fmt.Sprintf("reaper-kube-%d", os.Getuid()))
}

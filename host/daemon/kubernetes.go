package daemon

import (
	"errors"
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dexaflow/reaper/host/config"
	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/host/leader/kubelease"
)

// leaderLease is the lease the leader block names: the board's row alone,
// or a Kubernetes Lease in front of it.
func (d *Daemon) leaderLease() (leader.Lease, error) {
	board := leaseStore{d.store}
	switch d.cfg.Leader.Kind {
	case config.LeaderPostgres:
		return board, nil
	case config.LeaderKubernetes:
		client, err := kubeClient(d.cfg.Leader.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("leader %q: %w", config.LeaderKubernetes, err)
		}
		return kubelease.New(kubelease.Config{Namespace: d.cfg.Leader.Namespace, Name: d.cfg.Leader.Name, Client: client}, board)
	default:
		return nil, fmt.Errorf("leader %q has no elector in this build", d.cfg.Leader.Kind)
	}
}

// kubeClient reaches the API server through the kubeconfig file at path,
// or, when path is empty, through the pod's service account.
func kubeClient(path string) (kubernetes.Interface, error) {
	var (
		rc  *rest.Config
		err error
	)
	if path == "" {
		rc, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			return nil, errors.New("no kubeconfig set and not running in a pod: set kubeconfig in the leader block")
		}
	} else {
		rc, err = clientcmd.BuildConfigFromFlags("", path)
	}
	if err != nil {
		return nil, fmt.Errorf("loading the API server's configuration: %w", err)
	}
	rc.UserAgent = "reaperd-leader"
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("building the API client: %w", err)
	}
	return client, nil
}

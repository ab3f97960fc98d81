package daemon

import (
	"errors"
	"fmt"

	"github.com/dexaflow/reaper/host/config"
	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/host/leader/kubelease"
	"github.com/dexaflow/reaper/substrate/kube"
)

// leaderLease is the lease the leader block names: the board's row alone,
// or a Kubernetes Lease in front of it.
func (d *Daemon) leaderLease() (leader.Lease, error) {
	board := leaseStore{d.store}
	switch d.cfg.Leader.Kind {
	case config.LeaderPostgres:
		return board, nil
	case config.LeaderKubernetes:
		client, err := kube.NewClient(d.cfg.Leader.Kubeconfig, "reaperd-leader", 0, 0)
		if errors.Is(err, kube.ErrNotInCluster) {
			err = fmt.Errorf("%w: set kubeconfig in the leader block", err)
		}
		if err != nil {
			return nil, fmt.Errorf("leader %q: %w", config.LeaderKubernetes, err)
		}
		return kubelease.New(kubelease.Config{Namespace: d.cfg.Leader.Namespace, Name: d.cfg.Leader.Name, Client: client}, board)
	default:
		return nil, fmt.Errorf("leader %q has no elector in this build", d.cfg.Leader.Kind)
	}
}

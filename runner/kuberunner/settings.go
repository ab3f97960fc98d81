package kuberunner

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/runner/kuberunner/kubesettings"
	"github.com/dexaflow/reaper/substrate/kube"
)

// Settings is the runner's kube block as an operator writes it in reaperd's
// configuration (kubesettings.Settings: the block, its defaults and its
// rules live there, apart from any Kubernetes client, so that reading a
// configuration file links none). FromSettings makes a runner of it.
type Settings = kubesettings.Settings

// WarmPoolSettings is the kube block's warm_pool block (see WarmPool).
type WarmPoolSettings = kubesettings.WarmPool

// FromSettings builds the runner of a kube block over w: its API client
// (base.Client when set, else one from s.Kubeconfig at the kube
// substrate's default rate, not client-go's 5 requests a second, which
// would hold dispatch to 5 pods a second), the task container's resources,
// the pods' hardening, the warm pool, and the credentials the task pods
// and workers are given, minted by issuer (reaching the API at
// s.AttemptAPI when it is set). base holds what the block does not say:
// the tick, the caps, the ladder, the leadership, the callbacks, the clock
// and the logger.
func FromSettings(s Settings, issuer attempttoken.Issuer, base Config, w *lifecycle.Writer) (*Runner, error) {
	cfg := base
	if cfg.Client == nil {
		client, err := kube.NewClient(s.Kubeconfig, "reaperd-runner", kube.QPSDefault, kube.BurstDefault)
		if err != nil {
			return nil, fmt.Errorf("kube runner: %w", err)
		}
		cfg.Client = client
		if cfg.LookClient == nil {
			// The look before each create (ghost.go) on a rate of its own.
			look, err := kube.NewClient(s.Kubeconfig, "reaperd-runner-look", kube.QPSDefault, kube.BurstDefault)
			if err != nil {
				return nil, fmt.Errorf("kube runner: %w", err)
			}
			cfg.LookClient = look
		}
	}
	var err error
	if cfg.Resources, err = resources(s.Requests, s.Limits); err != nil {
		return nil, fmt.Errorf("kube runner: %w", err)
	}
	if s.AttemptAPI != "" {
		issuer.API = s.AttemptAPI
	}
	cfg.Namespace, cfg.Image, cfg.AgentPath, cfg.ServiceAccount = s.Namespace, s.Image, s.Agent, s.ServiceAccount
	cfg.TokenAudience = s.PodTokenAudience
	cfg.PullPolicy = corev1.PullPolicy(s.PullPolicy)
	cfg.TerminationGrace = s.TerminationGrace
	cfg.DispatchBuffer, cfg.DispatchWorkers = s.DispatchBuffer, s.DispatchWorkers
	cfg.Hardening = Hardening{RunAsUser: s.RunAsUser, RunAsGroup: s.RunAsGroup, WritableRoot: !s.ReadOnlyRoot}
	// Each mint is recorded through the runner's own writer, fenced by the
	// cycle's term like its other writes.
	cfg.Credentials = MintedCredentials{Minter: issuer}
	if wp := s.WarmPool; wp != nil {
		// Workers claim with a worker credential from the same issuer.
		cfg.WarmPool = &WarmPool{Name: wp.Name, Size: wp.Size, Slots: wp.Slots, Poll: wp.Poll, Refill: wp.Refill,
			Credentials: MintedWorkerCredentials{Minter: issuer}}
	}
	return New(cfg, w)
}

// resources is the task container's resources of the block's quantities.
func resources(requests, limits map[string]string) (corev1.ResourceRequirements, error) {
	res := corev1.ResourceRequirements{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}
	for _, set := range []struct {
		kind string
		from map[string]string
		into corev1.ResourceList
	}{{"request", requests, res.Requests}, {"limit", limits, res.Limits}} {
		for name, q := range set.from {
			v, err := resource.ParseQuantity(q)
			if err != nil {
				return res, fmt.Errorf("the task container's %s %s %q: %w", name, set.kind, q, err)
			}
			set.into[corev1.ResourceName(name)] = v
		}
	}
	return res, nil
}

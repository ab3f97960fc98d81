package kuberunner

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/substrate/kube"
)

// Settings is the runner's kube block as an operator writes it in reaperd's
// configuration (host/config decodes and checks it): the task pods'
// template and where they go. FromSettings makes a runner of it.
type Settings struct {
	// Namespace of the task pods: the kube substrate's, so that its
	// informer, teardown and sweep see them.
	Namespace string
	// Kubeconfig is the kube substrate's kubeconfig ("": the in-cluster
	// service account).
	Kubeconfig string
	// Image is the task image (it holds the agent). Required.
	Image string
	// Agent is the agent binary inside the image; "": AgentPathDefault.
	Agent string
	// ServiceAccount of the pods, in Namespace: the task ServiceAccount,
	// bound to no role; "": ServiceAccountDefault.
	ServiceAccount string
	// PodTokenAudience is the audience of the pods' projected token, which
	// the attempt API reviews; "": TokenAudienceDefault.
	PodTokenAudience string
	// PullPolicy is "", "Always", "IfNotPresent" or "Never".
	PullPolicy string
	// TerminationGrace is terminationGracePeriodSeconds; 0: the ladder's
	// task_termination_grace.
	TerminationGrace time.Duration
	// AttemptAPI is the attempt API's base URL as the task pods reach it
	// (https://host:port, e.g. a Service name the certificate covers); "":
	// the issuer's (attempt_api.advertise, else the API's bound address).
	AttemptAPI string
	// RunAsUser and RunAsGroup are the uid and gid the runner's pods run
	// as (task pods and warm workers): never root.
	RunAsUser, RunAsGroup int64
	// ReadOnlyRoot: the pods' root filesystem is read-only (false for an
	// image whose tasks write outside /tmp).
	ReadOnlyRoot bool
	// Requests and Limits of the task container, by resource name (cpu,
	// memory, ephemeral-storage), as Kubernetes quantities ("500m", "1Gi").
	Requests, Limits map[string]string
	// DispatchBuffer and DispatchWorkers are dispatch_buffer and
	// dispatch_workers: the buffer between the tick and the dispatch
	// workers (0: the tick creates the pods) and the workers serving it
	// (see Config.DispatchBuffer).
	DispatchBuffer, DispatchWorkers int
	// WarmPool is the kube block's warm_pool block; nil: no pool.
	WarmPool *WarmPoolSettings
}

// WarmPoolSettings is the kube block's warm_pool block (see WarmPool).
type WarmPoolSettings struct {
	Name   string        // the pool's name; "": WarmPoolNameDefault
	Size   int           // how many worker pods are kept; at least 1
	Slots  int           // attempts a worker runs at once; 0: WarmSlotsDefault
	Poll   time.Duration // how often a worker claims; 0: WarmPollDefault
	Refill time.Duration // how often the pool is refilled; 0: WarmRefillDefault
}

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

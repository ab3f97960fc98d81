// Package kubesettings is the kube runner's block of reaperd's
// configuration (runner { kube { ... } }): the block as an operator writes
// it (Block, WarmPoolBlock, tagged for sdk.SchemaOf), its defaults, the
// rules each value is held to, and the Settings the runner is built from
// (kuberunner.FromSettings).
//
// It imports no Kubernetes client, so that what reads a configuration file
// (host/config, and through it reaperctl) does not link one.
package kubesettings

import (
	"fmt"
	"math"
	"net/url"
	"regexp"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/dexaflow/reaper/internal/settingrule"
)

const (
	// RunAsDefault is run_as_user and run_as_group: the non-root uid and
	// gid of the runner's pods.
	RunAsDefault = 65532
	// NamespaceDefault is the task pods' namespace when neither the kube
	// block nor the kube substrate names one (the substrate's own default).
	NamespaceDefault = "default"
	// DispatchWorkersDefault is how many dispatch workers serve a dispatch
	// buffer (DispatchBuffer above 0) when DispatchWorkers is 0.
	DispatchWorkersDefault = 4
	// DispatchWorkersMax bounds DispatchWorkers: each worker holds a pod
	// create in flight, and the client's own rate limit is shared by all.
	DispatchWorkersMax = 256
)

// Settings is the runner's kube block as an operator writes it in reaperd's
// configuration (decoded by host/config, checked by Block.Settings): the
// task pods' template and where they go. kuberunner.FromSettings makes a
// runner of it.
type Settings struct {
	// Namespace of the task pods: the kube substrate's, so that its
	// informer, teardown and sweep see them.
	Namespace string
	// Kubeconfig is the kube substrate's kubeconfig ("": the in-cluster
	// service account).
	Kubeconfig string
	// Image is the task image (it holds the agent). Required.
	Image string
	// Agent is the agent binary inside the image; "": the kube runner's
	// AgentPathDefault.
	Agent string
	// ServiceAccount of the pods, in Namespace: the task ServiceAccount,
	// bound to no role; "": the kube runner's ServiceAccountDefault.
	ServiceAccount string
	// PodTokenAudience is the audience of the pods' projected token, which
	// the attempt API reviews; "": the kube runner's TokenAudienceDefault.
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
	// (see kuberunner.Config.DispatchBuffer).
	DispatchBuffer, DispatchWorkers int
	// WarmPool is the kube block's warm_pool block; nil: no pool.
	WarmPool *WarmPool
}

// WarmPool is the kube block's warm_pool block (see kuberunner.WarmPool).
type WarmPool struct {
	Name   string        // the pool's name; "": the kube runner's WarmPoolNameDefault
	Size   int           // how many worker pods are kept; at least 1
	Slots  int           // attempts a worker runs at once; 0: WarmSlotsDefault
	Poll   time.Duration // how often a worker claims; 0: WarmPollDefault
	Refill time.Duration // how often the pool is refilled; 0: WarmRefillDefault
}

// Block is the kube block as written (its warm_pool block apart). Numbers
// are read as numbers, not ints, so that Settings words the refusal of -1
// or 1.5 itself.
type Block struct {
	Namespace        string        `reaper:"namespace"`
	Image            string        `reaper:"image,required"`
	Agent            string        `reaper:"agent"`
	ServiceAccount   string        `reaper:"service_account"`
	PodTokenAudience string        `reaper:"pod_token_audience"`
	PullPolicy       string        `reaper:"image_pull_policy"`
	TerminationGrace time.Duration `reaper:"termination_grace"`
	CPURequest       string        `reaper:"cpu_request"`
	MemoryRequest    string        `reaper:"memory_request"`
	CPULimit         string        `reaper:"cpu_limit"`
	MemoryLimit      string        `reaper:"memory_limit"`
	AttemptAPI       string        `reaper:"attempt_api"`
	RunAsUser        float64       `reaper:"run_as_user"`
	RunAsGroup       float64       `reaper:"run_as_group"`
	ReadOnlyRoot     bool          `reaper:"read_only_root_filesystem"`
	DispatchBuffer   float64       `reaper:"dispatch_buffer"`
	DispatchWorkers  float64       `reaper:"dispatch_workers"`
}

// DefaultBlock is the kube block's defaults: what a block that leaves a
// key out has.
func DefaultBlock() Block {
	return Block{RunAsUser: RunAsDefault, RunAsGroup: RunAsDefault, ReadOnlyRoot: true}
}

// Settings holds the block to its rules: the settings it makes (Kubeconfig
// and, when the block names none, Namespace are the kube substrate's, for
// the caller to fill; WarmPool is the warm_pool block's), and each value
// refused, in the order of the block's rules.
func (b Block) Settings() (Settings, []settingrule.Problem) {
	s := Settings{
		Namespace: b.Namespace, Image: b.Image, Agent: b.Agent,
		ServiceAccount: b.ServiceAccount, PodTokenAudience: b.PodTokenAudience, PullPolicy: b.PullPolicy,
		AttemptAPI: b.AttemptAPI, Requests: map[string]string{}, Limits: map[string]string{},
		TerminationGrace: b.TerminationGrace, ReadOnlyRoot: b.ReadOnlyRoot,
	}
	var problems []settingrule.Problem
	bad := func(key, detail string) { problems = append(problems, settingrule.At(key, detail)) }
	for _, id := range []struct {
		key  string
		n    float64
		into *int64
	}{{"run_as_user", b.RunAsUser, &s.RunAsUser}, {"run_as_group", b.RunAsGroup, &s.RunAsGroup}} {
		if n := id.n; n < 1 || n > math.MaxInt32 || n != float64(int64(n)) {
			bad(id.key, id.key+" must be a whole number from 1 to 2147483647: the runner's pods never run as root.")
			continue
		}
		*id.into = int64(id.n)
	}
	if n := b.DispatchBuffer; n < 0 || n != float64(int(n)) {
		bad("dispatch_buffer", "dispatch_buffer must be a whole number, 0 (the tick creates the pods) or more.")
	} else {
		s.DispatchBuffer = int(n)
	}
	if n := b.DispatchWorkers; n < 0 || n > DispatchWorkersMax || n != float64(int(n)) {
		bad("dispatch_workers", fmt.Sprintf("dispatch_workers must be a whole number from 1 to %d (0 or absent: %d).",
			DispatchWorkersMax, DispatchWorkersDefault))
	} else if s.DispatchWorkers = int(n); n > 0 && b.DispatchBuffer == 0 {
		bad("dispatch_workers", "dispatch_workers serve the dispatch buffer: set dispatch_buffer above 0 too.")
	}
	switch s.PullPolicy {
	case "", "Always", "IfNotPresent", "Never":
	default:
		bad("image_pull_policy", `image_pull_policy must be "Always", "IfNotPresent" or "Never".`)
	}
	if s.TerminationGrace < 0 {
		bad("termination_grace", "termination_grace must not be negative.")
	}
	if s.AttemptAPI != "" {
		if u, err := url.Parse(s.AttemptAPI); err != nil || u.Scheme != "https" || u.Host == "" {
			bad("attempt_api", `attempt_api must be the API's https base URL as the pods reach it ("https://reaper.example:9465").`)
		}
	}
	for _, q := range []struct {
		key, value, resource string
		into                 map[string]string
	}{
		{"cpu_request", b.CPURequest, "cpu", s.Requests}, {"memory_request", b.MemoryRequest, "memory", s.Requests},
		{"cpu_limit", b.CPULimit, "cpu", s.Limits}, {"memory_limit", b.MemoryLimit, "memory", s.Limits},
	} {
		if q.value == "" {
			continue
		}
		if _, err := resource.ParseQuantity(q.value); err != nil {
			bad(q.key, fmt.Sprintf("%s must be a Kubernetes quantity (\"500m\", \"1Gi\"): %v.", q.key, err))
			continue
		}
		q.into[q.resource] = q.value
	}
	return s, problems
}

// WarmPoolBlock is the kube block's warm_pool block as written.
type WarmPoolBlock struct {
	Name   string        `reaper:"name"`
	Size   float64       `reaper:"size,required"`
	Slots  float64       `reaper:"slots"`
	Poll   time.Duration `reaper:"poll"`
	Refill time.Duration `reaper:"refill"`
}

// warmPoolName is what a pool's name may be: a label value the worker pod
// names can carry.
var warmPoolName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,28}[a-z0-9])?$`)

// WarmPool holds the block to its rules. sizeGiven is whether the block
// sets size (a block without it is refused for that alone, by its
// decoder, and not again here).
func (b WarmPoolBlock) WarmPool(sizeGiven bool) (*WarmPool, []settingrule.Problem) {
	wp := &WarmPool{Name: b.Name, Poll: b.Poll, Refill: b.Refill}
	var problems []settingrule.Problem
	bad := func(key, detail string) { problems = append(problems, settingrule.At(key, detail)) }
	if n := b.Size; n >= 1 && n == float64(int(n)) {
		wp.Size = int(n)
	} else if sizeGiven {
		bad("size", "size must be a whole number, 1 or more.")
	}
	if n := b.Slots; n < 0 || n != float64(int(n)) {
		bad("slots", "slots must be a whole number, 0 (the default, 1) or more.")
	} else {
		wp.Slots = int(n)
	}
	if wp.Name != "" && !warmPoolName.MatchString(wp.Name) {
		bad("name", "name must be 1 to 30 lowercase letters, digits or dashes, starting and ending with a letter or digit.")
	}
	if wp.Poll < 0 {
		bad("poll", "poll must not be negative.")
	}
	if wp.Refill < 0 {
		bad("refill", "refill must not be negative.")
	}
	return wp, problems
}

package kuberunner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/cyclemeter"
	"github.com/dexaflow/reaper/runner/kuberunner/kubesettings"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// Defaults of Config.
const (
	// IntervalDefault is how often Run runs a cycle: the scheduler's tick.
	IntervalDefault = time.Second
	// DispatchUnavailableWindowDefault is how long a task whose pod create
	// fails as unavailable is offered again, from its first such failure,
	// before it fails as dispatch_failed.
	DispatchUnavailableWindowDefault = 15 * time.Minute
	// CreateTimeoutDefault bounds one pod create; a create that runs out of
	// it counts as unavailable.
	CreateTimeoutDefault = 30 * time.Second
	// AgentPathDefault is the agent binary inside the task image.
	AgentPathDefault = "reaper-agent"
	// DispatchWorkersDefault is how many dispatch workers serve a dispatch
	// buffer (DispatchBuffer above 0) when DispatchWorkers is 0.
	DispatchWorkersDefault = kubesettings.DispatchWorkersDefault
	// DispatchWorkersMax bounds DispatchWorkers: each worker holds a pod
	// create in flight, and the client's own rate limit is shared by all.
	DispatchWorkersMax = kubesettings.DispatchWorkersMax
)

// DispatchObserver is told what the dispatch buffer does (host/metrics
// meters it). Its methods are called from the tick and the workers at
// once: an implementation must be safe for concurrent use.
type DispatchObserver interface {
	// DispatchBuffered reports that the number of attempts waiting in the
	// buffer (handed off by the tick, not yet taken by a worker) changed
	// by delta (+1, -1): a gauge adds it, so that changes reported from
	// the tick and the workers at once never leave it stale.
	DispatchBuffered(delta int)
	// DispatchBufferFull reports that the tick found the buffer full and
	// waited for a worker to take an attempt.
	DispatchBufferFull()
}

// noDispatchObserver observes nothing.
type noDispatchObserver struct{}

func (noDispatchObserver) DispatchBuffered(int) {}
func (noDispatchObserver) DispatchBufferFull()  {}

// Credentials gives a task pod its attempt's credential. The runner calls
// it once per dispatch, after the attempt is queued and before the pod is
// created, and adds what it returns to the task container's environment.
// An error is a dispatch failure judged as passing: the task is offered
// again on a new epoch, within the dispatch-unavailable window.
type Credentials interface {
	Env(ctx context.Context, a sdk.Attempt, now time.Time) ([]corev1.EnvVar, error)
}

// NoCredentials gives a pod no credential (until the attempt API mints
// them).
type NoCredentials struct{}

// Env returns nothing.
func (NoCredentials) Env(context.Context, sdk.Attempt, time.Time) ([]corev1.EnvVar, error) {
	return nil, nil
}

// Meter is told what each cycle of the runner measured (host/metrics is
// one), as the attempt API meters its calls.
type Meter = cyclemeter.Meter

// Config configures a Runner. Zero values take the defaults (withDefaults).
type Config struct {
	// Client creates the task pods. Required.
	Client kubernetes.Interface
	// LookClient lists, before each create, the live pods of the attempt
	// the board does not know, and deletes them (ghost.go). Default:
	// Client. FromSettings gives it a client of its own, so that the look
	// takes nothing from the rate of the creates.
	LookClient kubernetes.Interface
	// Namespace of the task pods. Required: the substrate's namespace, so
	// that its informer, teardown and sweep see them.
	Namespace string
	// Image is the task pods' image: it holds the agent and what the tasks
	// run. Required.
	Image string
	// AgentPath is the agent binary in the image. Default AgentPathDefault.
	AgentPath string
	// ServiceAccount of the runner's pods (task pods and warm workers), in
	// Namespace: the task ServiceAccount, bound to no role. Default
	// ServiceAccountDefault.
	ServiceAccount string
	// TokenAudience is the audience of the pods' projected token, which
	// their agents present to the attempt API. Default
	// TokenAudienceDefault.
	TokenAudience string
	// Resources of the task container.
	Resources corev1.ResourceRequirements
	// PullPolicy of the task container's image; "": the API server's default.
	PullPolicy corev1.PullPolicy
	// Hardening is the security context of every pod the runner makes:
	// non-root as RunAsUser/RunAsGroup (default RunAsDefault), read-only
	// root unless WritableRoot.
	Hardening Hardening
	// TerminationGrace is the task pods' terminationGracePeriodSeconds.
	// Default: Ladder.TaskTerminationGrace.
	TerminationGrace time.Duration
	// Credentials gives each pod its attempt's credential. Default
	// NoCredentials.
	Credentials Credentials
	// Heartbeat is the agents' heartbeat interval. Default: Ladder.Heartbeat.
	Heartbeat time.Duration
	// Pools are the pools' slots, by name: a task instance starts only into
	// open slots of its pool. A pool named nowhere has none, but for the
	// default pool (lifecycle.DefaultPool), unbounded unless named. Nil or
	// empty: every pool is unbounded.
	Pools map[string]int
	// Recovery is the recovery budget: every recovery dispatch (a retry,
	// an infra re-place, any later execution of a task that ran) spends a
	// token of its pool's, and one the budget refuses waits scheduled for
	// a later cycle. The zero value: unbounded.
	Recovery lifecycle.RecoveryBudget
	// MaxActiveRuns is the run start cap (see the Lite runner); 0: no cap.
	MaxActiveRuns int
	// MaxParallel bounds the kube attempts queued plus running; 0: none.
	MaxParallel int
	// DispatchUnavailableWindow: see DispatchUnavailableWindowDefault.
	DispatchUnavailableWindow time.Duration
	// CreateTimeout bounds one pod create. Default CreateTimeoutDefault.
	CreateTimeout time.Duration
	// DispatchBuffer, above 0, is the size of the queue between the tick
	// and the dispatch workers (the specification's
	// scheduler.dispatch.buffer_size): the tick hands each scheduled
	// attempt to it, DispatchWorkers goroutines take them and dispatch
	// them (queue, credential, pod create, and the same settling of every
	// create error as on the tick), and a full buffer makes the tick wait.
	// 0, the default: the tick dispatches every attempt itself, one at a
	// time. See dispatchbuf.go.
	DispatchBuffer int
	// DispatchWorkers serve the buffer; 0: DispatchWorkersDefault. Only
	// with DispatchBuffer above 0.
	DispatchWorkers int
	// DispatchObserver is told the buffer's depth and the tick's waits on
	// a full buffer. Default: nothing is told.
	DispatchObserver DispatchObserver
	// Interval is Run's period. Default IntervalDefault.
	Interval time.Duration
	// Ladder gives the thresholds: the infra confirmation valve, the
	// dispatch-lost threshold and the credential ceiling (the pod
	// deadline), the heartbeat. Default ladder.Defaults().
	Ladder ladder.Ladder
	// WarmPool, when set, runs a warm pool of worker pods for the attempts
	// of executor warm (see warm.go); nil: the runner leaves warm attempts
	// alone.
	WarmPool *WarmPool
	// Customize, when set, is applied to every pod the runner builds (task
	// pods and warm workers) before it is created: an embedder adds node
	// selectors or tolerations; a test places the pods on its node.
	Customize func(*corev1.Pod)
	// Leading is the host's leadership at now: the term that fences the
	// cycle's writes, and whether this replica leads. Run needs it; RunOnce
	// does not.
	Leading func(now time.Time) (term int64, leading bool)
	// Meter is told what every cycle Run runs measured (host/metrics is
	// one). Default: nothing is told.
	Meter Meter
	// OnResult, when set, receives the result of every cycle Run runs,
	// after Meter.
	OnResult func(Result)
	// OnRefill, when set, receives the result of every warm pool refill.
	OnRefill func(RefillResult, error)
	// Clock is the only time the runner reads. Default clock.Real{}.
	Clock clock.Clock
	// Logger logs what changed. Default: a null logger.
	Logger hclog.Logger
}

// withDefaults fills in every default and validates the result.
func (c Config) withDefaults() (Config, error) {
	c.fillDefaults()
	errs := c.check()
	if c.WarmPool != nil {
		p, err := c.WarmPool.withDefaults(c.Ladder.DispatchLost)
		if err != nil {
			errs = append(errs, err)
		}
		c.WarmPool = &p
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, fmt.Errorf("kube runner: %w", err)
	}
	return c, nil
}

// fillDefaults sets every field left zero to its default.
func (c *Config) fillDefaults() {
	if c.Ladder == (ladder.Ladder{}) {
		c.Ladder = ladder.Defaults()
	}
	if c.AgentPath == "" {
		c.AgentPath = AgentPathDefault
	}
	if c.ServiceAccount == "" {
		c.ServiceAccount = ServiceAccountDefault
	}
	if c.TokenAudience == "" {
		c.TokenAudience = TokenAudienceDefault
	}
	if c.Hardening.RunAsUser == 0 {
		c.Hardening.RunAsUser = RunAsDefault
	}
	if c.Hardening.RunAsGroup == 0 {
		c.Hardening.RunAsGroup = RunAsDefault
	}
	if c.TerminationGrace == 0 {
		c.TerminationGrace = c.Ladder.TaskTerminationGrace
	}
	if c.Credentials == nil {
		c.Credentials = NoCredentials{}
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = c.Ladder.Heartbeat
	}
	if c.DispatchUnavailableWindow == 0 {
		c.DispatchUnavailableWindow = DispatchUnavailableWindowDefault
	}
	if c.CreateTimeout == 0 {
		c.CreateTimeout = CreateTimeoutDefault
	}
	if c.Interval == 0 {
		c.Interval = IntervalDefault
	}
	if c.DispatchBuffer > 0 && c.DispatchWorkers == 0 {
		c.DispatchWorkers = DispatchWorkersDefault
	}
	if c.DispatchObserver == nil {
		c.DispatchObserver = noDispatchObserver{}
	}
	if c.Meter == nil {
		c.Meter = cyclemeter.None{}
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.LookClient == nil {
		c.LookClient = c.Client
	}
}

// check lists what is wrong with the configuration, defaults filled in
// (its warm pool apart).
func (c *Config) check() []error {
	var errs []error
	if c.Client == nil {
		errs = append(errs, errors.New("no Kubernetes client"))
	}
	if c.Namespace == "" {
		errs = append(errs, errors.New("no namespace"))
	}
	if c.Image == "" {
		errs = append(errs, errors.New("no image"))
	}
	if c.MaxActiveRuns < 0 {
		errs = append(errs, fmt.Errorf("max_active_runs %d: must be 0 (no cap) or more", c.MaxActiveRuns))
	}
	if c.MaxParallel < 0 {
		errs = append(errs, fmt.Errorf("max_parallel %d: must be 0 (no bound) or more", c.MaxParallel))
	}
	if c.DispatchBuffer < 0 {
		errs = append(errs, fmt.Errorf("dispatch_buffer %d: must be 0 (the tick creates the pods) or more", c.DispatchBuffer))
	}
	switch {
	case c.DispatchWorkers < 0 || c.DispatchWorkers > DispatchWorkersMax:
		errs = append(errs, fmt.Errorf("dispatch_workers %d: must be from 1 to %d", c.DispatchWorkers, DispatchWorkersMax))
	case c.DispatchWorkers > 0 && c.DispatchBuffer <= 0:
		errs = append(errs, fmt.Errorf("dispatch_workers %d: the workers serve the dispatch buffer, and dispatch_buffer is 0", c.DispatchWorkers))
	}
	if c.TerminationGrace < 0 {
		errs = append(errs, fmt.Errorf("termination grace %s: must not be negative", c.TerminationGrace))
	}
	if c.Hardening.RunAsUser < 0 || c.Hardening.RunAsGroup < 0 {
		errs = append(errs, fmt.Errorf("pods' run-as user %d and group %d: must be positive (non-root)",
			c.Hardening.RunAsUser, c.Hardening.RunAsGroup))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"heartbeat", c.Heartbeat}, {"interval", c.Interval}, {"create timeout", c.CreateTimeout},
		{"infra_confirm_valve", c.Ladder.InfraConfirmValve}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s %s: must be positive", d.name, d.v))
		}
	}
	if c.DispatchUnavailableWindow < 0 {
		errs = append(errs, fmt.Errorf("dispatch unavailable window %s: must not be negative", c.DispatchUnavailableWindow))
	}
	return errs
}

package kube

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// Name is the label the substrate is configured under.
const Name = "kube"

// Defaults of the substrate's configuration.
const (
	NamespaceDefault = "default"
	// QPSDefault and BurstDefault bound the client's request rate. A
	// teardown costs one LIST and one PATCH (or DELETE), so a mass teardown
	// of 10,000 attempts takes about 400 s at 50 requests a second: minutes,
	// off the reapers' critical path (a reaper marks first, then tears down).
	QPSDefault   = 50
	BurstDefault = 100
	// WarmPoolSelectorDefault selects the warm pool's pods.
	WarmPoolSelectorDefault = LabelWarmPool
	// LabelWarmPool marks a warm pool pod (its value names the pool).
	LabelWarmPool = "leoflow.io/warm-pool"
	// CollectAfter is how long a finished, settled pod is kept before the
	// sweep deletes it.
	CollectAfter = 10 * time.Minute
	// FinalizerMaxAgeDefault bounds how long a task pod that has ended (it
	// finished, or it is being deleted) keeps the outcome record finalizer
	// when nothing else released it: the leak bound (finalizer.go).
	FinalizerMaxAgeDefault = 24 * time.Hour
	// MinFinalizerMaxAge is the least finalizer_max_age accepted: the leak
	// bound never undercuts the collection it backs up.
	MinFinalizerMaxAge = CollectAfter
)

// Config is the substrate "kube" block.
type Config struct {
	Namespace        string        `reaper:"namespace" help:"namespace of the task pods and of the warm pool"`
	Kubeconfig       string        `reaper:"kubeconfig" help:"path to a kubeconfig file; empty: the in-cluster service account"`
	QPS              float64       `reaper:"qps" help:"the client's sustained requests per second to the API server"`
	Burst            int           `reaper:"burst" help:"the client's burst of requests above qps"`
	WarmPoolSelector string        `reaper:"warm_pool_selector" help:"label selector of the warm pool's pods, read live by WarmWorkers"`
	Resync           time.Duration `reaper:"resync" help:"how often the presence informer replays its cache; \"0s\": never"`
	FinalizerMaxAge  time.Duration `reaper:"finalizer_max_age" help:"the leak bound: how long after a task pod ended (finished, or its deletion began) the sweep removes its outcome record finalizer if nothing else did"`
	Events           bool          `reaper:"events" help:"record a Kubernetes Event (events.k8s.io) on each task pod stopped, deleted or settled; false: none, and the Role needs no events rule"`
}

// DefaultConfig is the block's defaults.
func DefaultConfig() Config {
	return Config{Namespace: NamespaceDefault, QPS: QPSDefault, Burst: BurstDefault,
		WarmPoolSelector: WarmPoolSelectorDefault, FinalizerMaxAge: FinalizerMaxAgeDefault, Events: true}
}

// Validate checks the block.
func (c Config) Validate() error {
	if c.Namespace == "" {
		return errors.New(`attribute "namespace": must not be empty`)
	}
	if c.QPS <= 0 {
		return fmt.Errorf(`attribute "qps": must be positive, got %g`, c.QPS)
	}
	if c.Burst < 1 {
		return fmt.Errorf(`attribute "burst": must be at least 1, got %d`, c.Burst)
	}
	if c.Resync < 0 {
		return fmt.Errorf(`attribute "resync": must not be negative, got %s`, c.Resync)
	}
	if _, err := labels.Parse(c.WarmPoolSelector); err != nil {
		return fmt.Errorf(`attribute "warm_pool_selector": %w`, err)
	}
	if c.FinalizerMaxAge < MinFinalizerMaxAge {
		return fmt.Errorf(`attribute "finalizer_max_age": must be at least %s, got %s`, MinFinalizerMaxAge, c.FinalizerMaxAge)
	}
	return nil
}

// Options are what a program embedding the substrate (a test, a benchmark)
// may give it instead of a kubeconfig.
type Options struct {
	// RestConfig, when set, is used instead of the block's kubeconfig (its
	// QPS and Burst are still the block's).
	RestConfig *rest.Config
	// Client, when set, is used as is (client-go's fake clientset, in
	// unit tests of pure policy).
	Client kubernetes.Interface
	// Clock is the substrate's clock; default the wall clock.
	Clock clock.Clock
}

// Substrate is the Kubernetes substrate. It is safe for concurrent use.
type Substrate struct {
	log  hclog.Logger
	opts Options

	mu  sync.RWMutex
	run *running // nil until Configure
}

// running is a configured substrate: its client and its presence cache.
type running struct {
	cfg      Config
	client   kubernetes.Interface
	warm     labels.Selector
	presence *presence
	// foreign: the pods seen carrying an attempt's labels under another
	// UID than the attempt records (foreign.go).
	foreign *foreignPods
	// events records the Kubernetes Events (events.go); nil when off.
	events *eventer
}

// stop stops what the configuration started: the presence informer and
// the Events broadcaster.
func (r *running) stop() {
	r.presence.stop()
	r.events.stop()
}

var _ sdk.Substrate = (*Substrate)(nil)

// New returns an unconfigured substrate (plugin.Serve's constructor).
func New(logger hclog.Logger) *Substrate { return NewWithOptions(logger, Options{}) }

// NewWithOptions returns an unconfigured substrate with opts.
func NewWithOptions(logger hclog.Logger, opts Options) *Substrate {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	return &Substrate{log: logger, opts: opts}
}

// Info describes the plugin.
func (s *Substrate) Info(context.Context) (sdk.Info, error) {
	return sdk.Info{Name: Name, Kind: sdk.KindSubstrate, Version: sdk.BuildVersion,
		Editions:    []string{ladder.EditionKube},
		Description: "task pods on Kubernetes: informer presence, pinned teardown, the reconcile sweep"}, nil
}

// ConfigSchema declares the block's attributes.
func (s *Substrate) ConfigSchema(context.Context) (sdk.Schema, error) {
	return sdk.SchemaOf(DefaultConfig()), nil
}

// Configure decodes the block, builds the client and starts the presence
// informer. A second call replaces the first configuration, stopping its
// informer.
func (s *Substrate) Configure(ctx context.Context, req sdk.ConfigureRequest) error {
	if req.Edition != "" && req.Edition != ladder.EditionKube {
		return fmt.Errorf("configuring the kube substrate: edition %q: it serves only %q", req.Edition, ladder.EditionKube)
	}
	cfg := DefaultConfig()
	if err := req.Values.Decode(&cfg); err != nil {
		return fmt.Errorf("configuring the kube substrate: %w", err)
	}
	warm, err := labels.Parse(cfg.WarmPoolSelector)
	if err != nil {
		return fmt.Errorf("configuring the kube substrate: warm_pool_selector: %w", err)
	}
	client, eventsClient, err := s.clients(cfg)
	if err != nil {
		return fmt.Errorf("configuring the kube substrate: %w", err)
	}
	var ev *eventer
	if cfg.Events {
		if ev, err = startEvents(eventsClient, eventsQPS, eventsBurst, s.log); err != nil {
			return fmt.Errorf("configuring the kube substrate: %w", err)
		}
	}
	r := &running{cfg: cfg, client: client, warm: warm, events: ev,
		presence: startPresence(client, cfg.Namespace, cfg.Resync, s.opts.Clock, s.log), foreign: newForeignPods(s.log)}
	s.mu.Lock()
	old := s.run
	s.run = r
	s.mu.Unlock()
	if old != nil {
		old.stop()
	}
	s.log.Info("kube substrate configured", "namespace", cfg.Namespace, "qps", cfg.QPS, "burst", cfg.Burst, "events", cfg.Events)
	return nil
}

// clients builds the API clients the configuration asks for: the
// substrate's, and the Events' own, whose requests are bounded apart
// (eventsQPS), so that an Event never waits on the substrate's rate nor
// takes from it.
func (s *Substrate) clients(cfg Config) (client, events kubernetes.Interface, err error) {
	if s.opts.Client != nil {
		return s.opts.Client, s.opts.Client, nil
	}
	rc := s.opts.RestConfig
	if rc == nil {
		if rc, err = RESTConfig(cfg.Kubeconfig); err != nil {
			return nil, nil, err
		}
	}
	if client, err = newClient(rest.CopyConfig(rc), "reaper-substrate-kube", float32(cfg.QPS), cfg.Burst); err != nil {
		return nil, nil, err
	}
	// A series' patch follows its Event's create: twice the Events' rate.
	if events, err = newClient(rest.CopyConfig(rc), "reaper-substrate-kube", 2*eventsQPS, eventsBurst); err != nil {
		return nil, nil, err
	}
	return client, events, nil
}

// Close stops the presence informer and the Events broadcaster. The
// plugin process is simply killed; a program embedding the substrate calls
// Close.
func (s *Substrate) Close() {
	s.mu.Lock()
	r := s.run
	s.run = nil
	s.mu.Unlock()
	if r != nil {
		r.stop()
	}
}

var errUnconfigured = errors.New("kube substrate: not configured")

func (s *Substrate) current() (*running, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.run == nil {
		return nil, errUnconfigured
	}
	return s.run, nil
}

// Synced reports whether the presence informer has listed every task pod
// once: the fleet view is complete.
func (s *Substrate) Synced(context.Context) (bool, error) {
	r, err := s.current()
	if err != nil {
		return false, err
	}
	return r.presence.synced(), nil
}

// StopOrphan stops nothing: on kube an attempt is stopped by tearing its
// pod down, never by signalling processes.
func (s *Substrate) StopOrphan(context.Context, sdk.StopRequest) (sdk.StopResult, error) {
	return sdk.StopResult{Detail: "kube has no process groups: its attempts are stopped by teardown"}, nil
}

// WarmWorkers lists the warm pool's pods with a live read, never the cache:
// the warm-worker-lost reaper marks on their absence.
func (s *Substrate) WarmWorkers(ctx context.Context) ([]sdk.WarmWorker, error) {
	r, err := s.current()
	if err != nil {
		return nil, err
	}
	var out []sdk.WarmWorker
	err = r.list(ctx, r.warm, func(p *pod) {
		out = append(out, sdk.WarmWorker{Name: p.Name, Phase: string(p.phase)})
	})
	if err != nil {
		return nil, fmt.Errorf("listing the warm pool's pods: %w", err)
	}
	return out, nil
}

// Package daemon is reaperd's wiring, in one place for `reaperd run` and for
// the integration tests: the board's pool, the plugins under their
// supervisors (in a socket directory the host owns), the leader elector
// behind the schema check, the maintenance loop with its settling gate,
// telemetry, and the runner (Lite or kube) when the configuration has one.
//
// New builds everything and starts only the plugins; Run runs the elector,
// telemetry and the components (component.go: the maintenance loop, the
// owed teardowns, the shadow scorer, the retentions' prunes, the attempt
// API, the runner, each a Run(ctx) error that says whether it needs
// leadership) on the injected clock until its context ends; Close releases
// what New took. The execution side's parts are built from their blocks by
// their own packages (attemptapi.NewService, kuberunner.FromSettings).
// Tests drive the same daemon one step at a time with Campaign and
// RunCycle on a fake clock.
package daemon

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/host/audit"
	"github.com/dexaflow/reaper/host/config"
	"github.com/dexaflow/reaper/host/cycle"
	"github.com/dexaflow/reaper/host/launch"
	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/host/loader"
	"github.com/dexaflow/reaper/host/metrics"
	"github.com/dexaflow/reaper/host/owed"
	"github.com/dexaflow/reaper/host/prune"
	"github.com/dexaflow/reaper/host/shadow"
	"github.com/dexaflow/reaper/host/supervise"
	"github.com/dexaflow/reaper/host/telemetry"
	"github.com/dexaflow/reaper/internal/confine"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/runner/kuberunner"
	"github.com/dexaflow/reaper/runner/literunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/substrate/lite/records"
)

// Options are what the caller injects. Zero values are reaperd's own.
type Options struct {
	// Clock is the only time the daemon reads. Default clock.Real{}.
	Clock clock.Clock
	// Logger receives the host's logs and its plugins'. Default: none.
	Logger hclog.Logger
	// Holder names this replica in the lease row. Default: host name/pid.
	Holder string
	// SocketRoot is where the host makes the directory of its plugins'
	// unix sockets. Default loader.DefaultSocketRoot().
	SocketRoot string
}

// withDefaults fills in every default: the one place the daemon's
// defaults are decided.
func (o Options) withDefaults() Options {
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.Holder == "" {
		o.Holder = defaultHolder()
	}
	if o.SocketRoot == "" {
		o.SocketRoot = loader.DefaultSocketRoot()
	}
	return o
}

// Daemon is one reaperd replica.
type Daemon struct {
	cfg  *config.Config
	opts Options
	log  hclog.Logger

	pool    *pgxpool.Pool
	store   *board.Store
	sockets *loader.SocketDir
	plugins []*supervised // the substrate first, then the reapers in order
	elector *leader.Elector
	loop    *cycle.Loop
	owed    *owed.Service   // the teardowns owed until done
	shadows *shadow.Service // the shadow decisions' scorer
	history *prune.History  // the attempt history's retention
	pruning *prune.Audit    // the audit's retention
	// decisions is the one pipeline every producer's decisions go
	// through (the loop, the owed teardowns, the runner, the attempt
	// API): metered, logged, audited, and retried when a write fails.
	decisions *audit.Pipeline
	runner    runner // nil without a runner block
	metrics   *metrics.Metrics
	api       *attemptapi.Service
	gate      *schemaGate

	// fatal receives an error that must stop Run (a component that
	// stopped on its own).
	fatal chan error
}

type supervised = supervise.Supervisor[*launch.Handle, *launch.Handle]

// New opens the board (lazily: a database down at start is retried by the
// elector), launches and configures every plugin, and builds the elector,
// the loop and the runner. On error everything already started is stopped.
func New(ctx context.Context, cfg *config.Config, opts Options) (*Daemon, error) {
	opts = opts.withDefaults()
	if cfg.StoreDSN == "" {
		return nil, errors.New("no database: set store.dsn or REAPER_DSN")
	}
	d := &Daemon{cfg: cfg, opts: opts, log: opts.Logger, metrics: metrics.New(), fatal: make(chan error, 1)}
	if err := d.start(ctx); err != nil {
		// What was opened before the failure is closed again; the caller
		// gets the error alone.
		d.Close()
		return nil, err
	}
	return d, nil
}

// start opens everything New returns: the store, the plugins, the
// elector, the loop, the attempt API and the runner. On an error, what it
// opened is left on d for Close.
func (d *Daemon) start(ctx context.Context) error {
	cfg, opts := d.cfg, d.opts
	poolCfg, err := board.ParseDSN(cfg.StoreDSN)
	if err != nil {
		return err
	}
	board.NameConnections(poolCfg, opts.Holder)
	if d.pool, err = pgxpool.NewWithConfig(ctx, poolCfg); err != nil {
		return fmt.Errorf("open store: %s", board.ConnProblem(err))
	}
	d.gate = &schemaGate{pool: d.pool, clock: opts.Clock, log: d.log.Named("schema"),
		maxRetry: cmp.Or(cfg.Leader.Renew, cfg.Leader.Lease/leader.RenewShareDefault)}
	ld, err := d.openLoader()
	if err != nil {
		return err
	}
	set, err := launch.Start(ctx, ld, cfg)
	if err != nil {
		return err
	}
	sub := d.supervise(ld, set.Substrate)
	var (
		reapers  []cycle.Reaper
		names    []string
		declared = map[string]sdk.Info{}
		labels   = map[string][]string{}
	)
	for _, h := range set.Reapers {
		d.metrics.DeclareReaper(h.Block.Name, h.Info)
		names = append(names, h.Block.Name)
		declared[h.Block.Name] = h.Info
		labels[h.Block.Name] = h.Info.DecisionLabels
		reapers = append(reapers, cycle.Reaper{Name: h.Block.Name, DryRun: h.Block.DryRun, Plugin: reaperOf{d.supervise(ld, h)},
			MarkReasons: h.Info.MarkReasons, Labels: h.Info.DecisionLabels})
	}
	// The store is opened once the reapers have declared what of theirs
	// the leader scores.
	d.store = board.New(d.pool, board.Options{CredentialCeiling: cfg.Ladder.CredentialCeiling, Holder: opts.Holder,
		Observer: d.boardObserver(), Scoring: board.NewScoring(declared)})

	if d.elector, err = d.newElector(); err != nil {
		return err
	}
	d.decisions = audit.NewPipeline(d.store, d.metrics, d.log.Named("audit"))
	d.owed = owed.New(owed.Config{Interval: cfg.Ladder.MaintenanceInterval, DryRun: cfg.DryRun, Declared: labels,
		Clock: opts.Clock, Logger: d.log.Named("cycle"), Metrics: d.metrics, Decisions: d.decisions},
		d.elector, d.store, substrateOf{sub}, d.store)
	d.loop = cycle.New(cycle.Config{
		Ladder: cfg.Ladder, Edition: cfg.Edition, DryRun: cfg.DryRun, Clock: opts.Clock,
		Logger: d.log.Named("cycle"), Metrics: d.metrics, Owed: d.owed, Decisions: d.decisions,
		SubstrateLabels: set.Substrate.Info.DecisionLabels,
	}, d.elector, d.store, d.store, substrateOf{sub}, reapers)
	d.shadows = shadow.New(shadow.Config{Interval: cfg.Ladder.MaintenanceInterval, Horizon: cfg.ShadowHorizon,
		Reapers: names, Clock: opts.Clock, Logger: d.log.Named("cycle"), Metrics: d.metrics}, d.elector, d.store)
	retention := prune.Config{Interval: cfg.Ladder.MaintenanceInterval, Clock: opts.Clock, Logger: d.log.Named("cycle")}
	retention.Retention = cfg.HistoryRetention
	d.history = prune.NewHistory(retention, d.elector, d.store)
	retention.Retention = cfg.AuditRetention
	d.pruning = prune.NewAudit(retention, d.elector, d.store)

	if d.api, err = d.newAttemptAPI(ctx); err != nil {
		return err
	}
	switch {
	case cfg.Runner != nil && cfg.Runner.Kube != nil:
		if d.runner, err = d.newKubeRunner(); err != nil {
			return err
		}
	case cfg.Runner != nil:
		if d.runner, err = d.newRunner(); err != nil {
			return err
		}
	}
	return nil
}

// openLoader makes the host's socket directory and a loader that uses it.
func (d *Daemon) openLoader() (*loader.Loader, error) {
	var err error
	if d.sockets, err = loader.OpenSocketDir(d.opts.SocketRoot, d.log.Named("sockets")); err != nil {
		return nil, err
	}
	// A plugin may open only what existed beside reaperd's hidden secrets
	// when it started (confine.HideFiles), and the Lite record directory
	// lies by default in $TMPDIR beside the attempt API's state directory,
	// which is hidden: it is made now, before the substrate starts.
	if d.cfg.RecordDir != "" {
		dir, err := records.Open(d.cfg.RecordDir)
		if err != nil {
			return nil, fmt.Errorf("the Lite record directory: %w", err)
		}
		dir.Close()
	}
	ld := newLoader(d.cfg, d.log, d.sockets.Path())
	d.metrics.PluginSecretsHidden(warnUnhidden(d.log) == nil)
	return ld, nil
}

// newLoader is the loader of cfg's plugins: from its plugin directory, with
// reaperd's secrets (and, but for the substrate, its credentials for the
// API server: the ServiceAccount token, the kubeconfig files) hidden from
// every plugin.
func newLoader(cfg *config.Config, log hclog.Logger, socketDir string) *loader.Loader {
	return &loader.Loader{Dir: cfg.PluginDir, Logger: log, SocketDir: socketDir, MaxReply: cfg.PluginMaxReply,
		Secrets: cfg.Secrets(), APICredentials: append([]string{confine.ServiceAccountDir}, cfg.APICredentials()...)}
}

// warnUnhidden logs one WARN when the kernel offers no Landlock: the
// plugins then start able to open reaperd's key files, its DSN file and its
// ServiceAccount token, which run as its user. It returns why, or nil.
func warnUnhidden(log hclog.Logger) error {
	_, err := confine.LandlockABI()
	if err != nil {
		log.Warn("plugins are started without Landlock: they can open reaperd's key files, its DSN file, its "+
			"configuration and its ServiceAccount token (they run as its user); they still hold no capability "+
			"and cannot read reaperd's environment or memory", "error", err)
	}
	return err
}

// supervise puts a started plugin under a supervisor that restarts it (with
// the same block) when it has exited.
func (d *Daemon) supervise(ld *loader.Loader, h *launch.Handle) *supervised {
	block := h.Block
	s := supervise.New(supervise.Config[*launch.Handle]{
		Name:      block.Name,
		Start:     func(ctx context.Context) (*launch.Handle, error) { return launch.StartOne(ctx, ld, d.cfg, block) },
		OnRestart: d.metrics.PluginRestart,
		Clock:     d.opts.Clock,
		Logger:    d.log,
	}, h, true, func(h *launch.Handle) *launch.Handle { return h })
	d.plugins = append(d.plugins, s)
	return s
}

// newElector builds the elector of the leader block. Both kinds take their
// terms from the board's lease row, behind the schema check: the Kubernetes
// Lease is not taken while the board cannot grant a term.
func (d *Daemon) newElector() (*leader.Elector, error) {
	lease, err := d.leaderLease()
	if err != nil {
		return nil, err
	}
	return leader.New(gatedLease{Lease: lease, gate: d.gate}, leader.Config{
		Holder: d.opts.Holder, Lease: d.cfg.Leader.Lease, RenewEvery: d.cfg.Leader.Renew,
		Clock: d.opts.Clock, Logger: d.log.Named("leader"),
	})
}

// runner is a runner as the daemon drives it, the Lite runner or the kube
// runner: a component that is closed after Run returned.
type runner interface {
	component
	Close() error
}

// newAttemptAPI builds this replica's attempt API from the attempt_api
// block: every replica serves it, leading or not, and the judgments the
// board makes of its calls are metered and audited like the reapers'. With
// a kube runner, an exchange of a kube attempt's or a warm worker's
// bootstrap must prove its pod: the runner's kube block says which
// namespace, ServiceAccount and token audience (kuberunner.PodVerifier).
func (d *Daemon) newAttemptAPI(ctx context.Context) (*attemptapi.Service, error) {
	cfg, c := d.cfg, d.cfg.AttemptAPI
	var pods attemptapi.PodVerifier
	if cfg.Runner != nil && cfg.Runner.Kube != nil {
		v, err := kuberunner.NewPodVerifier(cfg.Runner.Kube.Settings, nil)
		if err != nil {
			return nil, err
		}
		pods = v
	}
	return attemptapi.NewService(ctx, attemptapi.ServiceConfig{
		Pods: pods,
		DSN:  cfg.StoreDSN, ApplicationName: d.opts.Holder,
		Listen: attemptapi.ListenConfig{
			Listen: c.Listen, Advertise: c.Advertise, CertFile: c.TLSCert, KeyFile: c.TLSKey, CAFile: c.TLSCA,
			StateDir: c.StateDir, Limits: c.Limits,
		},
		SigningKeyFile: c.SigningKeyFile,
		TTL:            cfg.Ladder.AttemptTokenTTL, Ceiling: cfg.Ladder.CredentialCeiling, WorkerCeiling: cfg.WorkerCredentialCeiling,
		HeartbeatWindow: c.HeartbeatWindow, Clients: c.Clients,
		Meter: d.metrics, Decisions: d.apiDecisions, Clock: d.opts.Clock, Logger: d.log.Named("attempt-api"),
		BoardObserver: d.boardObserver(),
	})
}

// boardObserver is the observer of the daemon's stores and writers: the
// metrics' (host/metrics BoardObserver), and a write the fence refused
// makes this replica stop leading its term (fencedObserver).
func (d *Daemon) boardObserver() board.Observer {
	return fencedObserver{Observer: d.metrics.BoardObserver(d.log.Named("board")), d: d}
}

// fencedObserver steps the replica down when the board's fence refuses a
// write of the term it leads: the board names another holder or term, and
// every further write of it would be refused too. Logged once per term
// (StepDown answers true once).
type fencedObserver struct {
	board.Observer
	d *Daemon
}

func (o fencedObserver) Deposed(write string, term int64) {
	o.Observer.Deposed(write, term)
	if o.d.elector == nil || !o.d.elector.StepDown(term) {
		return
	}
	o.d.log.Named("leader").Warn("the board's fence refused a write of this replica's term: it no longer leads; stepping down",
		"write", write, "term", term, "holder", o.d.opts.Holder)
}

// leading is the elector's answer to a runner at now: the term to fence
// its cycle's writes with, and whether this replica leads.
func (d *Daemon) leading(now time.Time) (int64, bool) {
	st := d.elector.Status(now)
	return st.Term, st.Leading
}

// newRunner builds the Lite runner of the runner block: it writes agent
// records into the record directory the configuration resolved for the
// Lite substrate too, and its decisions are metered and audited like the
// reapers'.
func (d *Daemon) newRunner() (*literunner.Runner, error) {
	cfg := d.cfg
	logger := d.log.Named("runner")
	rn, err := literunner.New(literunner.Config{
		AgentPath:     cfg.Runner.Agent,
		RecordDir:     cfg.RecordDir,
		LogDir:        cfg.Runner.LogDir,
		RunAs:         cfg.Runner.RunAs,
		Credentials:   d.api.Issuer(cfg.Ladder.AttemptTokenTTL),
		MaxParallel:   cfg.Runner.MaxParallel,
		MaxActiveRuns: cfg.Runner.MaxActiveRuns,
		Pools:         cfg.Runner.Pools,
		Recovery:      cfg.Runner.Recovery,
		Interval:      cfg.Runner.Interval,
		Ladder:        cfg.Ladder,
		Leading:       d.leading,
		Clock:         d.opts.Clock,
		Logger:        logger,
		Meter:         d.metrics,
		OnResult:      func(res literunner.Result) { d.runnerDecisions(logger, res.Term, res.At, res.Decisions) },
	}, lifecycle.New(d.pool, lifecycle.Options{CredentialCeiling: d.cfg.Ladder.CredentialCeiling, Holder: d.opts.Holder,
		Observer: d.boardObserver()}))
	if err != nil {
		return nil, fmt.Errorf("runner: %w", err)
	}
	return rn, nil
}

// newKubeRunner builds the kube runner of the runner block's kube block
// (kuberunner.FromSettings makes its client, with the kube substrate's
// kubeconfig, and its pods' template); its decisions are metered and
// audited like the Lite runner's.
func (d *Daemon) newKubeRunner() (*kuberunner.Runner, error) {
	cfg := d.cfg
	logger := d.log.Named("runner")
	// The pods reach the API at the kube block's attempt_api, else at
	// attempt_api.advertise (a Service name the certificate covers).
	rn, err := kuberunner.FromSettings(cfg.Runner.Kube.Settings, d.api.Issuer(cfg.Ladder.AttemptTokenTTL), kuberunner.Config{
		MaxParallel:      cfg.Runner.MaxParallel,
		MaxActiveRuns:    cfg.Runner.MaxActiveRuns,
		Pools:            cfg.Runner.Pools,
		Recovery:         cfg.Runner.Recovery,
		Interval:         cfg.Runner.Interval,
		Ladder:           cfg.Ladder,
		Leading:          d.leading,
		DispatchObserver: d.metrics,
		Clock:            d.opts.Clock,
		Logger:           logger,
		Meter:            d.metrics,
		OnResult:         func(res kuberunner.Result) { d.runnerDecisions(logger, res.Term, res.At, res.Decisions) },
	}, lifecycle.New(d.pool, lifecycle.Options{CredentialCeiling: d.cfg.Ladder.CredentialCeiling, Holder: d.opts.Holder,
		Observer: d.boardObserver()}))
	if err != nil {
		return nil, fmt.Errorf("runner: %w", err)
	}
	return rn, nil
}

// runnerDecisions hands the decisions of one runner cycle, made at at
// under term (the cycle itself is metered through the runner's Meter), to
// the decision pipeline: metered, logged to logger, audited under that
// term and time, and retried from a later cycle when the write fails.
func (d *Daemon) runnerDecisions(logger hclog.Logger, term int64, at time.Time, ds []sdk.Decision) {
	d.decisions.With(logger).Record(context.Background(), term, at, ds)
}

// loopback is the telemetry's second address, if it has one.
func loopback(addr string) []string {
	if addr == "" {
		return nil
	}
	return []string{addr}
}

// apiDecisions hands the judgments the board made of attempt API calls
// (a refused reschedule) to the decision pipeline, under the term this
// replica sees as they are made: metered, logged, audited, and retried
// from a later cycle when the write fails.
func (d *Daemon) apiDecisions(ctx context.Context, ds []sdk.Decision) {
	now := d.opts.Clock.Now()
	d.decisions.With(d.log.Named("attempt-api")).Record(ctx, d.elector.Status(now).Term, now, ds)
}

func (d *Daemon) fail(err error) {
	select {
	case d.fatal <- err:
	default:
	}
}

// Run serves telemetry, waits behind the schema gate for a board this
// binary may run on (readiness says why while it waits: a database not
// reachable, a schema not migrated, a floor above this binary), then runs
// the elector and the components (the maintenance loop, the attempt API,
// the runner when there is one) until ctx is done (a clean stop: nil; the
// cycle in flight ends at its next boundary and the elector resigns) or a
// fatal error: a component that stopped on its own.
func (d *Daemon) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	started := d.opts.Clock.Now()
	_, served, err := telemetry.Serve(ctx, d.cfg.Telemetry.Listen, d.cfg.Telemetry.Limits, telemetry.Handler(d.metrics.Registry, telemetry.HealthSource{
		Ping:     d.pool.Ping,
		LastTick: d.loop.LastTick,
		Leader: func(now time.Time) (bool, int64) {
			st := d.elector.Status(now)
			return st.Leading, st.Term
		},
		Interval: d.cfg.Ladder.MaintenanceInterval, Started: started, Clock: d.opts.Clock,
		Logger: d.log.Named("health"), Explain: board.ConnProblem, Gate: d.gate.state,
	}), d.log.Named("telemetry"), loopback(d.cfg.Telemetry.Loopback)...)
	if err != nil {
		return err
	}
	d.log.Info("reaperd running", "edition", d.cfg.Edition, "reapers", d.cfg.ReaperNames(),
		"interval", d.cfg.Ladder.MaintenanceInterval, "lease", d.cfg.Leader.Lease, "dry_run", d.cfg.DryRun,
		"schema", board.SchemaVersion())
	// Nothing that reads or writes the board starts before the gate opens.
	if err := d.gate.wait(ctx); err != nil {
		cancel(nil)
		if err := <-served; err != nil {
			d.log.Warn("telemetry server", "error", err)
		}
		d.log.Info("reaperd stopped before the schema gate opened")
		return nil
	}

	var leaders, others components
	for _, c := range d.components() {
		if c.NeedsLeadership() {
			leaders = append(leaders, c)
		} else {
			others = append(others, c)
		}
	}
	othersDone := others.start(ctx, d.fail)
	// The elector outlives the work it guards: it resigns (releasing the
	// board's row and a Kubernetes Lease) only once every component that
	// writes under its term has returned, so no pass of this term is still
	// writing when another replica may take over.
	electing, stopElecting := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElecting()
	elected := make(chan struct{})
	go func() { defer close(elected); d.elector.Run(electing) }()
	leadersDone := leaders.start(ctx, d.fail)
	select {
	case <-ctx.Done():
	case err := <-d.fatal:
		cancel(err)
	}
	d.stopped(leadersDone)
	stopElecting()
	<-elected
	if err := <-served; err != nil {
		d.log.Warn("telemetry server", "error", err)
	}
	d.stopped(othersDone)
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	d.log.Info("reaperd stopped cleanly")
	return nil
}

// components are the daemon's long-running parts, in the order they are
// started: the attempt API, the maintenance loop, the retentions, the
// runner.
func (d *Daemon) components() components {
	cs := components{{"attempt api", d.api}, {"maintenance loop", d.loop},
		{"owed teardowns", d.owed}, {"shadow scorer", d.shadows}, {"history prune", d.history}, {"audit prune", d.pruning}}
	if d.runner != nil {
		cs = append(cs, named{"runner", d.runner})
	}
	return cs
}

// stopped waits for the components of done and logs what they returned.
func (d *Daemon) stopped(done <-chan namedErr) {
	for r := range done {
		if r.err != nil {
			d.log.Warn("component stopped", "component", r.name, "error", r.err)
		}
	}
}

// Campaign makes one attempt to gain or renew leadership, as Run does every
// renewal period, and returns the resulting status.
func (d *Daemon) Campaign(ctx context.Context) leader.Status { return d.elector.Step(ctx) }

// RunCycle runs one maintenance cycle now, as Run does every interval,
// and then the owed teardowns (their decisions and overrun added to its
// result), the shadow scorer and a batch of the attempt history's prune.
func (d *Daemon) RunCycle(ctx context.Context) cycle.Result {
	res := d.loop.RunOnce(ctx)
	paid := d.owed.RunOnce(ctx)
	res.Decisions = append(res.Decisions, paid.Decisions...)
	res.DecisionCount += len(paid.Decisions)
	if paid.Overran {
		res.Overruns = append(res.Overruns, "teardown")
	}
	if d.shadows.RunOnce(ctx).Overran {
		res.Overruns = append(res.Overruns, "shadow")
	}
	d.history.RunOnce(ctx)
	return res
}

// AttemptAPIURL is the base URL this replica's attempt API is reached at.
func (d *Daemon) AttemptAPIURL() string { return d.api.URL() }

// Metrics is the daemon's metric registry.
func (d *Daemon) Metrics() *metrics.Metrics { return d.metrics }

// Close stops the plugins and the runner (its agents live on), removes the
// socket directory and closes the board's pool. Call it after Run returned.
func (d *Daemon) Close() {
	for _, s := range d.plugins {
		s.Kill()
	}
	if d.runner != nil {
		d.runner.Close()
	}
	if d.api != nil {
		d.api.Close()
	}
	if d.sockets != nil {
		if err := d.sockets.Close(); err != nil {
			d.log.Warn("plugin socket directory", "error", err)
		}
	}
	if d.pool != nil {
		d.pool.Close()
	}
}

// Check starts and configures each plugin of cfg in turn, as New would,
// and returns the problems of all of them (reaperd validate). It touches no
// database and leaves nothing behind.
func Check(ctx context.Context, cfg *config.Config, opts Options) hcl.Diagnostics {
	opts = opts.withDefaults()
	sockets, err := loader.OpenSocketDir(opts.SocketRoot, opts.Logger.Named("sockets"))
	if err != nil {
		return hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Cannot start the plugins", Detail: err.Error()}}
	}
	defer sockets.Close()
	_ = warnUnhidden(opts.Logger)
	return launch.Check(ctx, newLoader(cfg, opts.Logger, sockets.Path()), cfg)
}

// reaperOf and substrateOf give the loop the typed plugin it needs from a
// supervised handle.
type reaperOf struct{ s *supervised }

func (r reaperOf) Get(ctx context.Context, now time.Time) (sdk.Reaper, error) {
	h, err := r.s.Get(ctx, now)
	if err != nil {
		return nil, err
	}
	return h.Reaper(), nil
}

func (r reaperOf) Down() bool { return r.s.Down() }

func (r reaperOf) Recycle() { r.s.Recycle() }

type substrateOf struct{ s *supervised }

func (r substrateOf) Get(ctx context.Context, now time.Time) (sdk.Substrate, error) {
	h, err := r.s.Get(ctx, now)
	if err != nil {
		return nil, err
	}
	return h.Substrate(), nil
}

func (r substrateOf) Down() bool { return r.s.Down() }

func (r substrateOf) Recycle() { r.s.Recycle() }

// Started reports whether the daemon has passed its schema gate: the
// database answered and holds a schema this binary may run on.
func (d *Daemon) Started() bool {
	opened, _ := d.gate.state()
	return !opened.IsZero()
}

// defaultHolder names this process as a leader: its host, its process id
// and a random part. The host and the id alone do not tell one process
// from its successor in a restarted container (both are PID 1 in a pod of
// the same name), which would take its predecessor's Lease and term as
// its own instead of waiting them out.
func defaultHolder() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b))
}

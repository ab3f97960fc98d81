// Package metrics holds reaperd's Prometheus collectors, on a registry of
// its own (never the global one). Metric names that the specification's
// dashboards use are kept verbatim.
package metrics

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/cyclemeter"
	"github.com/dexaflow/reaper/sdk"
)

// Metrics is the host's set of collectors.
type Metrics struct {
	Registry *prometheus.Registry

	decisions      *prometheus.CounterVec
	overrides      *prometheus.CounterVec
	phaseDuration  *prometheus.HistogramVec
	phaseOverruns  *prometheus.CounterVec
	passDuration   *prometheus.HistogramVec
	leader         prometheus.Gauge
	term           prometheus.Gauge
	pluginRestarts *prometheus.CounterVec
	cycles         prometheus.Counter
	lastCycle      prometheus.Gauge
	owedTeardowns  prometheus.Gauge
	shadow         *prometheus.CounterVec
	confinement    prometheus.Gauge

	// The runner's collectors (Lite runner block), written on every tick
	// or dispatch.
	loopDuration    prometheus.Histogram
	dispatchLatency prometheus.Histogram
	runsWaiting     prometheus.Gauge
	runsStarted     prometheus.Counter
	finalizeLatency prometheus.Histogram
	poolSlots       *prometheus.GaugeVec
	poolWaiting     *prometheus.GaugeVec
	// The recovery budget's admissions and the recovery dispatches waiting.
	recovery            *prometheus.CounterVec
	poolRecoveryWaiting *prometheus.GaugeVec
	// The kube runner's dispatch buffer (runner.kube.dispatch_buffer).
	dispatchBufferDepth prometheus.Gauge
	dispatchBufferFull  prometheus.Counter

	// The attempt API's collectors (every replica).
	apiCalls    *prometheus.CounterVec
	apiConns    *prometheus.CounterVec
	apiDuration *prometheus.HistogramVec
	renewals    *prometheus.CounterVec

	// The board's observer's collectors (BoardObserver).
	textMadeSafe *prometheus.CounterVec
	rowsRefused  *prometheus.CounterVec
	fenceRefused *prometheus.CounterVec

	// kills are the kill labels each reaper declared (DeclareReaper), by
	// its configured name: the verdict series ShadowReapers opens.
	mu    sync.Mutex
	kills map[string][]string
}

// New registers every collector on a new registry, with the decision
// counter pre-created at zero for every known label so dashboards see the
// series before the first decision.
func New() *Metrics {
	m := &Metrics{Registry: prometheus.NewRegistry(), kills: map[string][]string{}}
	m.Registry.MustRegister(m.newAPIMetrics()...)
	m.Registry.MustRegister(m.newLoopMetrics()...)
	m.Registry.MustRegister(m.newRunnerMetrics()...)
	m.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, l := range sdk.Labels() {
		m.decisions.WithLabelValues(l, "false")
	}
	newBoardCollectors(m)
	return m
}

// newLoopMetrics makes the maintenance loop's, the leadership's and the
// plugins' metrics, and returns them to register.
func (m *Metrics) newLoopMetrics() []prometheus.Collector {
	m.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dexaflow_scheduler_decisions_total",
		Help: "Reaper and settling-gate decisions, by decision type. dry_run=\"true\" marks decisions computed but not applied.",
	}, []string{"decision_type", "dry_run"})
	m.overrides = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dexaflow_reconcile_infra_override_total",
		Help: "Provisional infra marks overridden by a durable SUCCESS record, by the mark overridden.",
	}, []string{"mark"})
	m.phaseDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "reaper_phase_duration_seconds",
		Help:    "Duration of each phase of the maintenance cycle.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
	}, []string{"phase"})
	m.phaseOverruns = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "reaper_phase_overruns_total",
		Help: "Phases that ran out of their budget of one interval.",
	}, []string{"phase"})
	m.passDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "reaper_pass_duration_seconds",
		Help:    "Duration of each reaper's pass.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
	}, []string{"reaper"})
	m.leader = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "reaper_leader",
		Help: "1 while this replica holds the leadership lease.",
	})
	m.term = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "reaper_leader_term",
		Help: "The leadership term this replica last held.",
	})
	m.pluginRestarts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "reaper_plugin_restarts_total",
		Help: "Plugin processes restarted after they exited.",
	}, []string{"plugin"})
	m.cycles = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "reaper_cycles_total",
		Help: "Maintenance cycles run.",
	})
	m.lastCycle = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "reaper_last_cycle_timestamp_seconds",
		Help: "When the last maintenance cycle started (host clock).",
	})
	m.owedTeardowns = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "reaper_owed_teardowns",
		Help: "Reap-time teardowns that did not complete and are retried until done, as the leader last counted them (0 on a replica that does not lead).",
	})
	m.shadow = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "reaper_shadow_verdicts_total",
		Help: "Verdicts written on shadow decisions (dry run, policy hold, provisional kube marks) once the board showed what became of the attempt: would_have_killed_live_work, right or unresolved, by reaper and decision label.",
	}, []string{"reaper", "label", "verdict"})
	m.confinement = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "reaper_plugin_secrets_hidden",
		Help: "1 when the plugins are started unable to open reaperd's key files, DSN file and ServiceAccount token (Landlock); 0 when the kernel offers no Landlock and they are not.",
	})
	return []prometheus.Collector{m.decisions, m.overrides, m.phaseDuration, m.phaseOverruns, m.passDuration,
		m.leader, m.term, m.pluginRestarts, m.cycles, m.lastCycle, m.owedTeardowns, m.shadow, m.confinement}
}

// newRunnerMetrics makes the runners' metrics (the loop's ticks, the
// pools, the recovery budget, the dispatch buffer), and returns them to
// register.
func (m *Metrics) newRunnerMetrics() []prometheus.Collector {
	m.loopDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "dexaflow_scheduler_loop_duration_seconds",
		Help:    "Duration of each tick of the runner's loop (release, start, schedule, dispatch, finalize).",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
	})
	m.dispatchLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "dexaflow_scheduler_dispatch_latency_seconds",
		Help:    "Time from an attempt's queueing by the runner to its agent's running report.",
		Buckets: prometheus.ExponentialBuckets(0.01, 4, 10),
	})
	m.runsWaiting = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "dexaflow_scheduler_runs_waiting_start_cap",
		Help: "Queued runs waiting for the run start cap (runner max_active_runs), as of the last tick.",
	})
	m.runsStarted = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "dexaflow_scheduler_runs_started_total",
		Help: "Queued runs the runner started.",
	})
	m.finalizeLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "dexaflow_scheduler_run_finalize_latency_seconds",
		Help:    "Time from a run's last task instance settling to the run's finalization.",
		Buckets: prometheus.ExponentialBuckets(0.01, 4, 10),
	})
	m.poolSlots = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "dexaflow_pool_slots",
		Help: "Each pool's slots as of the runner's last tick, by state: total (configured; absent for an unbounded pool), queued, running, silent (of running: attempts without a heartbeat for three heartbeat periods, which a lost attempt holds until a reaper settles it) and open. Pools no pool block names, but for default_pool, are summed under pool=\"(unconfigured)\".",
	}, []string{"pool", "state"})
	m.poolWaiting = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "dexaflow_pool_waiting_tasks",
		Help: "Scheduled task instances of each pool the runner has not dispatched, as of its last tick (pools no pool block names, but for default_pool, under pool=\"(unconfigured)\"): waiting for a slot, or for the next tick.",
	}, []string{"pool"})
	m.recovery = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dexaflow_recovery_dispatches_total",
		Help: "Recovery dispatches (retries, infra re-places, any later execution of a task that ran) the runner's recovery budget admitted, and those it deferred to a later cycle (result=deferred: counted each cycle it defers one), by pool (pools no pool block names, but for default_pool, under pool=\"(unconfigured)\").",
	}, []string{"pool", "result"})
	m.poolRecoveryWaiting = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "dexaflow_pool_recovery_waiting_tasks",
		Help: "Of each pool's waiting tasks, the recovery dispatches (re-placed and retried attempts) waiting for a slot or for the recovery budget, as of the runner's last tick.",
	}, []string{"pool"})
	m.dispatchBufferDepth = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "reaper_dispatch_buffer_depth",
		Help: "Attempts waiting in the kube runner's dispatch buffer: handed off by the tick, not yet taken by a dispatch worker (runner.kube.dispatch_buffer).",
	})
	m.dispatchBufferFull = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "reaper_dispatch_buffer_full_waits_total",
		Help: "Times the kube runner's tick found its dispatch buffer full and waited for a dispatch worker (it never drops an attempt).",
	})
	return []prometheus.Collector{m.loopDuration, m.dispatchLatency, m.runsWaiting, m.runsStarted, m.finalizeLatency,
		m.poolSlots, m.poolWaiting, m.recovery, m.poolRecoveryWaiting, m.dispatchBufferDepth, m.dispatchBufferFull}
}

// newAPIMetrics makes the attempt API's metrics, and returns them to
// register.
func (m *Metrics) newAPIMetrics() []prometheus.Collector {
	m.apiCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "reaper_attempt_api_calls_total",
		Help: "Calls to the attempt API, by call and result: ok, should_terminate, or the error code of a refused or failed call (expired, forged, wrong_scope, ...).",
	}, []string{"call", "result"})
	m.apiConns = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "reaper_attempt_api_connections_total",
		Help: "Connections to the attempt API refused (refused_address_cap: its source address over max_connections_per_address, all of them in calls) or closed to make room (evicted_address_cap, evicted_server_cap: one waiting without a call); heartbeat streams negotiated (stream_opened) and closed for a malformed frame (stream_frame_size, stream_malformed).",
	}, []string{"result"})
	m.apiDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "reaper_attempt_api_call_duration_seconds",
		Help:    "Duration of each attempt API call as the server saw it.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 3, 10),
	}, []string{"call"})
	m.renewals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "reaper_attempt_credential_renewals_total",
		Help: "Heartbeats answered with a renewed credential (renewed) or refused one at the credential ceiling (capped); warm worker claims likewise for the worker's own credential (worker_renewed, worker_capped).",
	}, []string{"result"})
	return []prometheus.Collector{m.apiCalls, m.apiConns, m.apiDuration, m.renewals}
}

// DispatchBuffered adds delta to the depth of the kube runner's dispatch
// buffer (kuberunner.DispatchObserver).
func (m *Metrics) DispatchBuffered(delta int) { m.dispatchBufferDepth.Add(float64(delta)) }

// DispatchBufferFull counts a wait of the kube runner's tick on a full
// dispatch buffer (kuberunner.DispatchObserver).
func (m *Metrics) DispatchBufferFull() { m.dispatchBufferFull.Inc() }

// Decision counts one decision.
func (m *Metrics) Decision(d sdk.Decision) {
	m.decisions.WithLabelValues(d.Label, strconv.FormatBool(d.DryRun)).Inc()
}

// Override counts durable SUCCESS overrides of a mark.
func (m *Metrics) Override(mark string, n int64) {
	m.overrides.WithLabelValues(mark).Add(float64(n))
}

// Phase observes one phase's duration and whether it overran.
func (m *Metrics) Phase(phase string, d time.Duration, overran bool) {
	m.phaseDuration.WithLabelValues(phase).Observe(d.Seconds())
	if overran {
		m.phaseOverruns.WithLabelValues(phase).Inc()
	}
}

// Pass observes one reaper pass's duration.
func (m *Metrics) Pass(reaper string, d time.Duration) {
	m.passDuration.WithLabelValues(reaper).Observe(d.Seconds())
}

// Leader records leadership status and term.
func (m *Metrics) Leader(leading bool, term int64) {
	if leading {
		m.leader.Set(1)
	} else {
		m.leader.Set(0)
	}
	if term > 0 {
		m.term.Set(float64(term))
	}
}

// OwedTeardowns sets the count of owed teardowns.
func (m *Metrics) OwedTeardowns(n int) { m.owedTeardowns.Set(float64(n)) }

// DeclareReaper takes the declaration of the reaper plugin launched under
// name: it creates, at zero, the decision series of every label the
// plugin may record (sdk.AllowedLabels of its Info), and keeps its kill
// labels (sdk.DeclaredKillLabels) for ShadowReapers. So a plugin's series
// come from its own Info, whatever plugins there are.
func (m *Metrics) DeclareReaper(name string, info sdk.Info) {
	for l := range sdk.AllowedLabels(info) {
		m.decisions.WithLabelValues(l, "false")
	}
	kill, _ := sdk.DeclaredKillLabels(info)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.kills[name] = kill
}

// ShadowReapers creates, at zero, the would_have_killed_live_work series of
// each kill label of each reaper named, so that the alert on its increase
// sees the first verdict: the kill labels it declared (DeclareReaper), or,
// for a reaper never declared here, the sdk's built-in ones
// (sdk.KillLabels).
func (m *Metrics) ShadowReapers(reapers []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range reapers {
		kill, declared := m.kills[r]
		if !declared {
			kill = sdk.KillLabels()
		}
		for _, l := range kill {
			m.shadow.WithLabelValues(r, l, sdk.VerdictWouldHaveKilledLiveWork)
		}
	}
}

// ShadowVerdict counts one verdict on a decision of reaper under label.
func (m *Metrics) ShadowVerdict(reaper, label, verdict string) {
	m.shadow.WithLabelValues(reaper, label, verdict).Inc()
}

// PluginSecretsHidden says whether plugins start unable to open reaperd's
// secret files (reaper_plugin_secrets_hidden).
func (m *Metrics) PluginSecretsHidden(hidden bool) {
	v := 0.0
	if hidden {
		v = 1
	}
	m.confinement.Set(v)
}

// PluginRestart counts a plugin restart.
func (m *Metrics) PluginRestart(name string) { m.pluginRestarts.WithLabelValues(name).Inc() }

// Cycle counts a cycle started at the given time.
func (m *Metrics) Cycle(at time.Time) {
	m.cycles.Inc()
	m.lastCycle.Set(float64(at.UnixNano()) / 1e9)
}

// RunnerCycle meters one cycle of a runner (literunner.Meter,
// kuberunner.Meter): RunnerTick of what it measured, and the pools'
// gauges (Pools) when the runner has pools configured or the cycle read
// or admitted any.
func (m *Metrics) RunnerCycle(c cyclemeter.Cycle) {
	m.RunnerTick(c.Took, c.RunsStarted, c.RunsWaiting, c.DispatchLatencies, c.FinalizeLatencies)
	if c.Pools == nil && len(c.Slots) == 0 && len(c.Recovery) == 0 {
		return
	}
	use := make([]PoolUse, 0, len(c.Pools)+len(c.Recovery))
	for _, u := range c.Pools {
		use = append(use, PoolUse{Pool: u.Pool, Queued: u.Queued, Running: u.Running, Silent: u.Silent,
			Waiting: u.Waiting, RecoveryWaiting: u.RecoveryWaiting})
	}
	for pool, rc := range c.Recovery {
		use = append(use, PoolUse{Pool: pool, Admitted: rc.Admitted, Deferred: rc.Deferred})
	}
	m.Pools(c.Slots, lifecycle.DefaultPool, use)
}

// RunnerTick records one tick of the runner: its duration, the runs it
// started, the runs still waiting on the start cap, and the dispatch and
// finalization latencies it observed.
func (m *Metrics) RunnerTick(loop time.Duration, started, waiting int, dispatch, finalize []time.Duration) {
	m.loopDuration.Observe(loop.Seconds())
	m.runsStarted.Add(float64(started))
	m.runsWaiting.Set(float64(waiting))
	for _, d := range dispatch {
		m.dispatchLatency.Observe(d.Seconds())
	}
	for _, d := range finalize {
		m.finalizeLatency.Observe(d.Seconds())
	}
}

// PoolUse is one pool's use as a runner's tick read it, and the recovery
// dispatches its budget admitted and deferred in that tick.
type PoolUse struct {
	Pool                             string
	Queued, Running, Silent, Waiting int
	RecoveryWaiting                  int
	Admitted, Deferred               int
}

// PoolUnconfigured is the pool label under which the pools no pool block
// names are summed: a task names its pool, and a series per name a tenant
// makes up would grow without bound.
const PoolUnconfigured = "(unconfigured)"

// Pools sets the pools' gauges from one tick's reading: every configured
// pool (slots, by name) and the default pool get their series, even unused;
// any other pool's use is summed under PoolUnconfigured.
func (m *Metrics) Pools(configured map[string]int, defaultPool string, use []PoolUse) {
	sum := map[string]PoolUse{}
	for name := range configured {
		sum[name] = PoolUse{Pool: name}
	}
	if _, ok := sum[defaultPool]; !ok {
		sum[defaultPool] = PoolUse{Pool: defaultPool}
	}
	sum[PoolUnconfigured] = PoolUse{Pool: PoolUnconfigured}
	for _, u := range use {
		key := u.Pool
		if _, ok := sum[key]; !ok {
			key = PoolUnconfigured
		}
		s := sum[key]
		s.Queued, s.Running, s.Silent, s.Waiting = s.Queued+u.Queued, s.Running+u.Running, s.Silent+u.Silent, s.Waiting+u.Waiting
		s.RecoveryWaiting, s.Admitted, s.Deferred = s.RecoveryWaiting+u.RecoveryWaiting, s.Admitted+u.Admitted, s.Deferred+u.Deferred
		sum[key] = s
	}
	for name, u := range sum {
		m.poolSlots.WithLabelValues(name, "queued").Set(float64(u.Queued))
		m.poolSlots.WithLabelValues(name, "running").Set(float64(u.Running))
		m.poolSlots.WithLabelValues(name, "silent").Set(float64(u.Silent))
		m.poolWaiting.WithLabelValues(name).Set(float64(u.Waiting))
		m.poolRecoveryWaiting.WithLabelValues(name).Set(float64(u.RecoveryWaiting))
		m.recovery.WithLabelValues(name, "admitted").Add(float64(u.Admitted))
		m.recovery.WithLabelValues(name, "deferred").Add(float64(u.Deferred))
		if slots, ok := configured[name]; ok {
			m.poolSlots.WithLabelValues(name, "total").Set(float64(slots))
			m.poolSlots.WithLabelValues(name, "open").Set(float64(max(slots-u.Queued-u.Running, 0)))
		}
	}
}

// AttemptAPICall counts one attempt API call and observes its duration.
func (m *Metrics) AttemptAPICall(call, result string, took time.Duration) {
	m.apiCalls.WithLabelValues(call, result).Inc()
	m.apiDuration.WithLabelValues(call).Observe(took.Seconds())
}

// AttemptAPIConnection counts a connection the attempt API refused or
// closed to make room, and a heartbeat stream opened or closed for its
// framing (attemptapi.ConnMeter).
func (m *Metrics) AttemptAPIConnection(result string) { m.apiConns.WithLabelValues(result).Inc() }

// CredentialRenewal counts a renewal ("renewed") or a refusal at the
// ceiling ("capped"), and for a warm worker's own credential
// "worker_renewed" and "worker_capped".
func (m *Metrics) CredentialRenewal(result string) { m.renewals.WithLabelValues(result).Inc() }

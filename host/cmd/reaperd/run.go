package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/host/config"
	"github.com/dexaflow/reaper/host/cycle"
	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/host/loader"
	"github.com/dexaflow/reaper/host/metrics"
	"github.com/dexaflow/reaper/host/plugins"
	"github.com/dexaflow/reaper/host/supervise"
	"github.com/dexaflow/reaper/host/telemetry"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	runner "github.com/dexaflow/reaper/runner/literunner"
)

// leaseStore adapts the board's lease row to the elector's interface.
type leaseStore struct{ store *board.Store }

func (l leaseStore) TryAcquire(ctx context.Context, holder string, ttl time.Duration, now time.Time) (int64, bool, error) {
	lease, ok, err := l.store.TryAcquire(ctx, holder, ttl, now)
	return lease.Term, ok, err
}

func (l leaseStore) Renew(ctx context.Context, term int64, holder string, ttl time.Duration, now time.Time) (bool, error) {
	_, ok, err := l.store.Renew(ctx, term, holder, ttl, now)
	return ok, err
}

func (l leaseStore) Resign(ctx context.Context, term int64, holder string) error {
	_, err := l.store.Resign(ctx, term, holder)
	return err
}

// schemaGate makes leadership wait for a database whose schema this binary
// knows. While the database is unreachable, acquisition fails (and is
// retried by the elector); a schema of the wrong version is fatal.
type schemaGate struct {
	leader.Lease
	pool  *pgxpool.Pool
	fatal func(error)

	mu sync.Mutex
	ok bool
}

func (g *schemaGate) TryAcquire(ctx context.Context, holder string, ttl time.Duration, now time.Time) (int64, bool, error) {
	g.mu.Lock()
	checked := g.ok
	g.mu.Unlock()
	if !checked {
		if err := board.CheckSchema(ctx, g.pool); err != nil {
			var serr *board.SchemaError
			if errors.As(err, &serr) {
				g.fatal(err)
			}
			return 0, false, err
		}
		g.mu.Lock()
		g.ok = true
		g.mu.Unlock()
	}
	return g.Lease.TryAcquire(ctx, holder, ttl, now)
}

func cmdRun(ctx context.Context, args []string, stderr io.Writer) int {
	_, cfg, logger, code := commandSetup("run", args, stderr, hclog.Info)
	if code != 0 {
		return code
	}
	if err := runDaemon(ctx, cfg, logger, clock.Real{}); err != nil {
		logger.Error("reaperd stopped", "error", err)
		return 1
	}
	return 0
}

// runDaemon runs until ctx is done (a clean stop: nil) or a fatal error.
func runDaemon(ctx context.Context, cfg *config.Config, logger hclog.Logger, clk clock.Clock) error {
	if cfg.Leader.Kind != config.LeaderPostgres {
		return fmt.Errorf("leader %q is not available in this build: use leader \"postgres\"", cfg.Leader.Kind)
	}
	if cfg.StoreDSN == "" {
		return errors.New("no database: set store.dsn or REAPER_DSN")
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	poolCfg, err := pgxpool.ParseConfig(cfg.StoreDSN)
	if err != nil {
		return fmt.Errorf("parse store dsn: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg) // connects lazily: a database down at start is retried
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	defer pool.Close()
	store := board.New(pool, board.Options{})

	set, err := plugins.Start(ctx, cfg, logger)
	if err != nil {
		return err
	}
	m := metrics.New()
	ld := &loader.Loader{Dir: cfg.PluginDir, Logger: logger}
	supervised := func(h *plugins.Handle) *supervise.Supervisor[*plugins.Handle, *plugins.Handle] {
		return supervise.New(supervise.Config[*plugins.Handle]{
			Name:      h.Block.Name,
			Start:     func(ctx context.Context) (*plugins.Handle, error) { return plugins.StartOne(ctx, ld, cfg, h.Block) },
			OnRestart: m.PluginRestart,
			Clock:     clk,
			Logger:    logger,
		}, h, true, func(h *plugins.Handle) *plugins.Handle { return h })
	}
	subSup := supervised(set.Substrate)
	var reapers []cycle.Reaper
	var sups []*supervise.Supervisor[*plugins.Handle, *plugins.Handle]
	for _, h := range set.Reapers {
		s := supervised(h)
		sups = append(sups, s)
		reapers = append(reapers, cycle.Reaper{Name: h.Block.Name, DryRun: h.Block.DryRun, Plugin: reaperOf{s}})
	}
	defer func() {
		subSup.Kill()
		for _, s := range sups {
			s.Kill()
		}
	}()

	host, _ := os.Hostname()
	elector, err := leader.New(&schemaGate{
		Lease: leaseStore{store}, pool: pool,
		fatal: func(err error) { cancel(err) },
	}, leader.Config{
		Holder: fmt.Sprintf("%s/%d", host, os.Getpid()), Lease: cfg.Leader.Lease, Clock: clk, Logger: logger.Named("leader"),
	})
	if err != nil {
		return err
	}
	loop := cycle.New(cycle.Config{
		Ladder: cfg.Ladder, Edition: cfg.Edition, DryRun: cfg.DryRun, Clock: clk,
		Logger: logger.Named("cycle"), Metrics: m,
	}, elector, store, store, substrateOf{subSup}, reapers)

	started := clk.Now()
	_, served, err := telemetry.Serve(ctx, cfg.Telemetry.Listen, telemetry.Handler(m.Registry, telemetry.HealthSource{
		Ping:     pool.Ping,
		LastTick: loop.LastTick,
		Leader: func(now time.Time) (bool, int64) {
			st := elector.Status(now)
			return st.Leading, st.Term
		},
		Interval: cfg.Ladder.MaintenanceInterval, Started: started, Clock: clk,
	}), logger.Named("telemetry"))
	if err != nil {
		return err
	}
	logger.Info("reaperd running", "edition", cfg.Edition, "reapers", cfg.ReaperNames(),
		"interval", cfg.Ladder.MaintenanceInterval, "lease", cfg.Leader.Lease, "dry_run", cfg.DryRun)

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); elector.Run(ctx) }()
	go func() { defer wg.Done(); loop.Run(ctx) }()
	if cfg.Runner != nil {
		rn, err := newRunner(cfg, set, pool, store, elector, m, clk, logger.Named("runner"))
		if err != nil {
			cancel(err)
		} else {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer rn.Close()
				rn.Run(ctx, func(now time.Time) bool { return elector.Status(now).Leading })
			}()
		}
	}
	<-ctx.Done()
	wg.Wait() // the cycle in flight ends at its next boundary; the elector resigns
	if err := <-served; err != nil {
		logger.Warn("telemetry server", "error", err)
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	logger.Info("reaperd stopped cleanly")
	return nil
}

// newRunner builds the Lite runner of the runner block: it writes agent
// records into the same directory the Lite substrate reads, and its
// decisions are metered and audited like the reapers'.
func newRunner(cfg *config.Config, set *plugins.Set, pool *pgxpool.Pool, store *board.Store,
	elector *leader.Elector, m *metrics.Metrics, clk clock.Clock, logger hclog.Logger) (*runner.Runner, error) {
	rc := runner.Config{
		AgentPath:   cfg.Runner.Agent,
		RecordDir:   set.Substrate.Values.String("record_dir"),
		LogDir:      cfg.Runner.LogDir,
		DSN:         cfg.StoreDSN,
		MaxParallel: cfg.Runner.MaxParallel,
		Interval:    cfg.Runner.Interval,
		Ladder:      cfg.Ladder,
		Clock:       clk,
		Logger:      logger,
		OnResult: func(res runner.Result) {
			if len(res.Decisions) == 0 {
				return
			}
			for _, d := range res.Decisions {
				m.Decision(d)
			}
			term := elector.Status(res.At).Term
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := store.RecordDecisions(ctx, term, res.At, res.Decisions); err != nil {
				logger.Warn("audit of the runner's decisions failed", "error", err)
			}
		},
	}
	rn, err := runner.New(rc, lifecycle.New(pool, lifecycle.Options{}))
	if err != nil {
		return nil, fmt.Errorf("runner: %w", err)
	}
	return rn, nil
}

// reaperOf and substrateOf give the cycle the typed plugin it needs from a
// supervised handle.
type reaperOf struct {
	s *supervise.Supervisor[*plugins.Handle, *plugins.Handle]
}

func (r reaperOf) Get(ctx context.Context, now time.Time) (sdk.Reaper, error) {
	h, err := r.s.Get(ctx, now)
	if err != nil {
		return nil, err
	}
	return h.Reaper(), nil
}

func (r reaperOf) Down() bool { return r.s.Down() }

func (r reaperOf) Recycle() { r.s.Recycle() }

type substrateOf struct {
	s *supervise.Supervisor[*plugins.Handle, *plugins.Handle]
}

func (r substrateOf) Get(ctx context.Context, now time.Time) (sdk.Substrate, error) {
	h, err := r.s.Get(ctx, now)
	if err != nil {
		return nil, err
	}
	return h.Substrate(), nil
}

func (r substrateOf) Down() bool { return r.s.Down() }

func (r substrateOf) Recycle() { r.s.Recycle() }

package attemptapi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/internal/httplimit"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/runner/attempttoken/keyfile"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
)

const (
	// KeyReloadIntervalDefault is how often the signing key file is
	// checked for a rotation.
	KeyReloadIntervalDefault = 30 * time.Second
	// PoolConnsDefault bounds the service's connections to the board: each
	// heartbeat batch is one short statement, and the service's pool is
	// its own, so agents' calls never queue behind the elector or a cycle.
	PoolConnsDefault = 4
	// GeneratedKeyFile is the signing key file generated in the state
	// directory when the operator names none.
	GeneratedKeyFile = "signing-keys.hcl"
)

// ServiceConfig configures a Service: where it listens (Listen), the keys
// it signs and checks tokens with, and the server's own settings.
type ServiceConfig struct {
	// DSN is the board's PostgreSQL. Required.
	DSN string
	// ApplicationName names the service's connections to the board
	// (board.NameConnections; reaperd: its holder). Default: unnamed.
	ApplicationName string
	// Listen says where and how the API is served (its StateDir also holds
	// the generated signing key).
	Listen ListenConfig
	// SigningKeyFile is the operator's key file (current and previous
	// keys); "": a key generated once into Listen.StateDir.
	SigningKeyFile string
	// TTL, Ceiling and WorkerCeiling: see ServerConfig.
	TTL, Ceiling, WorkerCeiling time.Duration
	// HeartbeatWindow: see ServerConfig (attempt_api.heartbeat_window).
	HeartbeatWindow time.Duration
	// Clients bound one client's connections and calls (ServerConfig's
	// Clients; its MaxConnsPerAddress goes to the listener). The zero
	// value: the defaults on the ladder's default heartbeat.
	Clients httplimit.Clients
	// Pods: see ServerConfig (the kube edition's pod proof).
	Pods PodVerifier
	// Meter, Decisions: see ServerConfig.
	Meter     Meter
	Decisions func(ctx context.Context, ds []sdk.Decision)
	// BoardObserver hears of the agents' text the board made safe
	// (board.Options.Observer); nil: no one.
	BoardObserver board.Observer
	// KeyReload is how often the key file is checked for a rotation.
	// Default KeyReloadIntervalDefault.
	KeyReload time.Duration
	// Clock is the only time the service reads. Default clock.Real{}.
	Clock clock.Clock
	// Logger logs the service's life and its refusals. Default: none.
	Logger hclog.Logger
}

func (c ServiceConfig) withDefaults() ServiceConfig {
	if c.KeyReload <= 0 {
		c.KeyReload = KeyReloadIntervalDefault
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	return c
}

// Service is one replica's attempt API as a whole: its own pool to the
// board, the bound listener, the server, and the keyring in force
// (swapped when the key file changes). Every replica serves it, leading or
// not.
type Service struct {
	cfg     ServiceConfig
	pool    *pgxpool.Pool
	ln      *Listener
	srv     *Server
	keys    atomic.Pointer[attempttoken.Keyring]
	keyFile string

	closeOnce sync.Once
}

// NewService loads (or generates) the signing keys and the certificate and
// binds the listener; Run serves it. On an error what was opened is closed.
func NewService(ctx context.Context, cfg ServiceConfig) (s *Service, err error) {
	cfg = cfg.withDefaults()
	s = &Service{cfg: cfg, keyFile: cfg.SigningKeyFile}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	// As the daemon's own pool: a DSN naming a primary and its standbys
	// follows a promotion.
	poolCfg, err := board.ParseDSN(cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("attempt api: parse store dsn: %w", err)
	}
	poolCfg.MaxConns = PoolConnsDefault
	board.NameConnections(poolCfg, cfg.ApplicationName)
	if s.pool, err = pgxpool.NewWithConfig(ctx, poolCfg); err != nil {
		return nil, fmt.Errorf("attempt api: open store: %w", err)
	}
	var kr *attempttoken.Keyring
	if s.keyFile != "" {
		kr, err = keyfile.Load(s.keyFile)
	} else {
		s.keyFile = filepath.Join(cfg.Listen.StateDir, GeneratedKeyFile)
		kr, err = keyfile.LoadOrCreate(s.keyFile)
	}
	if err != nil {
		return nil, fmt.Errorf("attempt api: %w", err)
	}
	s.keys.Store(kr)
	s.srv, err = NewServer(ServerConfig{
		Keys: s.keys.Load, TTL: cfg.TTL, Ceiling: cfg.Ceiling, WorkerCeiling: cfg.WorkerCeiling,
		Board: lifecycle.New(s.pool, lifecycle.Options{CredentialCeiling: cfg.Ceiling, HeardSince: cfg.Clock.Now(),
			Observer: cfg.BoardObserver}),
		Meter: cfg.Meter, Decisions: cfg.Decisions, Clock: cfg.Clock, Logger: cfg.Logger, Pods: cfg.Pods,
		HeartbeatWindow: cfg.HeartbeatWindow, Clients: cfg.Clients,
	})
	if err != nil {
		return nil, err
	}
	lc := cfg.Listen
	lc.MaxConnsPerAddress = cmp.Or(lc.MaxConnsPerAddress, cfg.Clients.MaxConnsPerAddress)
	lc.Meter, _ = cfg.Meter.(ConnMeter)
	lc.Logger, lc.Clock = cmp.Or(lc.Logger, cfg.Logger), cmp.Or(lc.Clock, cfg.Clock)
	if s.ln, err = Listen(ctx, lc); err != nil {
		return nil, err
	}
	cfg.Logger.Info("attempt api ready", "url", s.ln.URL, "signing_key", kr.CurrentID(), "key_file", s.keyFile)
	return s, nil
}

// URL is the base URL agents reach this replica's API at.
func (s *Service) URL() string { return s.ln.URL }

// Issuer is what a runner mints credentials with: the keys in force, the
// token TTL, and where and how the agents reach the API.
func (s *Service) Issuer(ttl time.Duration) attempttoken.Issuer {
	return attempttoken.Issuer{Keys: s.keys.Load, TTL: ttl, API: s.ln.URL, CA: s.ln.CA}
}

// NeedsLeadership is false: every replica serves the attempt API, so that
// an agent reaches whichever one it dials.
func (s *Service) NeedsLeadership() bool { return false }

// Run serves until ctx is done, rereading the key file whenever it
// changes, and returns the server's error once it has stopped.
func (s *Service) Run(ctx context.Context) error {
	served := Serve(ctx, s.ln, s.srv, s.cfg.Logger)
	tk := s.cfg.Clock.NewTicker(s.cfg.KeyReload)
	defer tk.Stop()
	last := modTime(s.keyFile)
	for {
		select {
		case <-ctx.Done():
			return <-served
		case <-tk.C():
		}
		if mt := modTime(s.keyFile); !mt.Equal(last) {
			last = mt
			s.reload()
		}
	}
}

// reload swaps in the key file's keys; a file that does not load leaves
// the keys in force.
func (s *Service) reload() {
	kr, err := keyfile.Load(s.keyFile)
	if err != nil {
		s.cfg.Logger.Error("the signing key file changed but does not load: keeping the keys in force", "error", err)
		return
	}
	s.keys.Store(kr)
	s.cfg.Logger.Info("signing keys reloaded", "current", kr.CurrentID(), "key_file", s.keyFile)
}

func modTime(path string) time.Time {
	st, err := os.Stat(path)
	if err != nil {
		return time.Time{}
	}
	return st.ModTime()
}

// Close releases the listener (when Run never served it) and the pool.
// Call it after Run returned.
func (s *Service) Close() {
	s.closeOnce.Do(func() {
		if s.ln != nil {
			if err := s.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
				s.cfg.Logger.Warn("closing the attempt api listener", "error", err)
			}
		}
		if s.pool != nil {
			s.pool.Close()
		}
	})
}

// Package supervise keeps a plugin process running: when it has exited (a
// crash, an OOM kill, a kill -9), the next request for it starts a new one,
// with an exponential backoff between failed starts so a plugin that cannot
// start does not spin.
package supervise

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk/clock"
)

// Process is a started plugin process.
type Process interface {
	Exited() bool
	Kill()
}

// Defaults of the restart backoff.
const (
	BackoffMinDefault = time.Second
	BackoffMaxDefault = 5 * time.Minute
)

// Config configures a Supervisor.
type Config[P Process] struct {
	// Name of the plugin, for logs and metrics.
	Name string
	// Start starts (and configures) a new process.
	Start func(ctx context.Context) (P, error)
	// OnRestart is called after each successful restart (metrics).
	OnRestart func(name string)
	// BackoffMin and BackoffMax bound the wait between failed starts.
	BackoffMin, BackoffMax time.Duration
	Clock                  clock.Clock
	Logger                 hclog.Logger
}

// Supervisor owns one plugin process.
type Supervisor[P Process, T any] struct {
	cfg  Config[P]
	view func(P) T

	mu       sync.Mutex
	proc     P
	running  bool
	failures int
	nextTry  time.Time
	lastErr  error
}

// New returns a supervisor around an already started process (running may be
// false to start lazily). view extracts what callers use from the process.
func New[P Process, T any](cfg Config[P], proc P, running bool, view func(P) T) *Supervisor[P, T] {
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = BackoffMinDefault
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = BackoffMaxDefault
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	return &Supervisor[P, T]{cfg: cfg, view: view, proc: proc, running: running}
}

// Down reports whether the process has exited (or was never started).
func (s *Supervisor[P, T]) Down() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.running || s.proc.Exited()
}

// Get returns the running process's view, starting a new process first when
// the last one exited and the backoff allows.
func (s *Supervisor[P, T]) Get(ctx context.Context, now time.Time) (T, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var zero T
	if s.running && !s.proc.Exited() {
		return s.view(s.proc), nil
	}
	if s.running {
		s.cfg.Logger.Warn("plugin exited; restarting it", "plugin", s.cfg.Name)
		s.proc.Kill() // reap what is left of the client side
		s.running = false
	}
	if now.Before(s.nextTry) {
		return zero, fmt.Errorf("plugin %q is down; next restart at %s (last error: %v)",
			s.cfg.Name, s.nextTry.Format(time.RFC3339), s.lastErr)
	}
	p, err := s.cfg.Start(ctx)
	if err != nil {
		s.failures++
		wait := s.cfg.BackoffMin << min(s.failures-1, 20)
		if wait > s.cfg.BackoffMax || wait <= 0 {
			wait = s.cfg.BackoffMax
		}
		s.nextTry = now.Add(wait)
		s.lastErr = err
		s.cfg.Logger.Error("plugin restart failed", "plugin", s.cfg.Name, "error", err, "retry_in", wait)
		return zero, fmt.Errorf("restart plugin %q: %w", s.cfg.Name, err)
	}
	s.proc, s.running = p, true
	s.failures, s.lastErr = 0, nil
	if s.cfg.OnRestart != nil {
		s.cfg.OnRestart(s.cfg.Name)
	}
	s.cfg.Logger.Info("plugin restarted", "plugin", s.cfg.Name)
	return s.view(s.proc), nil
}

// Kill stops the process.
func (s *Supervisor[P, T]) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running {
		s.proc.Kill()
		s.running = false
	}
}

// Recycle stops a process that misbehaved (a call that outlived its budget
// may still be running inside it); the next Get starts a fresh one.
func (s *Supervisor[P, T]) Recycle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running {
		s.cfg.Logger.Warn("stopping a plugin that outlived its budget; the next call starts a new one", "plugin", s.cfg.Name)
		s.proc.Kill()
		s.running = false
	}
}

package leader

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk/clock"
)

// Lease is the store of the lease row.
type Lease interface {
	// TryAcquire takes the lease for holder when it is free or expired at
	// now, starting a new term; ok is false when another holder has it.
	TryAcquire(ctx context.Context, holder string, ttl time.Duration, now time.Time) (term int64, ok bool, err error)
	// Renew extends the lease of term for holder; false when that term is
	// no longer the current one or is not held by holder.
	Renew(ctx context.Context, term int64, holder string, ttl time.Duration, now time.Time) (bool, error)
	// Resign releases the lease of term held by holder, if it still is;
	// term 0 releases whatever term holder holds (an acquisition whose
	// answer was lost may have won one).
	Resign(ctx context.Context, term int64, holder string) error
}

// Defaults of Config.
const (
	// MarginShareDefault: Config.Margin defaults to Lease / MarginShareDefault,
	// the part of the lease not trusted locally.
	MarginShareDefault = 5
	// RenewShareDefault: Config.RenewEvery defaults to Lease / RenewShareDefault.
	RenewShareDefault = 3
)

// Config configures an Elector. Zero values take the defaults
// (withDefaults).
type Config struct {
	// Holder identifies this replica in the lease row (host name and pid).
	// Required.
	Holder string
	// Lease is the lease duration written to the row. Positive.
	Lease time.Duration
	// Margin is taken off the lease for local trust. Default Lease /
	// MarginShareDefault; shorter than the lease.
	Margin time.Duration
	// RenewEvery is how often to renew or try to acquire. Default Lease /
	// RenewShareDefault.
	RenewEvery time.Duration
	// Clock is the only time the elector reads. Default clock.Real{}.
	Clock clock.Clock
	// Logger logs the elector's transitions. Default: a null logger.
	Logger hclog.Logger
}

// withDefaults fills in every default and validates the result: the one
// place the elector's defaults are decided.
func (c Config) withDefaults() (Config, error) {
	if c.Margin <= 0 {
		c.Margin = c.Lease / MarginShareDefault
	}
	if c.RenewEvery <= 0 {
		c.RenewEvery = c.Lease / RenewShareDefault
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}

	switch {
	case c.Holder == "":
		return c, errors.New("leader: holder is required")
	case c.Lease <= 0:
		return c, errors.New("leader: lease must be positive")
	case c.Margin >= c.Lease:
		return c, fmt.Errorf("leader: margin %s must be shorter than the lease %s", c.Margin, c.Lease)
	}
	return c, nil
}

// Status is what the replica believes about its leadership at a moment.
type Status struct {
	Leading    bool
	Term       int64     // the term held (or last held)
	Since      time.Time // when this term was gained
	ValidUntil time.Time // local trust ends here
}

// Elector runs the lease protocol for one replica.
type Elector struct {
	cfg   Config
	lease Lease

	mu    sync.Mutex
	state Status
	// lastErr is the last store error, for health reporting.
	lastErr error
	// unsure: the last acquisition's answer was lost, so it may have won a
	// term this replica does not know of (Resign releases it by holder).
	unsure bool
}

// New returns an Elector.
func New(lease Lease, cfg Config) (*Elector, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Elector{cfg: cfg, lease: lease}, nil
}

// Status reports whether the replica leads at now: only while its local
// trust lasts.
func (e *Elector) Status(now time.Time) Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.state
	s.Leading = s.Leading && now.Before(s.ValidUntil)
	return s
}

// LastError is the last error the lease store returned (nil after a
// successful call).
func (e *Elector) LastError() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lastErr
}

// Step makes one acquire-or-renew attempt and returns the resulting status.
// Steps are not meant to run concurrently (Run makes them one at a time).
func (e *Elector) Step(ctx context.Context) Status {
	start := e.cfg.Clock.Now()
	cur := e.Status(start)
	ctx, cancel := clock.WithTimeout(ctx, e.cfg.Clock, e.cfg.RenewEvery)
	defer cancel()

	if cur.Leading {
		ok, err := e.lease.Renew(ctx, cur.Term, e.cfg.Holder, e.cfg.Lease, start)
		e.mu.Lock()
		defer e.mu.Unlock()
		e.lastErr = err
		switch {
		case err != nil:
			e.cfg.Logger.Warn("lease renewal failed; leadership is trusted until its margin", "term", cur.Term,
				"valid_until", cur.ValidUntil, "error", err)
		case !ok:
			e.cfg.Logger.Warn("lease lost to another replica", "term", cur.Term)
			e.state.Leading = false
		default:
			e.state.ValidUntil = start.Add(e.cfg.Lease - e.cfg.Margin)
		}
		return e.statusLocked(start)
	}
	term, ok, err := e.lease.TryAcquire(ctx, e.cfg.Holder, e.cfg.Lease, start)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lastErr = err
	switch {
	case err != nil:
		e.cfg.Logger.Warn("lease acquisition failed", "error", err)
		e.state.Leading = false
		e.unsure = true
	case ok:
		e.unsure = false
		e.state = Status{Leading: true, Term: term, Since: start, ValidUntil: start.Add(e.cfg.Lease - e.cfg.Margin)}
		e.cfg.Logger.Info("gained leadership", "term", term, "holder", e.cfg.Holder)
	default:
		e.state.Leading = false
		e.unsure = false
	}
	return e.statusLocked(start)
}

func (e *Elector) statusLocked(now time.Time) Status {
	s := e.state
	s.Leading = s.Leading && now.Before(s.ValidUntil)
	return s
}

// Run steps every RenewEvery until ctx is done, then resigns the term it
// holds (with a short context of its own, since ctx is already done).
func (e *Elector) Run(ctx context.Context) {
	tk := e.cfg.Clock.NewTicker(e.cfg.RenewEvery)
	defer tk.Stop()
	e.Step(ctx)
	for {
		select {
		case <-ctx.Done():
			e.Resign()
			return
		case <-tk.C():
			e.Step(ctx)
		}
	}
}

// StepDown stops leading term at once, when it is the term this replica
// leads: a write of it was refused by the board's fence, so the board no
// longer names this replica the holder of term (another took it over, or
// a failover handed the number to another). The lease row is left alone
// (it is not this replica's to release); the next Step tries to acquire
// as a replica that leads nothing. It reports whether it stepped down.
func (e *Elector) StepDown(term int64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.state.Leading || e.state.Term != term {
		return false
	}
	e.state.Leading = false
	return true
}

// Resign gives up the term this replica holds, if any.
func (e *Elector) Resign() {
	e.mu.Lock()
	s := e.state
	unsure := e.unsure
	e.state.Leading = false
	e.unsure = false
	e.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if !s.Leading && unsure {
		// The last acquisition may have won a term whose answer never came:
		// release whatever this replica holds, so no successor waits for it.
		if err := e.lease.Resign(ctx, 0, e.cfg.Holder); err != nil {
			e.cfg.Logger.Warn("releasing a lease this replica may hold failed; it will expire on its own", "error", err)
		}
		return
	}
	if s.Term == 0 || !s.Leading {
		return
	}
	if err := e.lease.Resign(ctx, s.Term, e.cfg.Holder); err != nil {
		e.cfg.Logger.Warn("resigning the lease failed; it will expire on its own", "term", s.Term, "error", err)
		return
	}
	e.cfg.Logger.Info("resigned leadership", "term", s.Term)
}

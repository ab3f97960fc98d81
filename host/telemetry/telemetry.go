// Package telemetry serves reaperd's HTTP endpoints: /metrics (Prometheus)
// and /monitor/health, which answers 503 while reaperd waits for its DSN or
// for a schema it may run on, while the database is unreachable, or while
// the maintenance loop has stopped ticking (readiness), with the reason in
// one line; and, asked with ?probe=liveness, 200 whenever the process
// serves (liveness).
package telemetry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dexaflow/reaper/internal/httplimit"
	"github.com/dexaflow/reaper/sdk/clock"
)

// HealthSource is what the health endpoint asks.
type HealthSource struct {
	// Ping checks the database.
	Ping func(ctx context.Context) error
	// LastTick is when the loop last started a cycle (zero before any).
	LastTick func() time.Time
	// Leader reports leadership for display.
	Leader func(now time.Time) (leading bool, term int64)
	// Interval is the loop's period; more than two without a tick is a
	// stalled loop.
	Interval time.Duration
	// Started is when the loop started (a loop that has not ticked yet is
	// healthy for its first two intervals).
	Started time.Time
	Clock   clock.Clock
	// Logger receives the database's error, which the report never
	// carries (it names the user, the database and the host); nil: none.
	Logger hclog.Logger
	// Explain says in one line, without the DSN's contents, why a ping
	// failed: the report's reason and the log's warning. nil: the reason
	// is "the database is unreachable" alone.
	Explain func(error) string
	// Gate reports whether reaperd has started its work: the time it did
	// (zero while it waits) and, while it waits, why, in one line (a
	// schema this binary may not run on, a database not yet checked).
	// The loop is judged from that time on. nil: started with the loop.
	Gate func() (opened time.Time, reason string)
}

// Health answers reported to the world.
const (
	StatusOK          = "ok"
	StatusUnhealthy   = "unhealthy"
	DatabaseReachable = "ok"
	// DatabaseUnreachable is all the report says of a failed ping: the
	// error itself goes to the log.
	DatabaseUnreachable = "unreachable"
)

const (
	// HealthCacheFor is how long one answer of the database stands: the
	// endpoint pings the shared pool at most once per period, however
	// often it is asked.
	HealthCacheFor = time.Second
	// pingTimeout bounds one ping.
	pingTimeout = 2 * time.Second
	// unreachableLogEvery is how often, while the database stays
	// unreachable, its error is logged again (the first failure and the
	// recovery are logged at once).
	unreachableLogEvery = time.Minute
)

// DatabaseNoDSN is the report's database while reaperd waits for its DSN.
const DatabaseNoDSN = "no dsn"

// LoopWaiting is the report's loop while reaperd has not started its work.
const LoopWaiting = "waiting"

// Report is the health endpoint's body.
type Report struct {
	Status   string `json:"status"` // "ok" or "unhealthy"
	Database string `json:"database"`
	Loop     string `json:"loop"`
	Leading  bool   `json:"leading"`
	Term     int64  `json:"term"`
	// Reason is why the status is unhealthy, in one line (the first of
	// the causes: the wait for a DSN or a schema, the database, the loop);
	// "" when healthy.
	Reason string `json:"reason,omitempty"`
}

// Health is the health check with its memory: the last database answer
// (kept HealthCacheFor) and when its error was last logged.
type Health struct {
	src HealthSource

	mu       sync.Mutex // held across a ping: concurrent askers share it
	pingedAt time.Time  // when the cached answer was taken; zero: none
	dbErr    error      // the cached answer
	loggedAt time.Time  // when an unreachable database was last logged; zero: reachable
}

// NewHealth makes the health check of src.
func NewHealth(src HealthSource) *Health {
	if src.Logger == nil {
		src.Logger = hclog.NewNullLogger()
	}
	return &Health{src: src}
}

// database pings the database unless the last answer is younger than
// HealthCacheFor, and logs a failure (at once, then at most every
// unreachableLogEvery while it lasts) and a recovery.
func (h *Health) database(ctx context.Context, now time.Time) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.pingedAt.IsZero() && now.Sub(h.pingedAt) < HealthCacheFor && !now.Before(h.pingedAt) {
		return h.dbErr
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	err := h.src.Ping(pctx)
	cancel()
	h.pingedAt, h.dbErr = now, err
	switch {
	case err != nil && (h.loggedAt.IsZero() || now.Sub(h.loggedAt) >= unreachableLogEvery):
		// The warning carries no DSN content; pgx's error (which names the
		// user, the database and the host) is for debugging.
		h.src.Logger.Warn("health: " + h.unreachable(err))
		h.src.Logger.Debug("health: the database's error", "error", err)
		h.loggedAt = now
	case err == nil && !h.loggedAt.IsZero():
		h.src.Logger.Info("health: the database is reachable again")
		h.loggedAt = time.Time{}
	}
	return err
}

// unreachable is the one line said of a failed ping.
func (h *Health) unreachable(err error) string {
	if h.src.Explain != nil {
		if s := h.src.Explain(err); s != "" {
			return "the database is unreachable: " + s
		}
	}
	return "the database is unreachable"
}

// Check builds the report.
func (h *Health) Check(ctx context.Context) Report {
	src := h.src
	now := src.Clock.Now()
	r := Report{Status: StatusOK, Database: DatabaseReachable, Loop: "ok"}
	unhealthy := func(reason string) {
		if r.Status == StatusOK {
			r.Status, r.Reason = StatusUnhealthy, reason
		}
	}
	started := src.Started
	if src.Gate != nil {
		opened, reason := src.Gate()
		if opened.IsZero() {
			r.Loop = LoopWaiting
			unhealthy(reason)
		} else if opened.After(started) {
			started = opened
		}
	}
	if err := h.database(ctx, now); err != nil {
		r.Database = DatabaseUnreachable
		unhealthy(h.unreachable(err))
	}
	if r.Loop != LoopWaiting {
		ref := src.LastTick()
		if ref.IsZero() || ref.Before(started) {
			ref = started
		}
		if age := now.Sub(ref); age > 2*src.Interval {
			r.Loop = fmt.Sprintf("stalled: no cycle for %s", age.Truncate(time.Second))
			unhealthy("the maintenance loop is " + r.Loop)
		}
	}
	if src.Leader != nil {
		r.Leading, r.Term = src.Leader(now)
	}
	return r
}

// ProbeLiveness is the value of /monitor/health's probe parameter that asks
// whether the process is alive, and nothing more: the answer is 200 from
// any replica that serves HTTP, leading or not, whatever the database and
// the loop say. A restart cures neither a database outage nor a slow cycle,
// so a liveness probe must not follow them (readiness does: the plain
// /monitor/health).
const ProbeLiveness = "liveness"

// LivenessReport is /monitor/health?probe=liveness's body.
type LivenessReport struct {
	Status string `json:"status"` // always "ok"
	Probe  string `json:"probe"`  // ProbeLiveness
}

// Handler returns the mux serving /metrics and /monitor/health.
func Handler(reg *prometheus.Registry, src HealthSource) http.Handler {
	health := NewHealth(src)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/monitor/health", healthHandler(health.Check))
	return mux
}

// WaitingHandler serves /monitor/health while reaperd has no DSN yet (its
// DSN file is missing, empty or does not parse): readiness answers 503 with
// reason's line, liveness 200. There is nothing to meter yet.
func WaitingHandler(reason func() string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/monitor/health", healthHandler(func(context.Context) Report {
		return Report{Status: StatusUnhealthy, Database: DatabaseNoDSN, Loop: LoopWaiting, Reason: reason()}
	}))
	return mux
}

func healthHandler(check func(context.Context) Report) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("probe") == ProbeLiveness {
			_ = json.NewEncoder(w).Encode(LivenessReport{Status: StatusOK, Probe: ProbeLiveness})
			return
		}
		rep := check(r.Context())
		if rep.Status != StatusOK {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(rep)
	}
}

// Serve listens on addr (and on each address of also) and serves h until
// ctx is done, bounded by limits (timeouts, and a connection cap on each
// address). It returns addr's bound address once every listener is bound
// (or one failed to bind); the server stops on ctx.
func Serve(ctx context.Context, addr string, limits httplimit.Limits, h http.Handler, logger hclog.Logger, also ...string) (net.Addr, <-chan error, error) {
	if err := limits.Validate(); err != nil {
		return nil, nil, fmt.Errorf("telemetry: %w", err)
	}
	var lns []net.Listener
	for _, a := range append([]string{addr}, also...) {
		raw, err := net.Listen("tcp", a)
		if err != nil {
			for _, ln := range lns {
				_ = ln.Close()
			}
			return nil, nil, fmt.Errorf("telemetry: listen on %s: %w", a, err)
		}
		lns = append(lns, httplimit.Listener(raw, limits.MaxConns))
	}
	srv := limits.Server(h)
	// The server's own complaints (a client cut off, a malformed request)
	// are a flood's to make: debug level.
	srv.ErrorLog = logger.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug})
	done := make(chan error, 1)
	var wg sync.WaitGroup
	errs := make([]error, len(lns))
	for i, ln := range lns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				errs[i] = err
			}
		}()
	}
	go func() {
		wg.Wait()
		done <- errors.Join(errs...)
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			logger.Warn("telemetry server shutdown", "error", err)
		}
	}()
	for _, ln := range lns {
		logger.Info("telemetry listening", "addr", ln.Addr().String())
	}
	return lns[0].Addr(), done, nil
}

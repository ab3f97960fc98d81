// Package telemetry serves reaperd's HTTP endpoints: /metrics (Prometheus)
// and /monitor/health, which answers 503 while the database is unreachable
// or the maintenance loop has stopped ticking.
package telemetry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

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
}

// Report is the health endpoint's body.
type Report struct {
	Status   string `json:"status"` // "ok" or "unhealthy"
	Database string `json:"database"`
	Loop     string `json:"loop"`
	Leading  bool   `json:"leading"`
	Term     int64  `json:"term"`
}

// Check builds the report.
func (h HealthSource) Check(ctx context.Context) Report {
	now := h.Clock.Now()
	r := Report{Status: "ok", Database: "ok", Loop: "ok"}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := h.Ping(pctx); err != nil {
		r.Status, r.Database = "unhealthy", "unreachable: "+err.Error()
	}
	last := h.LastTick()
	ref := last
	if ref.IsZero() {
		ref = h.Started
	}
	if age := now.Sub(ref); age > 2*h.Interval {
		r.Status, r.Loop = "unhealthy", fmt.Sprintf("stalled: no cycle for %s", age.Truncate(time.Second))
	}
	if h.Leader != nil {
		r.Leading, r.Term = h.Leader(now)
	}
	return r
}

// Handler returns the mux serving /metrics and /monitor/health.
func Handler(reg *prometheus.Registry, health HealthSource) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/monitor/health", func(w http.ResponseWriter, r *http.Request) {
		rep := health.Check(r.Context())
		w.Header().Set("Content-Type", "application/json")
		if rep.Status != "ok" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(rep)
	})
	return mux
}

// Serve listens on addr and serves h until ctx is done. It returns once the
// listener is bound (or failed to bind); the server stops on ctx.
func Serve(ctx context.Context, addr string, h http.Handler, logger hclog.Logger) (net.Addr, <-chan error, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("telemetry: listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan error, 1)
	go func() {
		err := srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		done <- err
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			logger.Warn("telemetry server shutdown", "error", err)
		}
	}()
	logger.Info("telemetry listening", "addr", ln.Addr().String())
	return ln.Addr(), done, nil
}

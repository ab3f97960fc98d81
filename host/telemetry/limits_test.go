package telemetry_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/host/metrics"
	"github.com/dexaflow/reaper/host/telemetry"
	"github.com/dexaflow/reaper/internal/httplimit"
	"github.com/dexaflow/reaper/sdk/clock"
)

// serveLimited serves the telemetry endpoints bounded by limits and returns
// the address.
func serveLimited(t *testing.T, limits httplimit.Limits) string {
	t.Helper()
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	h := telemetry.Handler(metrics.New().Registry, telemetry.HealthSource{
		Ping: func(context.Context) error { return nil }, LastTick: clk.Now,
		Interval: 30 * time.Second, Started: t0, Clock: clk,
	})
	ctx, cancel := context.WithCancel(context.Background())
	addr, done, err := telemetry.Serve(ctx, "127.0.0.1:0", limits, h, hclog.NewNullLogger())
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return addr.String()
}

// cutOffWithin reads c until the server closes it, failing when the server
// has not within bound (the wait is for the server's own timer, set far
// shorter than bound). It returns what the server sent.
func cutOffWithin(t *testing.T, c net.Conn, bound time.Duration) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(bound))
	b, err := io.ReadAll(c)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the server kept the connection open for %s (read %q)", bound, b)
	}
	return string(b)
}

// TestTelemetryServerBounds: the telemetry server cuts off a client that
// never finishes its headers (slowloris) at read_header_timeout, closes an
// idle keep-alive connection at idle_timeout, and serves at most
// max_connections at once, the next waiting until one closes. The timeouts
// are configured short, and the test waits for the server to act, never
// for a threshold to pass.
func TestTelemetryServerBounds(t *testing.T) {
	short := httplimit.Limits{ReadHeaderTimeout: 100 * time.Millisecond, ReadTimeout: 200 * time.Millisecond,
		WriteTimeout: time.Second, IdleTimeout: 100 * time.Millisecond, MaxConns: 8}

	t.Run("SlowlorisCutOffAtReadHeaderTimeout", func(t *testing.T) {
		addr := serveLimited(t, short)
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// Headers begun, never ended.
		if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: reaperd\r\nX-Slow: 1\r\n"); err != nil {
			t.Fatal(err)
		}
		if got := cutOffWithin(t, c, 10*time.Second); strings.Contains(got, "200 OK") {
			t.Fatalf("a request without the end of its headers was answered: %q", got)
		}
	})

	t.Run("IdleKeepAliveClosedAtIdleTimeout", func(t *testing.T) {
		addr := serveLimited(t, short)
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: reaperd\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("first request: %v %v", resp, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
			t.Fatalf("the idle connection was not closed by the server: %v", err)
		}
	})

	t.Run("ConnectionCapHoldsTheNextUntilOneCloses", func(t *testing.T) {
		capped := httplimit.Limits{ReadHeaderTimeout: time.Minute, ReadTimeout: time.Minute,
			WriteTimeout: time.Minute, IdleTimeout: time.Minute, MaxConns: 1}
		addr := serveLimited(t, capped)
		holder, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Close()
		// The holder is served (its slot taken) once it gets an answer.
		if _, err := io.WriteString(holder, "GET /metrics HTTP/1.1\r\nHost: reaperd\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		hr := bufio.NewReader(holder)
		if resp, err := http.ReadResponse(hr, nil); err != nil || resp.StatusCode != 200 {
			t.Fatalf("holder: %v %v", resp, err)
		} else {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		next, err := net.Dial("tcp", addr) // the kernel queues it
		if err != nil {
			t.Fatal(err)
		}
		defer next.Close()
		if _, err := io.WriteString(next, "GET /metrics HTTP/1.1\r\nHost: reaperd\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		nr := bufio.NewReader(next)
		_ = next.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := nr.ReadByte(); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a second connection was served past max_connections = 1: %v", err)
		}
		holder.Close()
		_ = next.SetReadDeadline(time.Now().Add(10 * time.Second))
		if resp, err := http.ReadResponse(nr, nil); err != nil || resp.StatusCode != 200 {
			t.Fatalf("the waiting connection, once the slot freed: %v %v", resp, err)
		}
	})

	t.Run("InvalidLimitsRefused", func(t *testing.T) {
		bad := short
		bad.MaxConns = 0
		if _, _, err := telemetry.Serve(context.Background(), "127.0.0.1:0", bad, http.NewServeMux(), hclog.NewNullLogger()); err == nil ||
			!strings.Contains(err.Error(), "max_connections") {
			t.Fatalf("max_connections 0: %v", err)
		}
	})
}

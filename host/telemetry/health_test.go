package telemetry_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/host/metrics"
	"github.com/dexaflow/reaper/host/telemetry"
	"github.com/dexaflow/reaper/internal/httplimit"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/sdktest"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// TestHealthWithTheDatabaseDown runs the health endpoint over a real
// PostgreSQL server, then stops the server: the report says "unreachable"
// and nothing of the error (no user, host, port, database or dial text),
// and so does the log's warning, once per period however often the
// endpoint is asked; and one answer stands for a second of the injected
// clock, so a flood of requests pings the shared pool once a second.
func TestHealthWithTheDatabaseDown(t *testing.T) {
	ctx := context.Background()
	srv, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	dsn := srv.DSN("postgres")
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	var pings atomic.Int64
	var logs sdktest.LogBuffer
	h := telemetry.Handler(metrics.New().Registry, telemetry.HealthSource{
		Ping:     func(ctx context.Context) error { pings.Add(1); return pool.Ping(ctx) },
		LastTick: clk.Now, Interval: 30 * time.Second, Started: t0, Clock: clk,
		Logger: hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Info}),
	})
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	addr, _, err := telemetry.Serve(sctx, "127.0.0.1:0", httplimit.DefaultTelemetry(), h, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	get := func(t *testing.T) (int, string, telemetry.Report) {
		t.Helper()
		resp, err := http.Get("http://" + addr.String() + "/monitor/health")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var r telemetry.Report
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("health body %q: %v", b, err)
		}
		return resp.StatusCode, string(b), r
	}

	t.Run("AnswerCachedForASecond", func(t *testing.T) {
		for i := 0; i < 5; i++ {
			if code, body, _ := get(t); code != 200 {
				t.Fatalf("healthy database: %d %s", code, body)
			}
		}
		if n := pings.Load(); n != 1 {
			t.Fatalf("5 requests within a second pinged the pool %d times, want 1", n)
		}
		clk.Advance(telemetry.HealthCacheFor)
		get(t)
		if n := pings.Load(); n != 2 {
			t.Fatalf("a request a second later: %d pings, want 2", n)
		}
	})

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Run("UnreachableWithoutTheErrorText", func(t *testing.T) {
		clk.Advance(telemetry.HealthCacheFor)
		code, body, r := get(t)
		if code != http.StatusServiceUnavailable || r.Status != telemetry.StatusUnhealthy || r.Database != telemetry.DatabaseUnreachable {
			t.Fatalf("database down: %d %s", code, body)
		}
		for _, secret := range []string{pgtest.Superuser, "postgres", strconv.Itoa(srv.Port()), "127.0.0.1",
			"dial", "connect", "refused", "failed", "password"} {
			if strings.Contains(body, secret) {
				t.Errorf("the report holds %q: %s", secret, body)
			}
		}
		if r.Reason != "the database is unreachable" {
			t.Errorf("reason %q", r.Reason)
		}
		if !strings.Contains(logs.String(), "the database is unreachable") || strings.Contains(logs.String(), "error=") {
			t.Errorf("the log's warning is not the one line without the error:\n%s", logs.String())
		}
	})

	t.Run("ErrorLoggedOncePerPeriod", func(t *testing.T) {
		before := strings.Count(logs.String(), "the database is unreachable")
		for i := 0; i < 10; i++ {
			clk.Advance(telemetry.HealthCacheFor)
			if code, _, _ := get(t); code != http.StatusServiceUnavailable {
				t.Fatalf("request %d: %d", i, code)
			}
		}
		if n := strings.Count(logs.String(), "the database is unreachable"); n != before {
			t.Errorf("ten failed pings in ten seconds logged %d more lines, want none", n-before)
		}
		clk.Advance(time.Minute)
		get(t)
		if n := strings.Count(logs.String(), "the database is unreachable"); n != before+1 {
			t.Errorf("a minute later: %d more lines, want 1\n%s", n-before, logs.String())
		}
	})
}

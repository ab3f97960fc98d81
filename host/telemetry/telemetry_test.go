package telemetry_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/host/metrics"
	"github.com/dexaflow/reaper/host/telemetry"
	"github.com/dexaflow/reaper/internal/httplimit"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
)

func TestEndpoints(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	c := clock.NewFake(t0)
	m := metrics.New()
	m.Decision(sdk.Decision{Label: sdk.LabelAgentLost})
	m.Decision(sdk.Decision{Label: sdk.LabelSettlingSkip})
	m.Decision(sdk.Decision{Label: sdk.LabelDispatchLost, DryRun: true})
	m.Override(sdk.LabelPodLost, 2)

	var pingErr error
	ping := func() {}
	lastTick := t0
	leading := true
	h := telemetry.Handler(m.Registry, telemetry.HealthSource{
		Ping:     func(context.Context) error { ping(); return pingErr },
		LastTick: func() time.Time { return lastTick },
		Leader:   func(time.Time) (bool, int64) { return leading, 4 },
		Interval: 30 * time.Second, Started: t0, Clock: c,
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, _, err := telemetry.Serve(ctx, "127.0.0.1:0", httplimit.DefaultTelemetry(), h, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr.String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	t.Run("MetricsExposeTheSpecificationsLabels", func(t *testing.T) {
		code, body := get("/metrics")
		for _, want := range []string{
			`dexaflow_scheduler_decisions_total{decision_type="agent_lost",dry_run="false"} 1`,
			`dexaflow_scheduler_decisions_total{decision_type="reap_settling_skip",dry_run="false"} 1`,
			`dexaflow_scheduler_decisions_total{decision_type="dispatch_lost",dry_run="true"} 1`,
			`dexaflow_scheduler_decisions_total{decision_type="orphan_reap_noop",dry_run="false"} 0`,
			`dexaflow_reconcile_infra_override_total{mark="pod_lost"} 2`,
		} {
			if code != 200 || !strings.Contains(body, want) {
				t.Errorf("metrics lack %s", want)
			}
		}
	})

	health := func() (int, telemetry.Report) {
		code, body := get("/monitor/health")
		var r telemetry.Report
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			t.Fatalf("health body %q: %v", body, err)
		}
		return code, r
	}
	t.Run("HealthyWhenTheDatabaseAnswersAndTheLoopTicks", func(t *testing.T) {
		if code, r := health(); code != 200 || r.Status != "ok" || !r.Leading || r.Term != 4 {
			t.Fatalf("%d %+v", code, r)
		}
	})
	t.Run("UnhealthyWhileTheDatabaseIsUnreachable", func(t *testing.T) {
		c.Advance(telemetry.HealthCacheFor) // past the cached answer
		pingErr = errors.New("connection refused")
		defer func() { pingErr = nil; c.Advance(telemetry.HealthCacheFor) }()
		if code, r := health(); code != 503 || r.Database != telemetry.DatabaseUnreachable {
			t.Fatalf("%d %+v", code, r)
		}
	})
	t.Run("StandbyIsHealthyAndReadyToTakeOver", func(t *testing.T) {
		leading = false
		defer func() { leading = true }()
		if code, r := health(); code != 200 || r.Status != "ok" || r.Leading {
			t.Fatalf("a standby whose database answers and whose loop ticks: %d %+v", code, r)
		}
	})
	live := func(t *testing.T) {
		t.Helper()
		code, body := get("/monitor/health?probe=" + telemetry.ProbeLiveness)
		var r telemetry.LivenessReport
		if err := json.Unmarshal([]byte(body), &r); err != nil || code != 200 || r.Status != "ok" || r.Probe != "liveness" {
			t.Fatalf("liveness: %d %q (%v), want 200 ok", code, body, err)
		}
	}
	t.Run("LivenessIgnoresAnUnreachableDatabase", func(t *testing.T) {
		c.Advance(telemetry.HealthCacheFor)
		pingErr = errors.New("connection refused")
		pings := 0
		ping = func() { pings++ }
		defer func() { pingErr, ping = nil, func() {}; c.Advance(telemetry.HealthCacheFor) }()
		live(t)
		live(t)
		if pings != 0 {
			t.Fatalf("the liveness probe pinged the database %d times, want none", pings)
		}
		if code, _ := health(); code != 503 {
			t.Fatalf("readiness with the database unreachable: %d, want 503", code)
		}
	})
	t.Run("UnhealthyWhenTheLoopStopsTicking", func(t *testing.T) {
		c.Advance(61 * time.Second)
		if code, r := health(); code != 503 || !strings.HasPrefix(r.Loop, "stalled") {
			t.Fatalf("%d %+v", code, r)
		}
		lastTick = c.Now()
		// A stalled loop is the ReaperLoopStalled alert's to report, not a
		// reason to kill the process.
		c.Advance(61 * time.Second)
		live(t)
		lastTick = c.Now()
		if code, _ := health(); code != 200 {
			t.Fatalf("still unhealthy after a tick: %d", code)
		}
	})
}

// TestHealthWaitsForTheGate: while reaperd has not started its work (no
// schema it may run on yet), readiness answers 503 with the gate's line as
// the reason and liveness 200; once it started, the loop is judged from
// then, not from the process's start.
func TestHealthWaitsForTheGate(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	c := clock.NewFake(t0)
	var (
		opened time.Time
		reason = "this binary (version dev, schema 19) is below the database's floor 21, raised by migration 021_x.sql"
	)
	h := telemetry.Handler(metrics.New().Registry, telemetry.HealthSource{
		Ping:     func(context.Context) error { return nil },
		LastTick: func() time.Time { return time.Time{} },
		Interval: 30 * time.Second, Started: t0, Clock: c,
		Gate: func() (time.Time, string) { return opened, reason },
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, _, err := telemetry.Serve(ctx, "127.0.0.1:0", httplimit.DefaultTelemetry(), h, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	health := func(query string) (int, telemetry.Report) {
		resp, err := http.Get("http://" + addr.String() + "/monitor/health" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var r telemetry.Report
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, r
	}
	c.Advance(10 * time.Minute) // long past two intervals: not a stalled loop while it waits
	if code, r := health(""); code != 503 || r.Reason != reason || r.Loop != telemetry.LoopWaiting || r.Database != telemetry.DatabaseReachable {
		t.Fatalf("waiting: %d %+v", code, r)
	}
	if code, r := health("?probe=" + telemetry.ProbeLiveness); code != 200 || r.Status != "ok" {
		t.Fatalf("liveness while waiting: %d %+v", code, r)
	}
	opened, reason = c.Now(), ""
	c.Advance(30 * time.Second)
	if code, r := health(""); code != 200 || r.Reason != "" {
		t.Fatalf("started 30s ago, no tick yet: %d %+v", code, r)
	}
	c.Advance(31 * time.Second)
	if code, r := health(""); code != 503 || !strings.HasPrefix(r.Loop, "stalled") || !strings.Contains(r.Reason, "stalled") {
		t.Fatalf("started 61s ago, no tick: %d %+v", code, r)
	}
}

// TestWaitingHandler: before reaperd has a DSN, readiness says why in one
// line and liveness answers 200.
func TestWaitingHandler(t *testing.T) {
	const reason = "store.dsn_file /etc/reaper-db/dsn does not exist: waiting for it"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, _, err := telemetry.Serve(ctx, "127.0.0.1:0", httplimit.DefaultTelemetry(),
		telemetry.WaitingHandler(func() string { return reason }), hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	for query, want := range map[string]int{"": 503, "?probe=" + telemetry.ProbeLiveness: 200} {
		resp, err := http.Get("http://" + addr.String() + "/monitor/health" + query)
		if err != nil {
			t.Fatal(err)
		}
		var r telemetry.Report
		err = json.NewDecoder(resp.Body).Decode(&r)
		resp.Body.Close()
		if err != nil || resp.StatusCode != want || (want == 503 && (r.Reason != reason || r.Database != telemetry.DatabaseNoDSN)) {
			t.Fatalf("%q: %d %+v (%v)", query, resp.StatusCode, r, err)
		}
	}
}

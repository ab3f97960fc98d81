// Package attemptapitest serves a real attempt API (real TLS, the generated
// loopback certificate, a generated signing key) over a board's writers for
// the duration of a test: the API agents spawned by a test report through.
package attemptapitest

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/internal/httplimit"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/runner/attempttoken/keyfile"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// Options tune Start. Zero values: the real clock, the ladder's TTL and
// ceiling, any free loopback port.
type Options struct {
	Clock   clock.Clock
	TTL     time.Duration
	Ceiling time.Duration
	Listen  string
	Meter   attemptapi.Meter
	Logger  hclog.Logger
	// Pods and Decisions: see attemptapi.ServerConfig (the pod proof of
	// exchanges, and the judgments handed on).
	Pods      attemptapi.PodVerifier
	Decisions func(ctx context.Context, ds []sdk.Decision)
	// StateDir holds the generated key and certificate; a second Start on
	// the same StateDir and Listen is the same API restarted. Default: a
	// directory of the test's.
	StateDir string
	// Clients bound one client's connections and calls. Default: the
	// attempt API's defaults counted per 10ms (tests' ladders heartbeat
	// that fast), so that only a test of the bounds meets them.
	Clients httplimit.Clients
}

// API is a served attempt API.
type API struct {
	Keys   *attempttoken.Keyring
	Issuer attempttoken.Issuer
	URL    string
	CA     string

	stop func()
}

// Stop stops serving (the API's outage); the test's end stops it too.
func (a *API) Stop() { a.stop() }

// Start serves the API until the test ends.
func Start(t testing.TB, b attemptapi.Board, o Options) *API {
	t.Helper()
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.TTL == 0 {
		o.TTL = ladder.Defaults().AttemptTokenTTL
	}
	if o.Ceiling == 0 {
		o.Ceiling = ladder.Defaults().CredentialCeiling
	}
	if o.Listen == "" {
		o.Listen = "127.0.0.1:0"
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	state := o.StateDir
	if state == "" {
		state = filepath.Join(t.TempDir(), "attempt-api")
	}
	kr, err := keyfile.LoadOrCreate(filepath.Join(state, "signing-keys.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	if o.Clients == (httplimit.Clients{}) {
		o.Clients = httplimit.DefaultAttemptAPIClients(10 * time.Millisecond)
	}
	srv, err := attemptapi.NewServer(attemptapi.ServerConfig{Keys: func() *attempttoken.Keyring { return kr },
		TTL: o.TTL, Ceiling: o.Ceiling, Board: b, Meter: o.Meter, Clock: o.Clock, Logger: o.Logger, Clients: o.Clients,
		Pods: o.Pods, Decisions: o.Decisions})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	connMeter, _ := o.Meter.(attemptapi.ConnMeter)
	ln, err := attemptapi.Listen(ctx, attemptapi.ListenConfig{Listen: o.Listen, StateDir: state,
		MaxConnsPerAddress: o.Clients.MaxConnsPerAddress, Meter: connMeter, Logger: o.Logger})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := attemptapi.Serve(ctx, ln, srv, o.Logger)
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("attempt api: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return &API{Keys: kr, URL: ln.URL, CA: ln.CA, stop: stop,
		Issuer: attempttoken.Issuer{Keys: func() *attempttoken.Keyring { return kr }, TTL: o.TTL, API: ln.URL, CA: ln.CA}}
}

// FreeAddr returns a loopback address with a port free right now: for a
// configuration whose replicas must share one attempt API address (and
// keep it across restarts) without colliding with other tests.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// Meter is an attemptapi.Meter that counts what the API meters: its calls
// by "call/result" (Count) and its credential renewals by kind (Renewals).
// The zero value is ready; it is safe for concurrent use.
type Meter struct {
	mu       sync.Mutex
	calls    map[string]int
	renewals map[string]int
	conns    map[string]int
}

// AttemptAPIConnection counts what the listener did to a connection
// (attemptapi.ConnMeter).
func (m *Meter) AttemptAPIConnection(result string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.conns == nil {
		m.conns = map[string]int{}
	}
	m.conns[result]++
}

// Conns is how many connections were metered under result.
func (m *Meter) Conns(result string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.conns[result]
}

// AttemptAPICall counts the call under "call/result".
func (m *Meter) AttemptAPICall(call, result string, _ time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.calls == nil {
		m.calls = map[string]int{}
	}
	m.calls[call+"/"+result]++
}

// CredentialRenewal counts the renewal under its kind.
func (m *Meter) CredentialRenewal(renewal string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.renewals == nil {
		m.renewals = map[string]int{}
	}
	m.renewals[renewal]++
}

// Count is how many calls were metered under key ("call/result").
func (m *Meter) Count(key string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls[key]
}

// Renewals is how many renewals of the kind were metered.
func (m *Meter) Renewals(renewal string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.renewals[renewal]
}

// String lists what was metered, for a test's failure message.
func (m *Meter) String() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return fmt.Sprintf("calls %v, renewals %v", m.calls, m.renewals)
}

package attemptapi_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/internal/httplimit"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/sdktest"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// floodAgents is how many honest agents heartbeat beside the flood.
const floodAgents = 100

// floodBundle is a real attempt API (real TLS, a real board) with
// floodAgents honest agents and one attacker, each with its own running
// attempt and token, on a fake clock.
type floodBundle struct {
	pool     *pgxpool.Pool
	clk      *clock.Fake
	meter    *attemptapitest.Meter
	log      *sdktest.LogBuffer
	ln       *attemptapi.Listener
	agents   []*attemptapi.Client
	attempts []sdk.Attempt
	attacker sdk.Attempt
	token    string // the attacker's own token
}

func floodSetup(t *testing.T, limits httplimit.Limits, clients httplimit.Clients) *floodBundle {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	w := lifecycle.New(pool, lifecycle.Options{})
	kr, err := attempttoken.NewKeyring(newKey("k1"))
	if err != nil {
		t.Fatal(err)
	}
	b := &floodBundle{pool: pool, clk: clock.NewFake(base), meter: &attemptapitest.Meter{}, log: &sdktest.LogBuffer{}}
	tasks := make([]lifecycle.NewTask, floodAgents+1)
	for i := range tasks {
		tasks[i] = lifecycle.NewTask{TaskID: fmt.Sprintf("a%03d", i), Executor: sdk.ExecutorLite, Command: "true"}
	}
	tasks[floodAgents].TaskID = "attacker"
	if err := w.CreateRun(ctx, lifecycle.NewRun{RunID: "flood", DagID: "dag", Tasks: tasks}, base); err != nil {
		t.Fatal(err)
	}
	tokens := make([]string, len(tasks))
	for i, tk := range tasks {
		a := sdk.Attempt{RunID: "flood", TaskID: tk.TaskID, Try: 1}
		for _, step := range []func(context.Context, sdk.Attempt, time.Time) (bool, error){w.Enqueue, w.Queue} {
			if ok, err := step(ctx, a, base); err != nil || !ok {
				t.Fatal(ok, err)
			}
		}
		if term, err := w.Running(ctx, a, base); err != nil || term {
			t.Fatal(term, err)
		}
		if tokens[i], _, err = kr.Mint(a, base, ttl); err != nil {
			t.Fatal(err)
		}
		if i < floodAgents {
			b.attempts = append(b.attempts, a)
		} else {
			b.attacker, b.token = a, tokens[i]
		}
	}
	logger := hclog.New(&hclog.LoggerOptions{Output: b.log, Level: hclog.Info})
	srv, err := attemptapi.NewServer(attemptapi.ServerConfig{Keys: func() *attempttoken.Keyring { return kr },
		TTL: ttl, Board: w, Meter: b.meter, Clock: b.clk, Logger: logger, Clients: clients})
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	b.ln, err = attemptapi.Listen(sctx, attemptapi.ListenConfig{Listen: "127.0.0.1:0", StateDir: filepath.Join(t.TempDir(), "state"),
		Limits: limits, MaxConnsPerAddress: clients.MaxConnsPerAddress, Meter: b.meter, Logger: logger, Clock: b.clk})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := attemptapi.Serve(sctx, b.ln, srv, hclog.NewNullLogger())
	for i := range floodAgents {
		c, err := attemptapi.NewClient(b.ln.URL, tokens[i], b.ln.CA)
		if err != nil {
			t.Fatal(err)
		}
		b.agents = append(b.agents, c)
	}
	t.Cleanup(func() {
		for _, c := range b.agents {
			c.Close()
		}
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return b
}

// round has every honest agent heartbeat once, all at once, and checks
// that every heartbeat was accepted and is on the board at the fake
// clock's now: none of them would be read silent by the agent-lost reaper.
func (b *floodBundle) round(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	errs := make([]error, floodAgents)
	var wg sync.WaitGroup
	for i, c := range b.agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.Heartbeat(ctx, b.attempts[i])
			if err == nil && resp.ShouldTerminate {
				err = errors.New("answered should_terminate")
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("agent %s: heartbeat at %s failed: %v", b.attempts[i].TaskID, b.clk.Now().Format(time.TimeOnly), err)
		}
	}
	now := b.clk.Now()
	var landed, silent int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE last_heartbeat_at = $1),
	        count(*) FILTER (WHERE last_heartbeat_at IS NULL OR last_heartbeat_at < $2)
	   FROM task_instances WHERE run_id = 'flood' AND task_id <> 'attacker' AND state = 'running'`,
		now, now.Add(-ladder.Defaults().AgentLost)).Scan(&landed, &silent); err != nil {
		t.Fatal(err)
	}
	if landed != floodAgents || silent != 0 {
		t.Fatalf("at %s: %d of %d agents' heartbeats on the board, %d silent past agent_lost", now.Format(time.TimeOnly),
			landed, floodAgents, silent)
	}
}

// waitFor polls cond (an event the server makes happen, never the passing
// of a threshold), failing after a generous bound.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: it never happened", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// dialFrom opens a raw TCP connection to the API from the local address
// ip (any 127/8 address is this host's).
func (b *floodBundle) dialFrom(t *testing.T, ip string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	c, err := d.Dial("tcp", b.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// httpFrom is an HTTP client of the API whose connections come from ip.
func (b *floodBundle) httpFrom(t *testing.T, ip string) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(b.ln.CA))
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool},
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}).DialContext, MaxIdleConnsPerHost: 16}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// call posts a heartbeat of the attacker's attempt with token and returns
// the status.
func (b *floodBundle) call(t *testing.T, hc *http.Client, token string) int {
	t.Helper()
	body := fmt.Sprintf(`{"run_id":%q,"task_id":%q,"try":%d,"epoch":%d}`, b.attacker.RunID, b.attacker.TaskID,
		b.attacker.Try, b.attacker.Epoch)
	req, err := http.NewRequest(http.MethodPost, b.ln.URL+attemptapi.PathHeartbeat, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// TestOneClientCannotSilenceTheOthers: one task holding connections to the
// attempt API, or hammering it with its own token, while 100 other agents
// heartbeat: every one of the 100 heartbeats lands on the board in every
// round (none would be read silent by the agent-lost reaper), and the
// flood is refused (a connection closed or refused, a call answered 429),
// metered and logged at a bounded rate. Real TLS, a real board; the fake
// clock moves every bound, nothing waits for one.
func TestOneClientCannotSilenceTheOthers(t *testing.T) {
	long := httplimit.Limits{ReadHeaderTimeout: time.Minute, ReadTimeout: time.Minute, WriteTimeout: time.Minute,
		IdleTimeout: 10 * time.Minute, MaxConns: 128}
	bounds := httplimit.Clients{MaxConnsPerAddress: 8, AddressRequests: 50, SubjectRequests: 10, SubjectInFlight: 2,
		Per: ladder.Defaults().Heartbeat}

	t.Run("HolderOnItsOwnAddressKeepsOnlyItsShare", func(t *testing.T) {
		b := floodSetup(t, long, bounds)
		// A pod (its own source address) opens 40 connections and says
		// nothing on them: it keeps 8. Once its first 8 are past their
		// grace, each new one closes one of them; when all 8 are new, the
		// next is refused.
		for range 8 {
			b.dialFrom(t, "127.0.0.2")
		}
		waitFor(t, "the first 8 connections accepted", func() bool { _, n := b.ln.Open("127.0.0.2"); return n == 8 })
		b.clk.Advance(httplimit.NewGraceDefault)
		for range 32 {
			b.dialFrom(t, "127.0.0.2")
		}
		waitFor(t, "the holder's 32 further connections closed to make room or refused", func() bool {
			return b.meter.Conns(attemptapi.ConnEvictedAddressCap)+b.meter.Conns(attemptapi.ConnRefusedAddressCap) == 32
		})
		if ev, ref := b.meter.Conns(attemptapi.ConnEvictedAddressCap), b.meter.Conns(attemptapi.ConnRefusedAddressCap); ev != 8 || ref != 24 {
			t.Errorf("%d of the holder's connections closed to make room and %d refused, want 8 and 24", ev, ref)
		}
		if _, n := b.ln.Open("127.0.0.2"); n > 8 {
			t.Fatalf("the holder's address has %d connections open, its cap is 8", n)
		}
		b.round(t)
		b.clk.Advance(ladder.Defaults().Heartbeat)
		b.round(t)
		for _, line := range []string{"closed to make room", "a new one refused"} {
			if n := strings.Count(b.log.String(), line); n != 1 {
				t.Errorf("%q logged %d times in one period, want once (the log is bounded per period):\n%s", line, n, b.log)
			}
		}
	})

	t.Run("HolderOnTheSharedAddressGivesWay", func(t *testing.T) {
		// Lite: every agent dials from 127.0.0.1, the holder too. It fills
		// the server's cap with connections that say nothing; once they are
		// past their grace, each agent's new connection closes one.
		b := floodSetup(t, long, bounds)
		for range long.MaxConns {
			b.dialFrom(t, "127.0.0.1")
		}
		waitFor(t, "the holder filling the cap", func() bool { n, _ := b.ln.Open(""); return n == long.MaxConns })
		b.clk.Advance(httplimit.NewGraceDefault)
		b.round(t)
		if n := b.meter.Conns(attemptapi.ConnEvictedServerCap); n < floodAgents {
			t.Errorf("%d of the holder's connections closed to make room, want at least %d", n, floodAgents)
		}
		b.clk.Advance(ladder.Defaults().Heartbeat)
		b.round(t)
	})

	t.Run("TokenFloodRefusedWhileOthersLand", func(t *testing.T) {
		b := floodSetup(t, long, bounds)
		hc := b.httpFrom(t, "127.0.0.1")
		var (
			mu       sync.Mutex
			statuses = map[int]int{}
			wg       sync.WaitGroup
		)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 40 {
					s := b.call(t, hc, b.token)
					mu.Lock()
					statuses[s]++
					mu.Unlock()
				}
			}()
		}
		b.round(t)
		wg.Wait()
		if statuses[http.StatusOK] > bounds.SubjectRequests || statuses[http.StatusTooManyRequests] < 320-bounds.SubjectRequests {
			t.Fatalf("the attacker's 320 calls in one heartbeat: %v, want at most %d answered and the rest 429",
				statuses, bounds.SubjectRequests)
		}
		if got := b.meter.Count("heartbeat/" + attemptapi.CodeTooManyRequests); got != statuses[http.StatusTooManyRequests] {
			t.Errorf("metered %d refusals, answered %d", got, statuses[http.StatusTooManyRequests])
		}
		if n := strings.Count(b.log.String(), "calls per heartbeat: refused") + strings.Count(b.log.String(), "calls in flight: refused"); n == 0 || n > 2 {
			t.Errorf("%d refusal lines for %d refusals in one period, want one per kind at most:\n%s", n,
				statuses[http.StatusTooManyRequests], b.log)
		}
		// A rate, not a ban: a heartbeat later the token may call again.
		b.clk.Advance(ladder.Defaults().Heartbeat)
		if s := b.call(t, hc, b.token); s != http.StatusOK {
			t.Fatalf("a heartbeat later the attacker's call is answered %d", s)
		}
		b.round(t)
	})

	t.Run("AddressFloodRefused", func(t *testing.T) {
		b := floodSetup(t, long, bounds)
		hc := b.httpFrom(t, "127.0.0.2")
		statuses := map[int]int{}
		for range bounds.AddressRequests + 20 {
			statuses[b.call(t, hc, "rat1.k1.Zm9yZ2Vk.Zm9yZ2Vk")]++
		}
		if statuses[http.StatusTooManyRequests] != 20 || statuses[http.StatusUnauthorized] != bounds.AddressRequests {
			t.Fatalf("%d forged calls from one address: %v, want %d refused as forged, then 20 as too many",
				bounds.AddressRequests+20, statuses, bounds.AddressRequests)
		}
		b.round(t)
	})

	t.Run("CallsInFlightOfOneTokenBounded", func(t *testing.T) {
		// Calls whose body never comes hold a connection each, but only
		// token_calls_in_flight of one token; the next is answered 429 at
		// once. A call with a forged token is refused before its body.
		b := floodSetup(t, long, bounds)
		// send posts a heartbeat of the attacker's attempt whose body claims
		// to be held bytes longer than what is sent.
		send := func(token string, held int) *bufio.Reader {
			c := tls.Client(b.dialFrom(t, "127.0.0.1"), &tls.Config{RootCAs: certPool(b.ln.CA), ServerName: "127.0.0.1"})
			body := fmt.Sprintf(`{"run_id":%q,"task_id":%q,"try":%d}`, b.attacker.RunID, b.attacker.TaskID, b.attacker.Try)
			_, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: reaperd\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s",
				attemptapi.PathHeartbeat, token, len(body)+held, body)
			if err != nil {
				t.Fatal(err)
			}
			return bufio.NewReader(c)
		}
		for range bounds.SubjectInFlight {
			send(b.token, 100)
		}
		waitFor(t, "the held calls in flight", func() bool { return b.ln.Serving() == bounds.SubjectInFlight })
		status := func(r *bufio.Reader) int {
			res, err := http.ReadResponse(r, nil)
			if err != nil {
				t.Fatal(err)
			}
			return res.StatusCode
		}
		if s := status(send(b.token, 0)); s != http.StatusTooManyRequests {
			t.Fatalf("a third call of the token while two are in flight answered %d, want 429", s)
		}
		if !strings.Contains(b.log.String(), "too many calls in flight") {
			t.Errorf("the refusal was not logged:\n%s", b.log)
		}
		if s := status(send("rat1.k1.Zm9yZ2Vk.Zm9yZ2Vk", 100)); s != http.StatusUnauthorized {
			t.Fatalf("a forged token with its body held back answered %d, want 401 before the body", s)
		}
		b.round(t)
	})
}

func certPool(ca string) *x509.CertPool {
	p := x509.NewCertPool()
	p.AppendCertsFromPEM([]byte(ca))
	return p
}

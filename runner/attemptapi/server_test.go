package attemptapi_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/sdktest"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var base = time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)

const (
	ttl           = 10 * time.Minute
	ceiling       = time.Hour
	workerCeiling = 90 * time.Minute
)

// decisionLog keeps the decisions the server handed on.
type decisionLog struct {
	mu sync.Mutex
	ds []sdk.Decision
}

func (l *decisionLog) record(_ context.Context, ds []sdk.Decision) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ds = append(l.ds, ds...)
}

func (l *decisionLog) all() []sdk.Decision {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]sdk.Decision(nil), l.ds...)
}

type bundle struct {
	log       *sdktest.LogBuffer
	pool      *pgxpool.Pool
	w         *lifecycle.Writer
	decisions *decisionLog
	clk       *clock.Fake
	keys      *keyHolder
	meter     *attemptapitest.Meter
	url       string
	ca        string
	issuer    attempttoken.Issuer
}

// keyHolder is the keyring in force, swapped on rotation.
type keyHolder struct {
	mu sync.Mutex
	kr *attempttoken.Keyring
}

func (h *keyHolder) get() *attempttoken.Keyring {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.kr
}

func (h *keyHolder) set(kr *attempttoken.Keyring) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.kr = kr
}

func newKey(id string) attempttoken.Key {
	return attempttoken.Key{ID: id, Secret: bytes.Repeat([]byte(id[:1]), 32)}
}

// setup serves the API over real TLS (the generated loopback certificate)
// on a real board, with a fake clock.
func setup(t *testing.T) *bundle {
	t.Helper()
	return setupWith(t, nil)
}

// setupWith is setup with the server's configuration changed by change
// (nil: none) before the server is built.
func setupWith(t *testing.T, change func(*bundle, *attemptapi.ServerConfig)) *bundle {
	t.Helper()
	pool := pgtest.NewDB(t)
	kr, err := attempttoken.NewKeyring(newKey("k1"))
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{w: lifecycle.New(pool, lifecycle.Options{CredentialCeiling: ceiling}), clk: clock.NewFake(base),
		keys: &keyHolder{kr: kr}, meter: &attemptapitest.Meter{},
		decisions: &decisionLog{}, pool: pool, log: &sdktest.LogBuffer{}}
	cfg := attemptapi.ServerConfig{Keys: b.keys.get, TTL: ttl, Ceiling: ceiling,
		WorkerCeiling: workerCeiling, Board: b.w, Meter: b.meter, Decisions: b.decisions.record, Clock: b.clk,
		Logger: hclog.New(&hclog.LoggerOptions{Output: b.log, Level: hclog.Info})}
	if change != nil {
		change(b, &cfg)
	}
	srv, err := attemptapi.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := attemptapi.Listen(ctx, attemptapi.ListenConfig{Listen: "127.0.0.1:0",
		StateDir: filepath.Join(t.TempDir(), "state")})
	if err != nil {
		t.Fatal(err)
	}
	done := attemptapi.Serve(ctx, ln, srv, hclog.NewNullLogger())
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	b.url, b.ca = ln.URL, ln.CA
	b.issuer = attempttoken.Issuer{Keys: b.keys.get, TTL: ttl, API: ln.URL, CA: ln.CA}
	return b
}

// run creates a running run with the named lite tasks.
func (b *bundle) run(t *testing.T, runID string, tasks ...string) {
	t.Helper()
	var nt []lifecycle.NewTask
	for _, id := range tasks {
		nt = append(nt, lifecycle.NewTask{TaskID: id, Executor: sdk.ExecutorLite, Retries: 1, Command: "true"})
	}
	ctx := context.Background()
	if err := b.w.CreateRun(ctx, lifecycle.NewRun{RunID: runID, DagID: "dag", Tasks: nt}, base.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
}

// dispatch queues the attempt, mints its credential as the runner does,
// and returns a client holding the working token it exchanged the
// bootstrap token for, as the agent does first.
func (b *bundle) dispatch(t *testing.T, a sdk.Attempt) *attemptapi.Client {
	t.Helper()
	c, _ := b.dispatchBootstrap(t, a)
	if term, err := c.Exchange(context.Background(), a); err != nil || term {
		t.Fatalf("exchange %s: %v %v", a, term, err)
	}
	return c
}

// dispatchBootstrap is dispatch up to the exchange: the client holds the
// bootstrap token, returned too (what the pod spec shows).
func (b *bundle) dispatchBootstrap(t *testing.T, a sdk.Attempt) (*attemptapi.Client, string) {
	t.Helper()
	ctx := context.Background()
	now := b.clk.Now()
	for _, step := range []func(context.Context, sdk.Attempt, time.Time) (bool, error){b.w.Enqueue, b.w.Queue} {
		if ok, err := step(ctx, a, now); err != nil || !ok {
			t.Fatalf("dispatch %s: %v %v", a, ok, err)
		}
	}
	cred, err := b.issuer.Mint(a, now)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := b.w.RecordMint(ctx, a, cred.Claims.MintedAt); err != nil || !ok {
		t.Fatalf("record mint %s: %v %v", a, ok, err)
	}
	c, err := attemptapi.NewClient(b.url, cred.Token, b.ca)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, cred.Token
}

// oneRunning makes run r1 of one task, t1, and reports its first attempt
// running through the API, as its agent does: the attempt and its agent's
// client.
func (b *bundle) oneRunning(t *testing.T) (sdk.Attempt, *attemptapi.Client) {
	t.Helper()
	b.run(t, "r1", "t1")
	a := sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1}
	c := b.dispatch(t, a)
	if term, err := c.Running(context.Background(), a); err != nil || term {
		t.Fatalf("running %s: %v %v", a, term, err)
	}
	return a, c
}

func (b *bundle) ti(t *testing.T, a sdk.Attempt) board.TaskInstance {
	t.Helper()
	ti, err := b.w.TaskInstance(context.Background(), a.RunID, a.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	return ti
}

func refusedWith(t *testing.T, err error, code string) {
	t.Helper()
	var ce *attemptapi.CallError
	if !errors.As(err, &ce) || ce.Body.Code != code || !errors.Is(err, attemptapi.ErrRefused) {
		t.Fatalf("err %v, want a refusal %q", err, code)
	}
}

func TestAttemptAPI(t *testing.T) {
	ctx := context.Background()

	t.Run("AgentLifeThroughTheAPI_RunningHeartbeatReport", func(t *testing.T) {
		b := setup(t)
		b.run(t, "r1", "t1")
		a := sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1}
		c := b.dispatch(t, a)
		if term, err := c.Running(ctx, a); err != nil || term {
			t.Fatalf("running: %v %v", term, err)
		}
		b.clk.Advance(ttl / 4)
		resp, err := c.Heartbeat(ctx, a)
		if err != nil || resp.ShouldTerminate || resp.Token == "" {
			t.Fatalf("heartbeat: %+v %v", resp, err)
		}
		if term, err := c.Report(ctx, a, attemptapi.ReportBody{State: sdk.StateSuccess}); err != nil || term {
			t.Fatalf("report: %v %v", term, err)
		}
		ti := b.ti(t, a)
		if ti.State != sdk.StateSuccess || !ti.LastHeartbeatAt.Equal(base.Add(ttl/4)) ||
			!ti.CredentialMintedAt.Equal(base) || !ti.CredentialRenewedAt.Equal(base.Add(ttl/4)) {
			t.Fatalf("row %+v", ti)
		}
	})

	t.Run("NotRenewedWhenNotDue_TheAgentKeepsItsToken", func(t *testing.T) {
		b := setup(t)
		a, c := b.oneRunning(t)
		held := c.Token()
		// Heartbeats while the token has more than three quarters of its
		// TTL left: recorded, answered without a token, nothing renewed.
		for b.clk.Now().Sub(base) < ttl/4-15*time.Second {
			b.clk.Advance(15 * time.Second)
			resp, err := c.Heartbeat(ctx, a)
			if err != nil || resp.ShouldTerminate || resp.Token != "" || resp.Capped || c.Token() != held {
				t.Fatalf("heartbeat at +%s, not due: %+v %v (token kept: %v)", b.clk.Now().Sub(base), resp, err, c.Token() == held)
			}
			if ti := b.ti(t, a); !ti.LastHeartbeatAt.Equal(b.clk.Now()) || !ti.CredentialRenewedAt.IsZero() {
				t.Fatalf("row after a heartbeat not due: heartbeat %v renewed %v", ti.LastHeartbeatAt, ti.CredentialRenewedAt)
			}
		}
		if got := b.meter.Renewals("renewed"); got != 0 {
			t.Fatalf("%d renewals metered, none due", got)
		}
		// A quarter of the TTL spent: due, renewed, and the agent holds the
		// new token.
		b.clk.Advance(15 * time.Second)
		resp, err := c.Heartbeat(ctx, a)
		if err != nil || resp.Token == "" || c.Token() != resp.Token || !resp.ExpiresAt.Equal(b.clk.Now().Add(ttl)) {
			t.Fatalf("heartbeat at +%s, due: %+v %v", b.clk.Now().Sub(base), resp, err)
		}
		if ti := b.ti(t, a); !ti.CredentialRenewedAt.Equal(b.clk.Now()) {
			t.Fatalf("renewal recorded at %v, want %v", ti.CredentialRenewedAt, b.clk.Now())
		}
	})

	t.Run("TokenCannotTouchAnotherAttemptTryEpochOrRun", func(t *testing.T) {
		b := setup(t)
		b.run(t, "r1", "t1", "t2")
		b.run(t, "r2", "t1")
		a := sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1}
		c := b.dispatch(t, a)
		if _, err := c.Running(ctx, a); err != nil {
			t.Fatal(err)
		}
		others := []sdk.Attempt{
			{RunID: "r1", TaskID: "t2", Try: 1},           // another task of the run
			{RunID: "r1", TaskID: "t1", Try: 2},           // another try
			{RunID: "r1", TaskID: "t1", Try: 1, Epoch: 1}, // another epoch
			{RunID: "r2", TaskID: "t1", Try: 1},           // another run
		}
		for _, o := range others {
			if o.TaskID == "t2" || o.RunID == "r2" {
				b.dispatch(t, o) // a live victim, queued with a credential of its own
			}
		}
		before := map[sdk.Attempt]board.TaskInstance{}
		for _, o := range append(others, a) {
			before[o] = b.ti(t, o)
		}
		b.clk.Advance(time.Second)
		for _, o := range others {
			_, err := c.Running(ctx, o)
			refusedWith(t, err, attemptapi.CodeWrongScope)
			_, err = c.Heartbeat(ctx, o)
			refusedWith(t, err, attemptapi.CodeWrongScope)
			_, err = c.Report(ctx, o, attemptapi.ReportBody{State: sdk.StateFailed, Reason: "evil"})
			refusedWith(t, err, attemptapi.CodeWrongScope)
			_, err = c.State(ctx, o)
			refusedWith(t, err, attemptapi.CodeWrongScope)
		}
		for o, was := range before {
			if now := b.ti(t, o); now != was {
				t.Errorf("%s changed by refused calls:\nwas %+v\nnow %+v", o, was, now)
			}
		}
		if got := b.meter.Count("report/" + attemptapi.CodeWrongScope); got != len(others) {
			t.Errorf("refused reports metered %d, want %d", got, len(others))
		}
		// Its own attempt still reads.
		if resp, err := c.State(ctx, a); err != nil || resp.State != sdk.StateRunning {
			t.Fatalf("own state: %+v %v", resp, err)
		}
	})

	t.Run("ExpiredTokenRefusedAndNothingWritten", func(t *testing.T) {
		b := setup(t)
		b.run(t, "r1", "t1")
		a := sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1}
		c := b.dispatch(t, a)
		if _, err := c.Running(ctx, a); err != nil {
			t.Fatal(err)
		}
		was := b.ti(t, a)
		b.clk.Advance(ttl) // never renewed: the minted token lapses
		_, err := c.Heartbeat(ctx, a)
		refusedWith(t, err, attemptapi.CodeExpired)
		_, err = c.Report(ctx, a, attemptapi.ReportBody{State: sdk.StateSuccess})
		refusedWith(t, err, attemptapi.CodeExpired)
		if now := b.ti(t, a); now != was {
			t.Fatalf("an expired token wrote:\nwas %+v\nnow %+v", was, now)
		}
		if b.meter.Count("heartbeat/"+attemptapi.CodeExpired) != 1 {
			t.Fatal("the refused heartbeat was not metered")
		}
	})

	t.Run("ForgedOrMissingTokenRefused", func(t *testing.T) {
		b := setup(t)
		b.run(t, "r1", "t1")
		a := sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1}
		b.dispatch(t, a)
		was := b.ti(t, a)
		evil, _ := attempttoken.NewKeyring(attempttoken.Key{ID: "k1", Secret: bytes.Repeat([]byte("x"), 32)})
		tok, _, _ := evil.Mint(a, base, ttl)
		c, _ := attemptapi.NewClient(b.url, tok, b.ca)
		defer c.Close()
		_, err := c.Running(ctx, a)
		refusedWith(t, err, attemptapi.CodeForged)
		req, _ := http.NewRequest(http.MethodPost, b.url+attemptapi.PathRunning, strings.NewReader(`{"run_id":"r1","task_id":"t1","try":1}`))
		res, err := insecureDo(b, req)
		if err != nil || res != http.StatusUnauthorized {
			t.Fatalf("no token: status %d err %v", res, err)
		}
		if now := b.ti(t, a); now != was {
			t.Fatalf("a forged token wrote:\nwas %+v\nnow %+v", was, now)
		}
	})

	t.Run("RenewalStopsAtTheCeiling", func(t *testing.T) {
		b := setup(t)
		b.run(t, "r1", "t1")
		a := sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1}
		c := b.dispatch(t, a)
		if _, err := c.Running(ctx, a); err != nil {
			t.Fatal(err)
		}
		// Heartbeat every 5 minutes (inside the TTL) up to the ceiling.
		var last time.Time
		for b.clk.Now().Sub(base) < ceiling-5*time.Minute {
			b.clk.Advance(5 * time.Minute)
			resp, err := c.Heartbeat(ctx, a)
			if err != nil || resp.Token == "" || resp.Capped {
				t.Fatalf("heartbeat at +%s: %+v %v", b.clk.Now().Sub(base), resp, err)
			}
			last = b.clk.Now()
		}
		b.clk.Advance(5 * time.Minute) // at the ceiling
		resp, err := c.Heartbeat(ctx, a)
		if err != nil || resp.Token != "" || !resp.Capped {
			t.Fatalf("heartbeat at the ceiling: %+v %v", resp, err)
		}
		ti := b.ti(t, a)
		if !ti.CredentialRenewedAt.Equal(last) || !ti.CredentialCappedAt.Equal(base.Add(ceiling)) ||
			!ti.LastHeartbeatAt.Equal(base.Add(ceiling)) {
			t.Fatalf("row %+v", ti)
		}
		// The last renewed token lapses one TTL after its renewal.
		b.clk.Set(last.Add(ttl))
		_, err = c.Heartbeat(ctx, a)
		refusedWith(t, err, attemptapi.CodeExpired)
		_, err = c.Report(ctx, a, attemptapi.ReportBody{State: sdk.StateSuccess})
		refusedWith(t, err, attemptapi.CodeExpired)
		if b.ti(t, a).State != sdk.StateRunning {
			t.Fatal("a report past the lapsed credential was applied")
		}
	})

	t.Run("NonPositiveCeilingRenewsWithoutLimit", func(t *testing.T) {
		b := setup(t)
		srv, _ := attemptapi.NewServer(attemptapi.ServerConfig{Keys: b.keys.get, TTL: ttl, Ceiling: 0, Board: b.w, Clock: b.clk})
		b.run(t, "r1", "t1")
		a := sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1}
		b.dispatch(t, a)
		// The credential the board records is the one the token below
		// carries: minted ten ceilings ago.
		if ok, err := b.w.RecordMint(ctx, a, base.Add(-10*ceiling)); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if ok, err := b.w.Running(ctx, a, base); err != nil || ok {
			t.Fatal(ok, err)
		}
		_, claims, _ := b.keys.get().Mint(a, base.Add(-10*ceiling), ttl)
		tok, _, _ := b.keys.get().Renew(claims, base.Add(-ttl/2), ttl) // due
		rec := serveLocal(t, srv, tok, a)
		if rec.Token == "" || rec.Capped {
			t.Fatalf("heartbeat with no ceiling: %+v", rec)
		}
	})

	t.Run("KeyRotationKeepsALiveAgentWorking", func(t *testing.T) {
		b := setup(t)
		b.run(t, "r1", "t1")
		a := sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1}
		c := b.dispatch(t, a) // signed with k1
		if _, err := c.Running(ctx, a); err != nil {
			t.Fatal(err)
		}
		rotated, err := attempttoken.NewKeyring(newKey("k2"), newKey("k1"))
		if err != nil {
			t.Fatal(err)
		}
		b.keys.set(rotated)
		b.clk.Advance(15 * time.Second)
		resp, err := c.Heartbeat(ctx, a)
		if err != nil || !strings.HasPrefix(resp.Token, "rat1.k2.") {
			t.Fatalf("heartbeat with a k1 token after rotation: %+v %v", resp, err)
		}
		// k1 retired: the agent holds a k2 token now and goes on.
		only2, _ := attempttoken.NewKeyring(newKey("k2"))
		b.keys.set(only2)
		b.clk.Advance(15 * time.Second)
		if _, err := c.Heartbeat(ctx, a); err != nil {
			t.Fatalf("heartbeat after k1 retired: %v", err)
		}
		if term, err := c.Report(ctx, a, attemptapi.ReportBody{State: sdk.StateSuccess}); err != nil || term {
			t.Fatalf("report: %v %v", term, err)
		}
	})

	// A task that kept its earlier attempt's token (the attempt was
	// re-placed) cannot move the silence replay judges the new attempt by,
	// nor rewrite its own recorded history: its heartbeats are answered
	// should_terminate or refused, metered, and change no gap; the gap is
	// measured on the server's clock, never on anything a caller sends.
	t.Run("AnOldTokenCannotMoveTheNewAttemptsSilenceOrItsOwnHistory", func(t *testing.T) {
		b := setup(t)
		b.run(t, "r1", "t1")
		old := sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1}
		oc := b.dispatch(t, old)
		if _, err := oc.Running(ctx, old); err != nil {
			t.Fatal(err)
		}
		b.clk.Advance(time.Minute)
		if resp, err := oc.Heartbeat(ctx, old); err != nil || resp.ShouldTerminate {
			t.Fatalf("heartbeat: %+v %v", resp, err)
		}
		if ok, err := b.w.Fail(ctx, old, []string{sdk.StateRunning}, lifecycle.Failure{Kind: sdk.MarkInfra, Reason: "agent_lost"},
			b.clk.Now()); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if rel, err := b.w.Replace(ctx, old, b.clk.Now()); err != nil || !rel.Applied {
			t.Fatalf("re-place: %+v %v", rel, err)
		}
		cur := sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1, Epoch: 1}
		nc := b.dispatch(t, cur)
		if _, err := nc.Running(ctx, cur); err != nil {
			t.Fatal(err)
		}
		b.clk.Advance(2 * time.Second)
		if resp, err := nc.Heartbeat(ctx, cur); err != nil || resp.ShouldTerminate {
			t.Fatalf("heartbeat of the current attempt: %+v %v", resp, err)
		}
		gaps := func() (current, history string) {
			t.Helper()
			if err := b.pool.QueryRow(ctx, `SELECT max_heartbeat_gap::text FROM task_instances WHERE run_id = 'r1'`).Scan(&current); err != nil {
				t.Fatal(err)
			}
			if err := b.pool.QueryRow(ctx, `SELECT coalesce(string_agg(attempt_epoch || ':' || max_heartbeat_gap::text, ','), '')
                FROM attempt_history`).Scan(&history); err != nil {
				t.Fatal(err)
			}
			return current, history
		}
		curBefore, histBefore := gaps()
		if curBefore != "00:00:02" || histBefore != "0:00:01:00" {
			t.Fatalf("gaps before the attack: current %s, history %s", curBefore, histBefore)
		}
		stale := b.meter.Count("heartbeat/" + attemptapi.CodeWrongScope)
		b.clk.Advance(5 * time.Minute) // a long silence the attacker would like recorded, inside its token's life
		resp, err := oc.Heartbeat(ctx, old)
		if err != nil || !resp.ShouldTerminate || resp.Token != "" {
			t.Fatalf("the old attempt's heartbeat: %+v %v, want should_terminate and no token", resp, err)
		}
		_, err = oc.Heartbeat(ctx, cur)
		refusedWith(t, err, attemptapi.CodeWrongScope)
		if got := b.meter.Count("heartbeat/" + attemptapi.CodeWrongScope); got != stale+1 {
			t.Errorf("refused heartbeat metered %d times, want %d", got, stale+1)
		}
		if logs := b.log.String(); !strings.Contains(logs, "code=wrong_scope") || !strings.Contains(logs, "call=heartbeat") {
			t.Errorf("the refused heartbeat was not logged:\n%s", logs)
		}
		if c, h := gaps(); c != curBefore || h != histBefore {
			t.Fatalf("the attack moved the gaps: current %s (was %s), history %s (was %s)", c, curBefore, h, histBefore)
		}
	})

	t.Run("MovedOnAttemptIsToldToTerminate", func(t *testing.T) {
		b := setup(t)
		b.run(t, "r1", "t1")
		a := sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1}
		c := b.dispatch(t, a)
		if _, err := c.Running(ctx, a); err != nil {
			t.Fatal(err)
		}
		if ok, err := b.w.Fail(ctx, a, []string{sdk.StateRunning}, lifecycle.Failure{Kind: sdk.MarkInfra, Reason: "agent_lost"}, base); err != nil || !ok {
			t.Fatal(ok, err)
		}
		resp, err := c.Heartbeat(ctx, a)
		if err != nil || !resp.ShouldTerminate || resp.Token != "" {
			t.Fatalf("heartbeat of a reaped attempt: %+v %v", resp, err)
		}
		if term, err := c.Report(ctx, a, attemptapi.ReportBody{State: sdk.StateSuccess}); err != nil || !term {
			t.Fatalf("report of a reaped attempt: %v %v", term, err)
		}
		if ti := b.ti(t, a); ti.State != sdk.StateFailed {
			t.Fatalf("state %s", ti.State)
		}
	})
}

// insecureDo sends a hand-made request (trusting the API's CA) and returns
// its status.
func insecureDo(b *bundle, req *http.Request) (int, error) {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(b.ca))
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer hc.CloseIdleConnections()
	res, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	res.Body.Close()
	return res.StatusCode, nil
}

// serveLocal runs one heartbeat through srv in process.
func serveLocal(t *testing.T, srv http.Handler, tok string, a sdk.Attempt) attemptapi.Response {
	t.Helper()
	body, _ := json.Marshal(attemptapi.Request{RunID: a.RunID, TaskID: a.TaskID, Try: a.Try, Epoch: a.Epoch})
	req := httptest.NewRequest(http.MethodPost, attemptapi.PathHeartbeat, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	var resp attemptapi.Response
	if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil {
		t.Fatal(err)
	}
	return resp
}

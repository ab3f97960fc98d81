package main

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/sdktest"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// cutProxy relays TCP connections to an address until cut, which closes
// every connection it holds: the network between an agent and the API
// failing mid-call.
type cutProxy struct {
	addr string

	mu    sync.Mutex
	conns []net.Conn
}

func startCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		p.cut()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			for _, pair := range [][2]net.Conn{{in, out}, {out, in}} {
				wg.Go(func() {
					_, _ = io.Copy(pair[0], pair[1])
					pair[0].Close()
					pair[1].Close()
				})
			}
		}
	})
	return p
}

func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// answerLosingBoard is the board behind the API. Once lose is called, its
// next bootstrap exchange applies and then never answers: it tells applied
// and holds the call until its client is gone (or the test ends). Every
// other call is the board's own.
type answerLosingBoard struct {
	attemptapi.Board
	mu      sync.Mutex
	losing  bool
	applied chan struct{}
	release chan struct{}
}

func (b *answerLosingBoard) lose() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.losing = true
}

func (b *answerLosingBoard) ExchangeBootstrap(ctx context.Context, a sdk.Attempt, mintedAt, now time.Time) (lifecycle.Exchange, error) {
	b.mu.Lock()
	losing := b.losing
	b.losing = false
	b.mu.Unlock()
	res, err := b.Board.ExchangeBootstrap(ctx, a, mintedAt, now)
	if !losing || err != nil {
		return res, err
	}
	close(b.applied)
	select {
	case <-ctx.Done():
	case <-b.release:
	}
	return "", errors.New("the answer was lost")
}

// exchangeEnv is a real attempt API over a real board, reached through a
// proxy, and one queued attempt whose bootstrap token was minted and
// recorded as the kube runner does at dispatch.
type exchangeEnv struct {
	pool  *pgxpool.Pool
	board *answerLosingBoard
	proxy *cutProxy
	meter *attemptapitest.Meter
	log   *sdktest.LogBuffer
	cred  attempttoken.Credential
	a     sdk.Attempt
	dir   string
}

func setupExchange(t *testing.T) *exchangeEnv {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	w := lifecycle.New(pool, lifecycle.Options{})
	e := &exchangeEnv{pool: pool, a: sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}, dir: t.TempDir(),
		board: &answerLosingBoard{Board: w, applied: make(chan struct{}), release: make(chan struct{})},
		meter: &attemptapitest.Meter{}, log: &sdktest.LogBuffer{}}
	api := attemptapitest.Start(t, e.board, attemptapitest.Options{Meter: e.meter,
		Logger: hclog.New(&hclog.LoggerOptions{Output: e.log, Level: hclog.Info})})
	// Before the API stops (cleanups run last first): its shutdown waits
	// for a held exchange.
	t.Cleanup(func() { close(e.board.release) })
	e.proxy = startCutProxy(t, strings.TrimPrefix(api.URL, "https://"))
	now := time.Now()
	if err := w.CreateRun(ctx, lifecycle.NewRun{RunID: "r", DagID: "dag", Tasks: []lifecycle.NewTask{
		{TaskID: "t", Executor: sdk.ExecutorKube, Retries: 1, Command: "true"}}}, now.Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	for _, step := range []func(context.Context, sdk.Attempt, time.Time) (bool, error){w.Enqueue, w.Queue} {
		if ok, err := step(ctx, e.a, now); err != nil || !ok {
			t.Fatalf("dispatch %s: %v %v", e.a, ok, err)
		}
	}
	issuer := api.Issuer
	issuer.API = "https://" + e.proxy.addr
	cred, err := issuer.Mint(e.a, now)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := w.RecordMint(ctx, e.a, cred.Claims.MintedAt); err != nil || !ok {
		t.Fatalf("record mint %s: %v %v", e.a, ok, err)
	}
	e.cred = cred
	for _, kv := range cred.Env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	return e
}

// runAgent runs the agent in pod mode on the attempt: its exit code and
// the termination message it left ("" when none).
func (e *exchangeEnv) runAgent(t *testing.T) (int, string) {
	t.Helper()
	msg := filepath.Join(e.dir, "termination-log")
	code := run([]string{"-mode", agent.ModePod, "-termination-message-path", msg, "-reporter", agent.ReporterAPI,
		"-record-dir", filepath.Join(e.dir, "rec"), "-run", e.a.RunID, "-task", e.a.TaskID, "-try", "1",
		"-command", "touch " + filepath.Join(e.dir, "ran")})
	data, err := os.ReadFile(msg)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return code, string(data)
}

// wantSpentRefusals checks the API refused n exchanges bootstrap_spent,
// each metered and logged.
func (e *exchangeEnv) wantSpentRefusals(t *testing.T, n int) {
	t.Helper()
	if got := e.meter.Count(attemptapi.CallExchange + "/" + attemptapi.CodeBootstrapSpent); got != n {
		t.Fatalf("%d exchanges metered %s, want %d", got, attemptapi.CodeBootstrapSpent, n)
	}
	if got := strings.Count(e.log.String(), attemptapi.CodeBootstrapSpent); got < n {
		t.Fatalf("the API logged %s %d times, want at least %d:\n%s", attemptapi.CodeBootstrapSpent, got, n, e.log)
	}
}

// wantBoard checks the attempt is still queued and not started, and
// whether its bootstrap exchange is recorded.
func (e *exchangeEnv) wantBoard(t *testing.T, exchanged bool) {
	t.Helper()
	var state string
	var at *time.Time
	if err := e.pool.QueryRow(context.Background(), `SELECT state, credential_exchanged_at FROM task_instances
        WHERE run_id = $1 AND task_id = $2`, e.a.RunID, e.a.TaskID).Scan(&state, &at); err != nil {
		t.Fatal(err)
	}
	if state != string(sdk.StateQueued) || (at != nil) != exchanged {
		t.Fatalf("attempt %s, exchanged at %v; want queued, exchanged %v", state, at, exchanged)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "ran")); err == nil {
		t.Fatal("the task's code ran")
	}
}

// The agent's exchange of its bootstrap token applies, and its answer (the
// working token) is lost: the connection is cut once the exchange is
// recorded, as when reaperd dies after its commit. The retry is refused
// bootstrap_spent, and no retry can bring the token back. That is an answer
// that never came, not a verdict on the attempt: the agent gives up at once
// (not after the 2-minute pre-start retry), writes the infra marker and
// exits 6, so the attempt is re-placed on the infra rail instead of
// failing the task and spending one of its retries.
func TestPodModeLostExchangeAnswerWritesTheInfraMarker(t *testing.T) {
	e := setupExchange(t)
	e.board.lose()
	go func() {
		<-e.board.applied
		e.proxy.cut()
	}()
	start := time.Now()
	code, msg := e.runAgent(t)
	if code != exitUnanswered {
		t.Fatalf("exit %d, want %d (termination message %q)", code, exitUnanswered, msg)
	}
	if took := time.Since(start); took >= agent.StartRetryDefault {
		t.Fatalf("gave up after %s: the pre-start retry ran out instead", took)
	}
	rec := readRecord(t, filepath.Join(e.dir, "termination-log"))
	if !rec.HonoredInfra() || rec.Attempt() != e.a || rec.Reason != agent.AnswerLostReason {
		t.Fatalf("record %+v is not the agent's infra marker of a lost answer for %s", rec, e.a)
	}
	e.wantSpentRefusals(t, 1) // the retry, once: no retry after it
	e.wantBoard(t, true)
}

// The attack the rule above must not open: somebody copies the bootstrap
// token out of the pod spec and exchanges it before the agent does. The
// agent's own exchange, with no unanswered exchange before it, is refused
// bootstrap_spent and stays a refusal: exit 4, no infra marker (a copy
// buys no re-place on the infra budget), the task never runs, and the
// board holds only the thief's exchange.
func TestPodModeBootstrapSpentByACopyIsARefusal(t *testing.T) {
	e := setupExchange(t)
	thief, err := attemptapi.NewClient("https://"+e.proxy.addr, e.cred.Token, os.Getenv(attempttoken.EnvCA))
	if err != nil {
		t.Fatal(err)
	}
	defer thief.Close()
	if term, err := thief.Exchange(context.Background(), e.a); err != nil || term {
		t.Fatalf("the thief's exchange: %v %v", term, err)
	}
	code, msg := e.runAgent(t)
	if code != exitUnreported {
		t.Fatalf("exit %d, want %d (termination message %q)", code, exitUnreported, msg)
	}
	if msg != "" {
		t.Fatalf("the agent wrote %q; want no record", msg)
	}
	e.wantSpentRefusals(t, 1)
	e.wantBoard(t, true)
}

package attemptapi_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/runner/attempttoken/keyfile"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// BenchmarkHeartbeatLoad1000 is 1,000 agents, each with its own token and
// its own TLS connection, heartbeating once a second against one attempt
// API served over real TLS on a real board, for b.N seconds. It reports the
// heartbeat latency an agent sees (p50, p99) and the board's writes per
// heartbeat (rows updated and transactions committed, read from the
// server's statistics once the API's connections have closed). Each agent's
// first call, which carries its TLS handshake, is reported apart, and so is
// the p99 of the steady state (heartbeats sent from steadyAfter on).
func BenchmarkHeartbeatLoad1000(b *testing.B) { benchHeartbeatLoad(b, 1000) }

// BenchmarkHeartbeatLoad100 is the same with 100 agents: the cost of one
// heartbeat when the API is far from saturated.
func BenchmarkHeartbeatLoad100(b *testing.B) { benchHeartbeatLoad(b, 100) }

// steadyAfter is when the load's steady state begins: the agents' first
// calls, each with a TLS handshake, burst over the first second, and
// heartbeats sent during the next ones can queue behind that burst.
const steadyAfter = 5 * time.Second

// apiApplication names the API's own sessions on the server, so that the
// benchmark can wait for them to end (and their statistics to be flushed).
const apiApplication = "attempt-api-load"

func benchHeartbeatLoad(b *testing.B, loadAgents int) {
	ctx := context.Background()
	setupPool := pgtest.NewDB(b)
	dsn := pgtest.DSN(setupPool)
	w := lifecycle.New(setupPool, lifecycle.Options{})
	kr, err := keyfile.LoadOrCreate(filepath.Join(b.TempDir(), "state", "keys.hcl"))
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	tasks := make([]lifecycle.NewTask, loadAgents)
	for i := range tasks {
		tasks[i] = lifecycle.NewTask{TaskID: fmt.Sprintf("t%04d", i), Executor: sdk.ExecutorLite, Command: "true"}
	}
	if err := w.CreateRun(ctx, lifecycle.NewRun{RunID: "load", DagID: "dag", Tasks: tasks}, now); err != nil {
		b.Fatal(err)
	}
	tokens := make([]string, loadAgents)
	for i, t := range tasks {
		a := sdk.Attempt{RunID: "load", TaskID: t.TaskID, Try: 1}
		for _, step := range []func(context.Context, sdk.Attempt, time.Time) (bool, error){w.Enqueue, w.Queue} {
			if ok, err := step(ctx, a, now); err != nil || !ok {
				b.Fatal(ok, err)
			}
		}
		if term, err := w.Running(ctx, a, now); err != nil || term {
			b.Fatal(term, err)
		}
		if tokens[i], _, err = kr.Mint(a, now, time.Hour); err != nil {
			b.Fatal(err)
		}
	}

	// The API's own pool, as reaperd has (4 connections).
	apiCfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		b.Fatal(err)
	}
	apiCfg.MaxConns = 4
	apiCfg.ConnConfig.RuntimeParams["application_name"] = apiApplication
	apiPool, err := pgxpool.NewWithConfig(ctx, apiCfg)
	if err != nil {
		b.Fatal(err)
	}
	srv, err := attemptapi.NewServer(attemptapi.ServerConfig{Keys: func() *attempttoken.Keyring { return kr },
		TTL: time.Hour, Ceiling: 2 * time.Hour, Board: lifecycle.New(apiPool, lifecycle.Options{}), Clock: clock.Real{}})
	if err != nil {
		b.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	ln, err := attemptapi.Listen(sctx, attemptapi.ListenConfig{Listen: "127.0.0.1:0", StateDir: filepath.Join(b.TempDir(), "state")})
	if err != nil {
		b.Fatal(err)
	}
	served := attemptapi.Serve(sctx, ln, srv, hclog.NewNullLogger())

	before := pgtest.ReadWriteCounts(b, setupPool, "task_instances")

	clients := make([]*attemptapi.Client, loadAgents)
	for i := range clients {
		if clients[i], err = attemptapi.NewClient(ln.URL, tokens[i], ln.CA); err != nil {
			b.Fatal(err)
		}
	}
	var (
		mu        sync.Mutex
		latencies []time.Duration // every heartbeat but each agent's first
		steady    []time.Duration // those sent once every agent's handshake is long done
		firsts    []time.Duration // each agent's first: its TLS handshake included
		failures  int
	)
	b.ResetTimer()
	began := time.Now()
	deadline := began.Add(time.Duration(b.N) * time.Second)
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := sdk.Attempt{RunID: "load", TaskID: tasks[i].TaskID, Try: 1}
			// Agents start spread over the first second, as dispatches are.
			next := time.Now().Add(time.Duration(i) * time.Second / time.Duration(loadAgents))
			for first := true; next.Before(deadline); first = false {
				// The load's own pace, not a wait for anything: each agent
				// beats once a second of wall time, at once when it lags.
				time.Sleep(time.Until(next))
				start := time.Now()
				resp, err := c.Heartbeat(ctx, a)
				took := time.Since(start)
				mu.Lock()
				switch {
				case err != nil || resp.ShouldTerminate:
					failures++
				case first:
					firsts = append(firsts, took)
				default:
					latencies = append(latencies, took)
					if start.Sub(began) >= steadyAfter {
						steady = append(steady, took)
					}
				}
				mu.Unlock()
				next = next.Add(time.Second)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(began)
	b.StopTimer()
	for _, c := range clients {
		c.Close()
	}
	stop()
	if err := <-served; err != nil {
		b.Fatal(err)
	}
	apiPool.Close() // its backends flush their statistics as they exit
	pgtest.WaitSessionsEnd(b, setupPool, apiApplication)
	after := pgtest.ReadWriteCounts(b, setupPool, "task_instances")

	n := len(latencies)
	if len(firsts) == 0 {
		b.Fatalf("no heartbeat succeeded (%d failures)", failures)
	}
	all := n + len(firsts)
	if n == 0 { // one second only (the framework's first run): first calls alone
		latencies = firsts
	}
	q := func(d []time.Duration, p float64) float64 {
		slices.Sort(d)
		return float64(d[min(len(d)-1, int(p*float64(len(d))))]) / float64(time.Millisecond)
	}
	// Each agent beats b.N times, a second apart, later when calls lag:
	// the rate achieved is over the time it took.
	b.ReportMetric(float64(all)/elapsed.Seconds(), "heartbeats/s")
	b.ReportMetric(q(latencies, 0.50), "p50-ms")
	b.ReportMetric(q(latencies, 0.99), "p99-ms")
	b.ReportMetric(q(latencies, 0.999), "p99.9-ms")
	b.ReportMetric(q(firsts, 0.99), "first-call-p99-ms")
	if len(steady) > 0 {
		b.ReportMetric(q(steady, 0.99), "steady-p99-ms")
	}
	b.ReportMetric(float64(after.Updated-before.Updated)/float64(all), "rows-updated/heartbeat")
	// Transactions include this benchmark's own two statistics reads.
	b.ReportMetric(float64(after.Commits-before.Commits)/float64(all), "commits/heartbeat")
	b.ReportMetric(float64(failures), "failed")
}

package scale_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/host/config"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/testkit/machinecpu"
	"github.com/dexaflow/reaper/testkit/massbench"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

const (
	// heartbeatSection names the section's figures.
	heartbeatSection = "heartbeats"
	// heartbeatAgents is the fleet: 150,000 running attempts, each
	// heartbeating once per ladder heartbeat (15 s), is heartbeatRate.
	heartbeatAgents = 150_000
	// heartbeatRate is the aim: heartbeats a second, absorbed with none
	// failed and a p99 under heartbeatP99Aim.
	heartbeatRate   = 10_000
	heartbeatP99Aim = 100 * time.Millisecond
	// heartbeatSecondsDefault is how long the load runs;
	// REAPER_SCALE_HEARTBEAT_SECONDS overrides it (to shorten it while
	// developing).
	heartbeatSecondsDefault = 60
	// heartbeatConns is how many keep-alive connections carry the agents'
	// heartbeats (see BenchmarkScaleHeartbeats).
	heartbeatConns = 512
	// heartbeatApplication names the API's sessions on the server, so that
	// the benchmark can wait for them to end and their statistics to count.
	heartbeatApplication = "attempt-api-scale"
)

// BenchmarkScaleHeartbeats is the attempt API of one replica, as reaperd
// runs it (attemptapi.Service: its own pool of the board, TLS on loopback,
// the server's defaults), over a real board of 150,000 running attempts,
// absorbing 10,000 heartbeats a second for a minute: each of the 150,000
// agents beats once every 15 s (the ladder's heartbeat) with its own
// token, keeping the renewed token an answer gives, and the beats are
// spread evenly over the period, as dispatches spread them.
//
// What is modelled: an agent holds one keep-alive connection and sends one
// heartbeat at a time on it. 150,000 TLS connections do not fit on this
// machine (nor under one replica's max_connections), so the agents'
// heartbeats ride heartbeatConns keep-alive HTTP/1.1 connections, one
// request at a time on each, taken in turn by whichever agent is due. The
// server's work per heartbeat is that of an agent's own connection: one
// TLS record read, one answer written, no handshake (an agent's connection
// outlives its heartbeat interval: the API's idle_timeout is 2 min). What
// is not modelled: the memory and the idle-connection upkeep of 150,000
// open connections, and each agent's one handshake (at its start, once in
// its attempt's life).
//
// Each heartbeat's latency counts from when it was due, not from when a
// connection was free, so a backlog shows in the p99 rather than in a
// slower pace; one not answered within a heartbeat interval of when it was
// due is abandoned, as the agent abandons it, and counted failed. The machine's CPU is read from /proc/stat over the load:
// the API, PostgreSQL and the load generator, all on this machine's cores.
func BenchmarkScaleHeartbeats(b *testing.B) {
	seconds := heartbeatSecondsDefault
	if s := os.Getenv("REAPER_SCALE_HEARTBEAT_SECONDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			b.Fatalf("REAPER_SCALE_HEARTBEAT_SECONDS=%q: want a positive number of seconds", s)
		}
		seconds = n
	}
	ctx := context.Background()
	pool := pgtest.NewDB(b)
	lad := ladder.Defaults()
	now := time.Now()
	progress("%s: seeding %d running attempts", heartbeatSection, heartbeatAgents)
	// Every agent last beat one heartbeat ago.
	if err := (&massbench.Board{Pool: pool}).SeedRunningAt(ctx, sdk.ExecutorLite, heartbeatAgents, now, lad.Heartbeat); err != nil {
		b.Fatal(err)
	}

	sctx, stop := context.WithCancel(ctx)
	defer stop()
	svc, err := attemptapi.NewService(ctx, attemptapi.ServiceConfig{
		DSN:    pgtest.DSN(pool) + "&application_name=" + heartbeatApplication,
		Listen: attemptapi.ListenConfig{Listen: "127.0.0.1:0", StateDir: filepath.Join(b.TempDir(), "state")},
		TTL:    lad.AttemptTokenTTL, Ceiling: time.Hour, Logger: hclog.NewNullLogger(),
		HeartbeatWindow: config.HeartbeatWindowDefault,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer svc.Close()
	ran := make(chan error, 1)
	go func() { ran <- svc.Run(sctx) }()

	iss := svc.Issuer(lad.AttemptTokenTTL)
	tr, err := attemptapi.NewTransport(iss.CA)
	if err != nil {
		b.Fatal(err)
	}
	tr.MaxConnsPerHost, tr.MaxIdleConnsPerHost = heartbeatConns, heartbeatConns
	hc := &http.Client{Transport: tr}
	keys := iss.Keys()
	attempts := massbench.Attempts(heartbeatAgents)
	clients := make([]*attemptapi.Client, heartbeatAgents)
	for i, a := range attempts {
		tok, _, err := keys.Mint(a, now, lad.AttemptTokenTTL)
		if err != nil {
			b.Fatal(err)
		}
		if clients[i], err = attemptapi.NewClientOver(iss.API, tok, hc); err != nil {
			b.Fatal(err)
		}
	}
	// The connections are opened before the load: an agent's connection
	// is open long before its heartbeats (its one handshake is at its
	// start), so the pool's handshakes are not paid inside the load's
	// latencies, where 512 at once would be a burst no fleet sends.
	// The server's write counts are read before them: its statistics reach
	// the server when its sessions end, so the warm-up's heartbeats are
	// counted with the load's (written beats, below).
	before := pgtest.ReadWriteCounts(b, pool, "task_instances")
	var warm sync.WaitGroup
	warmErrs := make([]error, heartbeatConns)
	for i := range heartbeatConns {
		warm.Go(func() {
			j := heartbeatAgents - 1 - i
			_, warmErrs[i] = clients[j].Heartbeat(ctx, attempts[j])
		})
	}
	warm.Wait()
	if err := errors.Join(warmErrs...); err != nil {
		b.Fatalf("opening the connections: %v", err)
	}
	progress("%s: %d heartbeats/s for %ds over %d connections", heartbeatSection, heartbeatRate, seconds, heartbeatConns)

	b.ResetTimer()
	total := seconds * heartbeatRate
	latencies := make([]time.Duration, total) // each written by its heartbeat's goroutine alone
	var (
		failed   atomic.Int64
		firstErr atomic.Value
		wg       sync.WaitGroup
	)
	pgPID := pgtest.Current(b).PID()
	cpuBefore, selfBefore, pgBefore := machinecpu.Busy(), machinecpu.Process(os.Getpid()), machinecpu.Process(pgPID)
	began := time.Now()
	// Heartbeat j is agent j mod heartbeatAgents's, due at began + j/rate.
	due := func(j int) time.Time { return began.Add(time.Duration(j) * time.Second / heartbeatRate) }
	for sent := 0; sent < total; {
		// The load's own pace, not a wait for anything: send every
		// heartbeat that is due, then look again a millisecond later.
		for ; sent < total && !due(sent).After(time.Now()); sent++ {
			wg.Add(1)
			go func(j int) {
				defer wg.Done()
				c := clients[j%heartbeatAgents]
				// An agent gives up on a heartbeat after one heartbeat
				// interval (runner/agent): so does the load, counting it
				// failed, which also bounds the run on an overloaded machine.
				hctx, cancel := context.WithDeadline(ctx, due(j).Add(lad.Heartbeat))
				defer cancel()
				resp, err := c.Heartbeat(hctx, attempts[j%heartbeatAgents])
				latencies[j] = time.Since(due(j))
				if err == nil && resp.ShouldTerminate {
					err = fmt.Errorf("%s told to terminate", attempts[j%heartbeatAgents])
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}(sent)
		}
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
	elapsed := time.Since(began)
	cpu := machinecpu.Busy() - cpuBefore
	self, pgCPU := machinecpu.Process(os.Getpid())-selfBefore, machinecpu.Process(pgPID)-pgBefore
	b.StopTimer()

	tr.CloseIdleConnections()
	stop()
	if err := <-ran; err != nil {
		b.Fatal(err)
	}
	svc.Close() // its sessions hand their statistics over as they exit
	pgtest.WaitSessionsEnd(b, pool, heartbeatApplication)
	after := pgtest.ReadWriteCounts(b, pool, "task_instances")
	if e := firstErr.Load(); e != nil {
		progress("%s: first failure: %v", heartbeatSection, e)
	}

	slices.Sort(latencies)
	q := func(p float64) time.Duration { return latencies[min(len(latencies)-1, int(p*float64(len(latencies))))] }
	// Answered heartbeats over the time they took (failed ones left out).
	rate := float64(int64(total)-failed.Load()) / elapsed.Seconds()
	p99 := q(0.99)
	aimed(heartbeatSection, "heartbeats/s achieved", fmt.Sprintf("%.0f", rate), fmt.Sprintf(">= %d for %ds", heartbeatRate, seconds),
		rate >= 0.99*heartbeatRate)
	figure(heartbeatSection, "p50", q(0.50).Round(10*time.Microsecond).String())
	aimed(heartbeatSection, "p99", p99.Round(10*time.Microsecond).String(), "< "+heartbeatP99Aim.String(), p99 < heartbeatP99Aim)
	figure(heartbeatSection, "p99.9", q(0.999).Round(10*time.Microsecond).String())
	aimed(heartbeatSection, "failed", strconv.FormatInt(failed.Load(), 10), "0", failed.Load() == 0)
	perBeat := "–"
	if !math.IsNaN(cpu) {
		perBeat = fmt.Sprintf("%.0f", cpu*1e6/float64(total))
	}
	// 2 cores' worth at the aimed rate is 200 µs a heartbeat: the whole
	// machine's budget.
	aimed(heartbeatSection, "machine CPU µs/heartbeat", perBeat, "< 200 (2 cores at the rate)",
		!math.IsNaN(cpu) && cpu*1e6/float64(total) < 200)
	figure(heartbeatSection, "cores busy", fmt.Sprintf("%.2f", cpu/elapsed.Seconds()))
	// The machine is shared: what this test's own processes spent.
	figure(heartbeatSection, "API and load generator CPU µs/heartbeat", fmt.Sprintf("%.0f", self*1e6/float64(total)))
	figure(heartbeatSection, "PostgreSQL CPU µs/heartbeat", fmt.Sprintf("%.0f", pgCPU*1e6/float64(total)))
	// The statistics' own reads commit 2 transactions: negligible here.
	written := float64(total + heartbeatConns) // the load's and the warm-up's
	commits := float64(after.Commits-before.Commits) / written
	aimed(heartbeatSection, "commits/heartbeat", fmt.Sprintf("%.4f", commits), "< 1 (batched)", commits < 1)
	rows := float64(after.Updated-before.Updated) / written
	aimed(heartbeatSection, "rows updated/heartbeat", fmt.Sprintf("%.3f", rows), "<= 1", rows <= 1.0001)
}

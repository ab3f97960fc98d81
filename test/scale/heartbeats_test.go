package scale_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/host/config"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/testkit/loadproc"
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
	// failed and a p99 under heartbeatP99Aim. REAPER_SCALE_HEARTBEAT_RATE
	// sends another (to compare CPU per heartbeat on a busy machine).
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
	// heartbeatServedAim is what serving a heartbeat may cost the machine,
	// in CPU µs: the API's process and PostgreSQL's, the generator's left
	// out.
	heartbeatServedAim = 60
	// envHeartbeatProfile, when set, names a file that receives a CPU
	// profile of the API's process over the load.
	envHeartbeatProfile = "REAPER_SCALE_HEARTBEAT_PROFILE"
)

// BenchmarkScaleHeartbeats is the attempt API of one replica, as reaperd
// runs it (attemptapi.Service: its own pool of the board, TLS on loopback,
// the server's defaults), over a real board of 150,000 running attempts,
// absorbing 10,000 heartbeats a second for a minute: each of the 150,000
// agents beats once every 15 s (the ladder's heartbeat) with its own
// token, keeping the renewed token an answer gives, and the beats are
// spread evenly over the period, as dispatches spread them.
//
// What is modelled: an agent holds one connection, its heartbeat stream,
// and sends one heartbeat at a time on it. 150,000 TLS connections do not
// fit on this machine (nor under one replica's max_connections), so the
// agents' heartbeats ride heartbeatConns heartbeat streams, one frame at a
// time on each, taken in turn by whichever agent is due (each frame with
// that agent's own token). The server's work per heartbeat is that of an
// agent's own stream: one TLS record read, one answer written, no
// handshake (an agent's connection outlives its heartbeat interval: the
// API's idle_timeout is 2 min). REAPER_SCALE_HEARTBEAT_TRANSPORT=http1
// sends them as agents did before the stream, on heartbeatConns
// keep-alive HTTP/1.1 connections, one request at a time on each. What
// is not modelled: the memory and the idle-connection upkeep of 150,000
// open connections, and each agent's one handshake (at its start, once in
// its attempt's life).
//
// Each heartbeat's latency counts from when it was due, not from when a
// connection was free, so a backlog shows in the p99 rather than in a
// slower pace; one not answered within a heartbeat interval of when it was
// due is abandoned, as the agent abandons it, and counted failed.
//
// The load generator runs in a process of its own (this test binary
// running TestScaleHeartbeatLoad), so that the CPU of each part is read
// apart over the load: the API's (this process's own, its children left
// out), PostgreSQL's (the postmaster and its backends), the generator's,
// and the whole machine's from /proc/stat. REAPER_SCALE_HEARTBEAT_PROFILE
// names a file for a CPU profile of the API's process over the load.
func BenchmarkScaleHeartbeats(b *testing.B) {
	seconds := heartbeatSecondsDefault
	if s := os.Getenv("REAPER_SCALE_HEARTBEAT_SECONDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			b.Fatalf("REAPER_SCALE_HEARTBEAT_SECONDS=%q: want a positive number of seconds", s)
		}
		seconds = n
	}
	rate := heartbeatRate
	if s := os.Getenv("REAPER_SCALE_HEARTBEAT_RATE"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			b.Fatalf("REAPER_SCALE_HEARTBEAT_RATE=%q: want a positive number of heartbeats a second", s)
		}
		rate = n
	}
	transport := heartbeatStream
	if s := os.Getenv("REAPER_SCALE_HEARTBEAT_TRANSPORT"); s != "" {
		if s != heartbeatStream && s != heartbeatHTTP1 {
			b.Fatalf("REAPER_SCALE_HEARTBEAT_TRANSPORT=%q: want %s or %s", s, heartbeatStream, heartbeatHTTP1)
		}
		transport = s
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
	keys := iss.Keys()
	plan := heartbeatPlan{URL: iss.API, CA: iss.CA, Tokens: make([]string, heartbeatAgents), Seconds: seconds,
		Rate: rate, Conns: heartbeatConns, Heartbeat: lad.Heartbeat, Transport: transport}
	for i, a := range massbench.Attempts(heartbeatAgents) {
		if plan.Tokens[i], _, err = keys.Mint(a, now, lad.AttemptTokenTTL); err != nil {
			b.Fatal(err)
		}
	}
	// The server's write counts are read before the generator's warm-up:
	// its statistics reach the server when its sessions end, so the
	// warm-up's heartbeats are counted with the load's (written beats,
	// below).
	before := pgtest.ReadWriteCounts(b, pool, "task_instances")
	gen := loadproc.Start(b, heartbeatLoadSpec, plan, "warm")
	progress("%s: %d heartbeats/s for %ds over %d connections (%s)", heartbeatSection, rate, seconds, heartbeatConns,
		transport)

	b.ResetTimer()
	stopProfile := profileHeartbeats(b)
	pgPID := pgtest.Current(b).PID()
	cpuBefore, apiBefore, pgBefore := machinecpu.Busy(), machinecpu.Own(os.Getpid()), machinecpu.Process(pgPID)
	var out heartbeatOutcome
	gen.Outcome(b, "go", &out)
	cpu := machinecpu.Busy() - cpuBefore
	apiCPU, pgCPU := machinecpu.Own(os.Getpid())-apiBefore, machinecpu.Process(pgPID)-pgBefore
	stopProfile()
	b.StopTimer()
	gen.Wait(b)

	stop()
	if err := <-ran; err != nil {
		b.Fatal(err)
	}
	svc.Close() // its sessions hand their statistics over as they exit
	pgtest.WaitSessionsEnd(b, pool, heartbeatApplication)
	after := pgtest.ReadWriteCounts(b, pool, "task_instances")
	if out.FirstError != "" {
		progress("%s: first failure: %s", heartbeatSection, out.FirstError)
	}

	total := out.Total
	// Answered heartbeats over the time they took (failed ones left out).
	answered := total - int(out.Failed)
	achieved := float64(answered) / out.Elapsed.Seconds()
	p99 := out.Quantiles[1]
	aimed(heartbeatSection, "heartbeats/s achieved", fmt.Sprintf("%.0f", achieved), fmt.Sprintf(">= %d for %ds", heartbeatRate, seconds),
		achieved >= 0.99*heartbeatRate)
	figure(heartbeatSection, "transport", transport)
	figure(heartbeatSection, "p50", out.Quantiles[0].Round(10*time.Microsecond).String())
	aimed(heartbeatSection, "p99", p99.Round(10*time.Microsecond).String(), "< "+heartbeatP99Aim.String(), p99 < heartbeatP99Aim)
	figure(heartbeatSection, "p99.9", out.Quantiles[2].Round(10*time.Microsecond).String())
	aimed(heartbeatSection, "failed", strconv.FormatInt(out.Failed, 10), "0", out.Failed == 0)
	// CPU is counted per answered heartbeat (a failed one mostly cost
	// the generator its wait).
	perBeat := func(seconds float64) string {
		if math.IsNaN(seconds) || answered == 0 {
			return "–"
		}
		return fmt.Sprintf("%.1f", seconds*1e6/float64(answered))
	}
	// 2 cores' worth at the aimed rate is 200 µs a heartbeat: the whole
	// machine's budget, the generator's share included.
	aimed(heartbeatSection, "machine CPU µs/heartbeat", perBeat(cpu), "< 200 (2 cores at the rate)",
		!math.IsNaN(cpu) && cpu*1e6/float64(answered) < 200)
	figure(heartbeatSection, "cores busy", fmt.Sprintf("%.2f", cpu/out.Elapsed.Seconds()))
	// Each process's own, counted apart: the machine may be shared.
	figure(heartbeatSection, "API CPU µs/heartbeat", perBeat(apiCPU))
	figure(heartbeatSection, "PostgreSQL CPU µs/heartbeat", perBeat(pgCPU))
	served := apiCPU + pgCPU
	aimed(heartbeatSection, "API + PostgreSQL CPU µs/heartbeat", perBeat(served), fmt.Sprintf("<= %d", heartbeatServedAim),
		!math.IsNaN(served) && served*1e6/float64(answered) <= heartbeatServedAim)
	figure(heartbeatSection, "load generator CPU µs/heartbeat", perBeat(out.CPU))
	// The statistics' own reads commit 2 transactions: negligible here.
	written := float64(total + heartbeatConns) // the load's and the warm-up's
	commits := float64(after.Commits-before.Commits) / written
	aimed(heartbeatSection, "commits/heartbeat", fmt.Sprintf("%.4f", commits), "< 1 (batched)", commits < 1)
	rows := float64(after.Updated-before.Updated) / written
	aimed(heartbeatSection, "rows updated/heartbeat", fmt.Sprintf("%.3f", rows), "<= 1", rows <= 1.0001)
}

// heartbeatLoadSpec is the heartbeat load generator's process
// (TestScaleHeartbeatLoad).
var heartbeatLoadSpec = loadproc.Spec{Test: "TestScaleHeartbeatLoad", Env: envHeartbeatLoad, Mark: heartbeatLoadMark}

// profileHeartbeats starts a CPU profile of this process (the API's) into
// the file envHeartbeatProfile names, if any; the returned func ends it.
func profileHeartbeats(b *testing.B) func() {
	path := os.Getenv(envHeartbeatProfile)
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatalf("the API's profile: %v", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatalf("the API's profile: %v", err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Errorf("the API's profile: %v", err)
		}
		progress("%s: the API's CPU profile is in %s", heartbeatSection, path)
	}
}

package attemptapi

// The heartbeat transport's floor (issue #44): what a heartbeat costs the
// attempt API's process in CPU when only the transport differs.
//
// BenchmarkTransportFloor serves heartbeats over real TLS on loopback to a
// load generator in a process of its own (the test binary again, running
// TestTransportFloorLoad), N connections each with one heartbeat in flight
// and each beating at a fixed pace, and reads this process's own CPU over
// the load (getrusage: the generator's is not in it). The first two on
// Listen and Serve as reaperd has them (the tracked listener with its
// caps and eviction, the real Server, whose every guard runs):
//
//   - http1: the agent's Client over HTTP/1.1 alone (a transport of its
//     own, no stream), one per connection.
//   - stream-tls: the heartbeat stream (stream.go), the agent's
//     HeartbeatStream on the other side, one per connection. Each frame
//     is served by the code an HTTP heartbeat is.
//   - echo-tls: the same listener and client, the frames answered by
//     serveEcho instead of the Server: a constant answer, nothing checked
//     and nothing batched. It is the floor of a heartbeat per round trip
//     over TLS in a Go process (a record read, one written, the poller's
//     wake-ups), which no guard can go under.
//
// The previous round also measured the stream without TLS (its prototype,
// on the tracked listener): the attempt API never serves without TLS, so
// the product has no such path and the benchmark no longer measures it.
//
// In both the board's write is replaced by a no-op (floorBoard): the
// batcher runs, the UPDATE does not, so the figures are the transport's and
// the guards', not PostgreSQL's. The tokens are fresh (no renewal is due)
// and each connection carries one token, so the envelope comes from the
// connection's cache on every call but the first, on both transports
// alike.
//
// Reported per answered heartbeat: ns/op and server-µs/hb are the API
// process's CPU (user + system); syscalls/hb its read and write system
// calls (/proc/self/io: syscr + syscw; epoll and futex calls are not in
// it, see docs/performance.md for a full count); generator-µs/hb the load
// generator's CPU; p50-ms and p99-ms the latency it saw; failed what
// failed. REAPER_FLOOR_RATE (heartbeats a second, all connections
// together; default 2,000) and REAPER_FLOOR_SECONDS (default 10) set the
// load.
//
//	go test -run '^$' -bench BenchmarkTransportFloor -benchtime 1x ./runner/attemptapi/
//
// What the stream keeps of HTTP/1.1's boundary is listed, each with its
// test, in docs/attempt-api.md ("The heartbeat stream").

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/internal/httplimit"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/runner/attempttoken/keyfile"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/loadproc"
)

// Transports of BenchmarkTransportFloor.
const (
	floorHTTP1     = "http1"
	floorStreamTLS = "stream-tls"
	// floorEchoTLS: the stream's framing on the same TLS listener, every
	// frame answered with a constant answer and nothing else done (no
	// bound, no token, no body, no batcher): the floor under any guard, a
	// TLS record read and one written per heartbeat. Not a server the API
	// could run; the figure below which no heartbeat per round trip goes.
	floorEchoTLS = "echo-tls"
)

// envFloorPlan names the load generator's plan file (set for the child).
const envFloorPlan = "REAPER_FLOOR_PLAN"

// floorPlan is what the load generator is told.
type floorPlan struct {
	Transport string        `json:"transport"`
	Addr      string        `json:"addr"`
	CA        string        `json:"ca"`
	Tokens    []string      `json:"tokens"`
	Attempts  []sdk.Attempt `json:"attempts"`
	Rate      int           `json:"rate"`
	Seconds   int           `json:"seconds"`
}

// floorResult is what the load generator answers.
type floorResult struct {
	Answered int     `json:"answered"`
	Failed   int     `json:"failed"`
	FirstErr string  `json:"first_error,omitempty"`
	P50ms    float64 `json:"p50_ms"`
	P99ms    float64 `json:"p99_ms"`
	CPU      float64 `json:"cpu_s"`
}

func BenchmarkTransportFloor(b *testing.B) {
	rate := envInt(b, "REAPER_FLOOR_RATE", 2000)
	seconds := envInt(b, "REAPER_FLOOR_SECONDS", 10)
	for _, tr := range []string{floorHTTP1, floorStreamTLS, floorEchoTLS} {
		for _, conns := range []int{64, 512} {
			b.Run(fmt.Sprintf("%s/conns=%d", tr, conns), func(b *testing.B) {
				benchTransportFloor(b, tr, conns, rate, seconds)
			})
		}
	}
}

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: a positive integer is needed", name, v)
	}
	return n
}

// floorBoard is the board of the benchmark: heartbeats are accepted and
// written nowhere, so that the figures are the transport's. Nothing else
// is called.
type floorBoard struct{ Board }

func (floorBoard) HeartbeatCredentials(_ context.Context, calls []lifecycle.HeartbeatCall) ([]bool, error) {
	return make([]bool, len(calls)), nil
}

func benchTransportFloor(b *testing.B, transport string, conns, rate, seconds int) {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	dir := b.TempDir()
	kr, err := keyfile.LoadOrCreate(filepath.Join(dir, "state", "keys.hcl"))
	if err != nil {
		b.Fatal(err)
	}
	// The bounds as reaperd has them but for the period: the load beats
	// far faster than the ladder's heartbeat, so the rates are per second.
	clients := httplimit.Clients{MaxConnsPerAddress: 2 * conns, AddressRequests: 1 << 20,
		SubjectRequests: httplimit.AttemptAPISubjectRequestsDefault * 10,
		SubjectInFlight: httplimit.AttemptAPISubjectInFlightDefault, Per: time.Second}
	srv, err := NewServer(ServerConfig{Keys: func() *attempttoken.Keyring { return kr }, TTL: time.Hour,
		Board: floorBoard{}, Clients: clients})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := Listen(ctx, ListenConfig{Listen: "127.0.0.1:0", StateDir: filepath.Join(dir, "state"),
		MaxConnsPerAddress: 2 * conns})
	if err != nil {
		b.Fatal(err)
	}
	plan := floorPlan{Transport: transport, Addr: ln.Addr().String(), CA: ln.CA, Rate: rate, Seconds: seconds}
	now := time.Now()
	for i := range conns {
		a := sdk.Attempt{RunID: "floor", TaskID: fmt.Sprintf("t%04d", i), Try: 1}
		tok, _, err := kr.Mint(a, now, time.Hour)
		if err != nil {
			b.Fatal(err)
		}
		plan.Tokens, plan.Attempts = append(plan.Tokens, tok), append(plan.Attempts, a)
	}
	// Both transports on the one server reaperd runs: the client picks.
	var served <-chan error
	if transport == floorEchoTLS {
		served = serveEcho(ctx, ln)
	} else {
		served = Serve(ctx, ln, srv, hclog.NewNullLogger())
	}
	g := loadproc.Start(b, floorLoadSpec, plan, "warm")
	before, ioBefore := selfCPU(b), selfIO(b)
	g.Send(b, "go")
	line := g.Next(b)
	after, ioAfter := selfCPU(b), selfIO(b)
	var res floorResult
	if err := json.Unmarshal([]byte(line), &res); err != nil {
		b.Fatalf("the load generator's result %q: %v", line, err)
	}
	g.Wait(b)
	stop()
	if err := <-served; err != nil {
		b.Fatal(err)
	}
	if res.Answered == 0 {
		b.Fatalf("no heartbeat answered (%d failed: %s)", res.Failed, res.FirstErr)
	}
	if res.Failed > 0 {
		b.Logf("%d heartbeats failed, the first: %s", res.Failed, res.FirstErr)
	}
	per := func(x float64) float64 { return x / float64(res.Answered) }
	cpu := after - before
	b.ReportMetric(per(cpu)*1e9, "ns/op")
	b.ReportMetric(per(cpu)*1e6, "server-µs/hb")
	b.ReportMetric(per(float64(ioAfter-ioBefore)), "syscalls/hb")
	b.ReportMetric(per(res.CPU)*1e6, "generator-µs/hb")
	b.ReportMetric(res.P50ms, "p50-ms")
	b.ReportMetric(res.P99ms, "p99-ms")
	b.ReportMetric(float64(res.Answered)/float64(seconds), "heartbeats/s")
	b.ReportMetric(float64(res.Failed), "failed")
	if load, err := os.ReadFile("/proc/loadavg"); err == nil {
		b.Logf("loadavg after the run: %s", strings.TrimSpace(string(load)))
	}
}

// selfCPU is this process's CPU seconds (user + system, every thread).
func selfCPU(b *testing.B) float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("reading this process's CPU: %v", err)
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

// selfIO is this process's read and write system calls so far (syscr +
// syscw of /proc/self/io, every thread); 0 where it cannot be read.
func selfIO(b *testing.B) int64 {
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		b.Logf("no system call counts: %v", err)
		return 0
	}
	var n int64
	for l := range strings.Lines(string(data)) {
		k, v, _ := strings.Cut(strings.TrimSpace(l), ": ")
		if k == "syscr" || k == "syscw" {
			x, _ := strconv.ParseInt(v, 10, 64)
			n += x
		}
	}
	return n
}

// floorLoadSpec is the load generator's process (TestTransportFloorLoad).
var floorLoadSpec = loadproc.Spec{Test: "TestTransportFloorLoad", Env: envFloorPlan, Mark: floorLinePrefix}

// floorLinePrefix marks the generator's own lines on its output.
const floorLinePrefix = "floor: "

// floorConn is one agent's connection of the load generator.
type floorConn interface {
	heartbeat(ctx context.Context, a sdk.Attempt) error
	close()
}

// TestTransportFloorLoad is BenchmarkTransportFloor's load generator, run
// in a process of its own; it does nothing otherwise. It opens every
// connection and sends one heartbeat on each, says "warm", waits for "go",
// then sends the plan's load and says what it saw.
func TestTransportFloorLoad(t *testing.T) {
	var plan floorPlan
	if ok, err := loadproc.ReadPlan(envFloorPlan, &plan); !ok {
		t.Skip("the transport floor benchmark's load generator: run by BenchmarkTransportFloor")
	} else if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	n := len(plan.Tokens)
	conns := make([]floorConn, n)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.close()
			}
		}
	}()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for i := range conns {
		var err error
		if conns[i], err = dialFloor(plan, plan.Tokens[i]); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := conns[i].heartbeat(ctx, plan.Attempts[i]); err != nil {
				mu.Lock()
				firstErr = cmpErr(firstErr, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatalf("warming the connections: %v", firstErr)
	}
	loadproc.Say(os.Stdout, floorLinePrefix, "warm")
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() || in.Text() != "go" {
		t.Fatalf("the benchmark said %q, not go", in.Text())
	}
	cpuBefore := childCPU(t)
	each := plan.Rate * plan.Seconds / n // heartbeats per connection
	every := time.Duration(n) * time.Second / time.Duration(plan.Rate)
	var (
		lat    []time.Duration
		failed int
	)
	began := time.Now()
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := make([]time.Duration, 0, each)
			var bad int
			var firstBad error
			next := began.Add(time.Duration(i) * every / time.Duration(n))
			for range max(each, 1) {
				// The load's own pace: each connection beats once every
				// `every` of wall time, at once when it lags.
				time.Sleep(time.Until(next))
				start := time.Now()
				if err := c.heartbeat(ctx, plan.Attempts[i]); err != nil {
					bad++
					firstBad = cmpErr(firstBad, err)
				} else {
					mine = append(mine, time.Since(start))
				}
				next = next.Add(every)
			}
			mu.Lock()
			lat, failed, firstErr = append(lat, mine...), failed+bad, cmpErr(firstErr, firstBad)
			mu.Unlock()
		}()
	}
	wg.Wait()
	res := floorResult{Answered: len(lat), Failed: failed, CPU: childCPU(t) - cpuBefore}
	if firstErr != nil {
		res.FirstErr = firstErr.Error()
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		q := func(p float64) float64 {
			return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))]) / float64(time.Millisecond)
		}
		res.P50ms, res.P99ms = q(0.50), q(0.99)
	}
	out, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	loadproc.Say(os.Stdout, floorLinePrefix, string(out))
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

func childCPU(t *testing.T) float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatalf("reading the generator's CPU: %v", err)
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

func dialFloor(plan floorPlan, token string) (floorConn, error) {
	if plan.Transport == floorHTTP1 {
		// The agent's client over HTTP/1.1 alone: a transport of its own,
		// no stream.
		tr, err := NewTransport(plan.CA)
		if err != nil {
			return nil, err
		}
		c, err := NewClientOver("https://"+plan.Addr, token, &http.Client{Transport: tr})
		if err != nil {
			return nil, err
		}
		return httpFloorConn{c}, nil
	}
	hs, err := NewHeartbeatStream("https://"+plan.Addr, plan.CA)
	if err != nil {
		return nil, err
	}
	return &streamFloorConn{s: hs, token: token}, nil
}

type httpFloorConn struct{ c *Client }

func (h httpFloorConn) heartbeat(ctx context.Context, a sdk.Attempt) error {
	resp, err := h.c.Heartbeat(ctx, a)
	if err == nil && resp.ShouldTerminate {
		err = errors.New("answered should_terminate")
	}
	return err
}

func (h httpFloorConn) close() { h.c.Close() }

// streamFloorConn is an agent's heartbeat stream (the product's).
type streamFloorConn struct {
	s     *HeartbeatStream
	token string
}

func (s *streamFloorConn) heartbeat(ctx context.Context, a sdk.Attempt) error {
	resp, err := s.s.Heartbeat(ctx, s.token, a)
	if err == nil && resp.ShouldTerminate {
		err = errors.New("answered should_terminate")
	}
	return err
}

func (s *streamFloorConn) close() { s.s.Close() }

// serveEcho answers every frame of the heartbeat stream on ln's TLS
// connections with one constant answer frame, until ctx ends; then it
// closes the listener and every connection and waits for their goroutines.
func serveEcho(ctx context.Context, ln *Listener) <-chan error {
	answer := []byte(`{"should_terminate":false}`)
	frame := binary.BigEndian.AppendUint32(nil, uint32(1+len(answer)))
	frame = append(append(frame, frameAnswer), answer...)
	done := make(chan error, 1)
	var (
		mu    sync.Mutex
		open  = map[net.Conn]bool{}
		conns sync.WaitGroup
	)
	go func() {
		<-ctx.Done()
		_ = ln.Close()
		mu.Lock()
		for c := range open {
			_ = c.Close()
		}
		mu.Unlock()
	}()
	go func() {
		defer func() { conns.Wait(); done <- nil }()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open[c] = true
			mu.Unlock()
			conns.Add(1)
			go func() {
				defer conns.Done()
				defer func() { mu.Lock(); delete(open, c); mu.Unlock(); _ = c.Close() }()
				var head [4]byte
				buf := make([]byte, maxStreamFrame)
				for {
					if _, err := io.ReadFull(c, head[:]); err != nil {
						return
					}
					n := binary.BigEndian.Uint32(head[:])
					if n > maxStreamFrame {
						return
					}
					if _, err := io.ReadFull(c, buf[:n]); err != nil {
						return
					}
					if _, err := c.Write(frame); err != nil {
						return
					}
				}
			}()
		}
	}()
	return done
}

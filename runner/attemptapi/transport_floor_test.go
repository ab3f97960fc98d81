package attemptapi

// The heartbeat transport's floor (issue #44): what a heartbeat costs the
// attempt API's process in CPU when only the transport differs.
//
// BenchmarkTransportFloor serves heartbeats over real TLS on loopback to a
// load generator in a process of its own (the test binary again, running
// TestTransportFloorLoad), N connections each with one heartbeat in flight
// and each beating at a fixed pace, and reads this process's own CPU over
// the load (getrusage: the generator's is not in it). Three transports:
//
//   - http1: today's path. Listen and Serve as reaperd has them (the
//     tracked listener with its caps and eviction, net/http's HTTP/1.1
//     server) and the real Server, whose every guard runs; the agent's
//     own Client on the other side, one per connection.
//   - stream-tls: a long-lived framed stream on the same TLS listener.
//     A frame in is a 4-byte length, a 2-byte token length, the token and
//     the heartbeat's body as the agent writes it; a frame out is a
//     4-byte length, a kind byte (answer or refusal) and the same JSON an
//     answer or refusal has today. One goroutine per connection, a bufio
//     reader and writer, one flush per answer. Each frame goes through the
//     same code as a heartbeat over HTTP (streamHeartbeat): the call
//     bounds (admit), the token's envelope from the connection's cache,
//     the body's reading, the expiry on the server's clock, the scope,
//     the renewal's judgment, the batcher, the hand-written answer.
//   - stream-plain: the same stream without TLS, to show TLS's share. It
//     is for the figure only: the attempt API never serves without TLS.
//
// In all three the board's write is replaced by a no-op (floorBoard): the
// batcher runs, the UPDATE does not, so the figures are the transport's and
// the guards', not PostgreSQL's. The tokens are fresh (no renewal is due)
// and each connection carries one token, so the envelope comes from the
// connection's cache on every call but the first, on every transport
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
// What a stream must keep to be as strong a boundary as HTTP/1.1 is today
// (the stream here keeps each, so that its figure is the price of a real
// one):
//
//   - the token checked on every frame, not once per stream: its envelope
//     may come from the connection's cache (same bytes, same keyring), but
//     its expiry is read on the server's clock and its scope against the
//     frame's body on every frame, so a stream outlives no token and a
//     token acts for no other attempt;
//   - the per-address and per-subject call rates and the subject's calls
//     in flight, counted per frame as per request;
//   - the listener's per-address and server connection caps, and the
//     eviction of a connection waiting between calls: a stream waiting
//     for its next frame is idle (evictable) as a kept-alive connection
//     between requests is, and active only while a frame is served;
//   - the idle timeout (no frame for idle_timeout closes the stream), the
//     handshake and frame read deadlines (read_header_timeout,
//     read_timeout) and the answer's write deadline;
//   - a frame size bound (maxFrame: a token and a body of maxBody), read
//     before any of the frame is, so a client cannot make the server buffer
//     more;
//   - a malformed frame (over the bound, a token length past the frame) and
//     a call refused before its body would be read over HTTP (429, a token
//     that does not verify) close the stream, as they close the connection
//     today; other refusals are answered on it;
//   - the renewed token in the answer, exactly as today's answer carries
//     it, so the agent's token still turns over every quarter TTL.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
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
	floorHTTP1       = "http1"
	floorStreamTLS   = "stream-tls"
	floorStreamPlain = "stream-plain"
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
	for _, tr := range []string{floorHTTP1, floorStreamTLS, floorStreamPlain} {
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
	var served <-chan error
	switch transport {
	case floorHTTP1:
		served = Serve(ctx, ln, srv, hclog.NewNullLogger())
	case floorStreamTLS:
		served = serveStream(ctx, ln, ln.Listener, srv)
	case floorStreamPlain:
		served = serveStream(ctx, ln, ln.tracked, srv)
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

// maxFrame bounds a frame in: a token (well under 4 KiB) and a body of at
// most maxBody.
const maxFrame = 4<<10 + maxBody

// Kinds of a frame out.
const (
	frameAnswer  = 0
	frameRefusal = 1
)

// serveStream serves the framed heartbeat stream on the connections lnr
// accepts (ln's TLS listener, or its tracked listener for plain TCP) until
// ctx ends, then closes every connection and waits for its goroutine.
func serveStream(ctx context.Context, ln *Listener, lnr net.Listener, s *Server) <-chan error {
	done := make(chan error, 1)
	var (
		mu    sync.Mutex
		open  = map[net.Conn]struct{}{}
		conns sync.WaitGroup
	)
	go func() {
		<-ctx.Done()
		_ = lnr.Close()
		mu.Lock()
		for c := range open {
			_ = c.Close()
		}
		mu.Unlock()
	}()
	go func() {
		var err error
		for {
			c, aerr := lnr.Accept()
			if aerr != nil {
				if ctx.Err() == nil {
					err = fmt.Errorf("accepting a stream: %w", aerr)
				}
				break
			}
			mu.Lock()
			if ctx.Err() != nil {
				mu.Unlock()
				_ = c.Close()
				break
			}
			open[c] = struct{}{}
			mu.Unlock()
			conns.Add(1)
			go func() {
				defer conns.Done()
				defer func() {
					mu.Lock()
					delete(open, c)
					mu.Unlock()
				}()
				streamConn(ctx, ln, c, s)
			}()
		}
		conns.Wait()
		done <- err
	}()
	return done
}

// streamConn serves one stream: frame after frame until the client goes,
// the stream idles past the idle timeout, or a frame closes it.
func streamConn(ctx context.Context, ln *Listener, c net.Conn, s *Server) {
	defer c.Close()
	defer ln.tracked.ConnState(c, http.StateClosed)
	limits := ln.limits
	if tc, ok := c.(*tls.Conn); ok {
		_ = c.SetDeadline(time.Now().Add(limits.ReadHeaderTimeout))
		if err := tc.HandshakeContext(ctx); err != nil {
			return
		}
		_ = c.SetDeadline(time.Time{})
	}
	// The request the call bounds read: the source address, as net/http
	// gives it, and the listener's address, to tell a client on this host.
	r := (&http.Request{RemoteAddr: c.RemoteAddr().String()}).WithContext(
		context.WithValue(ctx, http.LocalAddrContextKey, c.LocalAddr()))
	tokens := &connTokens{}
	br, bw := bufio.NewReaderSize(c, 4<<10), bufio.NewWriterSize(c, 4<<10)
	frame := make([]byte, maxFrame)
	var out bytes.Buffer
	for {
		ln.tracked.ConnState(c, http.StateIdle)
		_ = c.SetReadDeadline(time.Now().Add(limits.IdleTimeout))
		if _, err := io.ReadFull(br, frame[:4]); err != nil {
			return
		}
		ln.tracked.ConnState(c, http.StateActive)
		n := binary.BigEndian.Uint32(frame[:4])
		if n < 2 || n > maxFrame {
			return // malformed: closed
		}
		_ = c.SetReadDeadline(time.Now().Add(limits.ReadTimeout))
		if _, err := io.ReadFull(br, frame[:n]); err != nil {
			return
		}
		tl := int(binary.BigEndian.Uint16(frame[:2]))
		if 2+tl > int(n) {
			return // malformed: closed
		}
		resp, ref := streamHeartbeat(ctx, s, r, tokens, string(frame[2:2+tl]), frame[2+tl:n])
		out.Reset()
		kind := byte(frameAnswer)
		if ref != nil {
			kind = frameRefusal
			_ = json.NewEncoder(&out).Encode(ref.body)
		} else {
			s.wire.writeResponse(&out, resp)
		}
		_ = c.SetWriteDeadline(time.Now().Add(limits.WriteTimeout))
		var head [5]byte
		binary.BigEndian.PutUint32(head[:4], uint32(1+out.Len()))
		head[4] = kind
		_, _ = bw.Write(head[:])
		_, _ = bw.Write(out.Bytes())
		if err := bw.Flush(); err != nil {
			return
		}
		if ref != nil && ref.unread {
			return
		}
	}
}

// streamHeartbeat is Server.serve's heartbeat path for one frame: the same
// guards in the same order, the same handler.
func streamHeartbeat(ctx context.Context, s *Server, r *http.Request, tokens *connTokens, token string,
	body []byte) (Response, *refusal) {
	start := s.cfg.Clock.Now()
	keys := s.cfg.Keys()
	var attempt attempttoken.Claims
	subjectOf := func() (string, error) {
		c, subject, err := tokens.envelope(keys, token)
		attempt = c
		return subject, err
	}
	release, ref := s.clients.admit(r, subjectOf, start)
	if ref != nil {
		return Response{}, unread(ref)
	}
	defer release()
	var req Request
	tooLarge, err := s.wire.readRequest(bytes.NewReader(body), &req)
	switch {
	case tooLarge:
		return Response{}, refuse(http.StatusBadRequest, codeTooLarge, "body over %d bytes", maxBody)
	case err != nil:
		return Response{}, refuse(http.StatusBadRequest, CodeBadRequest, "reading the body: %v", err)
	}
	now := s.cfg.Clock.Now()
	if err := attempttoken.Expired(attempt, now); err != nil {
		return Response{}, tokenRefusal(err)
	}
	if err := attempttoken.Scoped(attempt, req.Attempt()); err != nil {
		return Response{}, tokenRefusal(err)
	}
	resp, err := s.heartbeat(ctx, call{req: req, token: token, claims: attempt, now: now})
	if err != nil {
		var ref *refusal
		if !errors.As(err, &ref) {
			ref = &refusal{status: http.StatusInternalServerError, cause: err,
				body: ErrorBody{Code: CodeInternal, Message: "the call failed inside the server; see its log"}}
		}
		return Response{}, ref
	}
	return resp, nil
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
		c, err := NewClient("https://"+plan.Addr, token, plan.CA)
		if err != nil {
			return nil, err
		}
		return httpFloorConn{c}, nil
	}
	var (
		c   net.Conn
		err error
	)
	if plan.Transport == floorStreamTLS {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(plan.CA)) {
			return nil, errors.New("the CA holds no certificate")
		}
		c, err = tls.Dial("tcp", plan.Addr, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	} else {
		c, err = net.Dial("tcp", plan.Addr)
	}
	if err != nil {
		return nil, fmt.Errorf("dialing the stream: %w", err)
	}
	return &streamFloorConn{c: c, token: token, br: bufio.NewReader(c), bw: bufio.NewWriter(c)}, nil
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

// streamFloorConn is an agent's side of the framed stream.
type streamFloorConn struct {
	c     net.Conn
	token string
	br    *bufio.Reader
	bw    *bufio.Writer
	buf   []byte
}

func (s *streamFloorConn) heartbeat(_ context.Context, a sdk.Attempt) error {
	body, err := json.Marshal(request(a, nil))
	if err != nil {
		return err
	}
	var head [6]byte
	binary.BigEndian.PutUint32(head[:4], uint32(2+len(s.token)+len(body)))
	binary.BigEndian.PutUint16(head[4:], uint16(len(s.token)))
	_, _ = s.bw.Write(head[:])
	_, _ = s.bw.WriteString(s.token)
	_, _ = s.bw.Write(body)
	if err := s.bw.Flush(); err != nil {
		return fmt.Errorf("sending a heartbeat frame: %w", err)
	}
	if _, err := io.ReadFull(s.br, head[:4]); err != nil {
		return fmt.Errorf("reading the answer's frame: %w", err)
	}
	n := binary.BigEndian.Uint32(head[:4])
	if n < 1 || n > maxFrame {
		return fmt.Errorf("an answer frame of %d bytes", n)
	}
	if cap(s.buf) < int(n) {
		s.buf = make([]byte, n)
	}
	frame := s.buf[:n]
	if _, err := io.ReadFull(s.br, frame); err != nil {
		return fmt.Errorf("reading the answer: %w", err)
	}
	if frame[0] != frameAnswer {
		return fmt.Errorf("refused: %s", bytes.TrimSpace(frame[1:]))
	}
	var resp Response
	if err := json.Unmarshal(frame[1:], &resp); err != nil {
		return fmt.Errorf("decoding the answer: %w", err)
	}
	if resp.ShouldTerminate {
		return errors.New("answered should_terminate")
	}
	return nil
}

func (s *streamFloorConn) close() { _ = s.c.Close() }

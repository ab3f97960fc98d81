package attemptapi_test

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/board"
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

// streamBundle is a real attempt API (real TLS, a real board, a fake
// clock) with two running attempts, each with its own token: the agent's
// and another's.
type streamBundle struct {
	w      *lifecycle.Writer
	kr     *attempttoken.Keyring
	srv    *attemptapi.Server
	clk    *clock.Fake
	meter  *attemptapitest.Meter
	log    *sdktest.LogBuffer
	ln     *attemptapi.Listener
	stop   func()
	done   <-chan error
	a, b   sdk.Attempt
	ta, tb string
}

func streamSetup(t *testing.T, limits httplimit.Limits, clients httplimit.Clients) *streamBundle {
	t.Helper()
	return streamSetupWith(t, limits, clients, nil)
}

// streamSetupWith is streamSetup with the server's configuration changed
// by change (nil: none) before the server is built.
func streamSetupWith(t *testing.T, limits httplimit.Limits, clients httplimit.Clients,
	change func(*attemptapi.ServerConfig)) *streamBundle {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	kr, err := attempttoken.NewKeyring(newKey("k1"))
	if err != nil {
		t.Fatal(err)
	}
	sb := &streamBundle{w: lifecycle.New(pool, lifecycle.Options{}), kr: kr, clk: clock.NewFake(base),
		meter: &attemptapitest.Meter{}, log: &sdktest.LogBuffer{},
		a: sdk.Attempt{RunID: "s", TaskID: "agent", Try: 1}, b: sdk.Attempt{RunID: "s", TaskID: "other", Try: 1}}
	if err := sb.w.CreateRun(ctx, lifecycle.NewRun{RunID: "s", DagID: "dag", Tasks: []lifecycle.NewTask{
		{TaskID: "agent", Executor: sdk.ExecutorLite, Command: "true"},
		{TaskID: "other", Executor: sdk.ExecutorLite, Command: "true"}}}, base); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		a   sdk.Attempt
		tok *string
	}{{sb.a, &sb.ta}, {sb.b, &sb.tb}} {
		for _, step := range []func(context.Context, sdk.Attempt, time.Time) (bool, error){sb.w.Enqueue, sb.w.Queue} {
			if ok, err := step(ctx, p.a, base); err != nil || !ok {
				t.Fatal(ok, err)
			}
		}
		if term, err := sb.w.Running(ctx, p.a, base); err != nil || term {
			t.Fatal(term, err)
		}
		if *p.tok, _, err = kr.Mint(p.a, base, ttl); err != nil {
			t.Fatal(err)
		}
	}
	logger := hclog.New(&hclog.LoggerOptions{Output: sb.log, Level: hclog.Info})
	cfg := attemptapi.ServerConfig{Keys: func() *attempttoken.Keyring { return kr },
		TTL: ttl, Board: sb.w, Meter: sb.meter, Clock: sb.clk, Logger: logger, Clients: clients}
	if change != nil {
		change(&cfg)
	}
	if sb.srv, err = attemptapi.NewServer(cfg); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	sb.ln, err = attemptapi.Listen(sctx, attemptapi.ListenConfig{Listen: "127.0.0.1:0",
		StateDir: filepath.Join(t.TempDir(), "state"), Limits: limits, MaxConnsPerAddress: clients.MaxConnsPerAddress,
		Meter: sb.meter, Logger: logger, Clock: sb.clk})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := attemptapi.Serve(sctx, sb.ln, sb.srv, hclog.NewNullLogger())
	stopped := false
	sb.stop = func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(sb.stop)
	return sb
}

// streamLimits are the server's limits of the stream tests: long enough
// that no timeout ends a test it is not the subject of.
var streamLimits = httplimit.Limits{ReadHeaderTimeout: time.Minute, ReadTimeout: time.Minute,
	WriteTimeout: time.Minute, IdleTimeout: 10 * time.Minute, MaxConns: 64}

// streamClients are the per-client bounds of the stream tests.
func streamClients() httplimit.Clients {
	return httplimit.Clients{MaxConnsPerAddress: 4, AddressRequests: 1000, SubjectRequests: 1000, SubjectInFlight: 4,
		Per: ladder.Defaults().Heartbeat}
}

// rawStream is a TLS connection from ip that negotiated the heartbeat
// stream, for frames written by hand.
func (sb *streamBundle) rawStream(t *testing.T, ip string) *tls.Conn {
	t.Helper()
	d := &tls.Dialer{NetDialer: &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}},
		Config: &tls.Config{RootCAs: certPool(sb.ln.CA), NextProtos: []string{attemptapi.ProtoHeartbeatStream, "http/1.1"}}}
	c, err := d.DialContext(context.Background(), "tcp", sb.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	tc := c.(*tls.Conn)
	if p := tc.ConnectionState().NegotiatedProtocol; p != attemptapi.ProtoHeartbeatStream {
		t.Fatalf("negotiated %q, want the heartbeat stream", p)
	}
	t.Cleanup(func() { _ = tc.Close() })
	_ = tc.SetDeadline(time.Now().Add(30 * time.Second))
	return tc
}

// frame is a heartbeat frame of a with token.
func frame(token string, a sdk.Attempt) []byte {
	body := fmt.Sprintf(`{"run_id":%q,"task_id":%q,"try":%d,"epoch":%d}`, a.RunID, a.TaskID, a.Try, a.Epoch)
	return rawFrame(len(token), token+body)
}

// rawFrame is a frame whose token length says tokenLen and whose rest is
// rest.
func rawFrame(tokenLen int, rest string) []byte {
	out := binary.BigEndian.AppendUint32(nil, uint32(2+len(rest)))
	out = binary.BigEndian.AppendUint16(out, uint16(tokenLen))
	return append(out, rest...)
}

// frameOut is a frame out, read by hand.
type frameOut struct {
	kind   byte
	status int
	resp   attemptapi.Response
	err    attemptapi.ErrorBody
}

func readAnswer(t *testing.T, c net.Conn) frameOut {
	t.Helper()
	var head [4]byte
	if _, err := io.ReadFull(c, head[:]); err != nil {
		t.Fatalf("reading an answer: %v", err)
	}
	buf := make([]byte, binary.BigEndian.Uint32(head[:]))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("reading an answer: %v", err)
	}
	an := frameOut{kind: buf[0]}
	if an.kind == 0 {
		if err := json.Unmarshal(buf[1:], &an.resp); err != nil {
			t.Fatalf("answer %q: %v", buf[1:], err)
		}
		return an
	}
	an.status = int(binary.BigEndian.Uint16(buf[1:3]))
	if err := json.Unmarshal(buf[3:], &an.err); err != nil {
		t.Fatalf("refusal %q: %v", buf[3:], err)
	}
	return an
}

// closed reports that the server closed c: its next read ends without a
// byte.
func closed(t *testing.T, c net.Conn, what string) {
	t.Helper()
	var b [1]byte
	if n, err := c.Read(b[:]); n != 0 || err == nil {
		t.Fatalf("%s: the stream is still open (read %d bytes, %v)", what, n, err)
	} else if isTimeout(err) {
		t.Fatalf("%s: the stream is still open (the test's read timed out)", what)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func (sb *streamBundle) ti(t *testing.T, a sdk.Attempt) board.TaskInstance {
	t.Helper()
	ti, err := sb.w.TaskInstance(context.Background(), a.RunID, a.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	return ti
}

// unchanged fails when either attempt's row differs from before.
func (sb *streamBundle) unchanged(t *testing.T, before map[sdk.Attempt]board.TaskInstance) {
	t.Helper()
	for a, was := range before {
		if now := sb.ti(t, a); now != was {
			t.Errorf("%s changed by a refused frame:\nwas %+v\nnow %+v", a, was, now)
		}
	}
}

func (sb *streamBundle) rows(t *testing.T) map[sdk.Attempt]board.TaskInstance {
	return map[sdk.Attempt]board.TaskInstance{sb.a: sb.ti(t, sb.a), sb.b: sb.ti(t, sb.b)}
}

func TestHeartbeatStream(t *testing.T) {
	ctx := context.Background()

	t.Run("HeartbeatsLandRenewAndAnswerShouldTerminate", func(t *testing.T) {
		sb := streamSetup(t, streamLimits, streamClients())
		c, err := attemptapi.NewClient(sb.ln.URL, sb.ta, sb.ln.CA)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for i := 1; i <= 10; i++ {
			sb.clk.Advance(15 * time.Second)
			resp, err := c.Heartbeat(ctx, sb.a)
			if err != nil || resp.ShouldTerminate || resp.Capped {
				t.Fatalf("heartbeat %d: %+v %v", i, resp, err)
			}
			if got := sb.ti(t, sb.a).LastHeartbeatAt; !got.Equal(sb.clk.Now()) {
				t.Fatalf("heartbeat %d on the board at %v, want %v", i, got, sb.clk.Now())
			}
			if (resp.Token != "") != (i == 10) {
				t.Fatalf("heartbeat %d at +%s: token %q (a renewal is due at a quarter TTL only)", i,
					sb.clk.Now().Sub(base), resp.Token)
			}
		}
		renewed := c.Token()
		if renewed == sb.ta {
			t.Fatal("the client kept its old token after a renewal")
		}
		// The renewed token is the one the next frames carry, and verifies.
		sb.clk.Advance(15 * time.Second)
		if resp, err := c.Heartbeat(ctx, sb.a); err != nil || resp.ShouldTerminate {
			t.Fatalf("heartbeat with the renewed token: %+v %v", resp, err)
		}
		if n := sb.meter.Count("heartbeat/ok"); n != 11 {
			t.Fatalf("%d heartbeats metered ok, want 11: %s", n, sb.meter)
		}
		// One connection, the stream: every heartbeat went on it.
		if all, _ := sb.ln.Open(""); all != 1 {
			t.Fatalf("%d connections open, want the one stream", all)
		}
		// The attempt moves on (reaped): the next heartbeat is told.
		if _, err := sb.w.ReportOutcome(ctx, sb.a, lifecycle.TerminalReport{State: sdk.StateFailed, Reason: "reaped"},
			sb.clk.Now()); err != nil {
			t.Fatal(err)
		}
		sb.clk.Advance(15 * time.Second)
		if resp, err := c.Heartbeat(ctx, sb.a); err != nil || !resp.ShouldTerminate {
			t.Fatalf("heartbeat of an attempt moved on: %+v %v, want should_terminate", resp, err)
		}
		if n := sb.meter.Count("heartbeat/should_terminate"); n != 1 {
			t.Fatalf("should_terminate metered %d times", n)
		}
	})

	t.Run("AnOlderServerGetsHeartbeatsOverHTTP", func(t *testing.T) {
		sb := streamSetup(t, streamLimits, streamClients())
		// The same Server behind net/http's own TLS server, which offers
		// HTTP/1.1 only, as a server from before the stream does.
		old := httptest.NewUnstartedServer(sb.srv)
		old.StartTLS()
		t.Cleanup(old.Close)
		ca := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: old.Certificate().Raw}))
		c, err := attemptapi.NewClient(old.URL, sb.ta, ca)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for range 3 {
			sb.clk.Advance(15 * time.Second)
			if resp, err := c.Heartbeat(ctx, sb.a); err != nil || resp.ShouldTerminate {
				t.Fatalf("heartbeat over HTTP: %+v %v", resp, err)
			}
		}
		if got := sb.ti(t, sb.a).LastHeartbeatAt; !got.Equal(sb.clk.Now()) {
			t.Fatalf("heartbeat on the board at %v, want %v", got, sb.clk.Now())
		}
	})

	t.Run("OversizedFrameLengthClosesBeforeAnyBody", func(t *testing.T) {
		sb := streamSetup(t, streamLimits, streamClients())
		before := sb.rows(t)
		c := sb.rawStream(t, "127.0.0.1")
		// Only the length: the server must not wait for a megabyte.
		if _, err := c.Write(binary.BigEndian.AppendUint32(nil, 1<<20)); err != nil {
			t.Fatal(err)
		}
		closed(t, c, "a frame of 1 MiB")
		waitFor(t, "the frame size metered", func() bool { return sb.meter.Conns(attemptapi.ConnStreamFrameSize) == 1 })
		if !strings.Contains(sb.log.String(), "malformed frame") {
			t.Errorf("not logged:\n%s", sb.log)
		}
		sb.unchanged(t, before)
	})

	t.Run("TokenLengthPastTheFrameCloses", func(t *testing.T) {
		sb := streamSetup(t, streamLimits, streamClients())
		before := sb.rows(t)
		c := sb.rawStream(t, "127.0.0.1")
		if _, err := c.Write(rawFrame(500, sb.ta[:20])); err != nil {
			t.Fatal(err)
		}
		closed(t, c, "a token length past the frame")
		waitFor(t, "the malformed frame metered", func() bool { return sb.meter.Conns(attemptapi.ConnStreamMalformed) == 1 })
		if n := sb.meter.Count("heartbeat/ok"); n != 0 {
			t.Fatalf("%d heartbeats accepted", n)
		}
		sb.unchanged(t, before)
	})

	t.Run("ATokenActsForNoOtherAttempt", func(t *testing.T) {
		sb := streamSetup(t, streamLimits, streamClients())
		c := sb.rawStream(t, "127.0.0.1")
		sb.clk.Advance(time.Second)
		// The agent's own heartbeat first: its envelope is now cached on
		// the stream.
		if _, err := c.Write(frame(sb.ta, sb.a)); err != nil {
			t.Fatal(err)
		}
		if an := readAnswer(t, c); an.kind != 0 {
			t.Fatalf("own heartbeat: %+v", an)
		}
		before := sb.rows(t)
		sb.clk.Advance(time.Second)
		if _, err := c.Write(frame(sb.ta, sb.b)); err != nil {
			t.Fatal(err)
		}
		an := readAnswer(t, c)
		if an.kind != 1 || an.status != 403 || an.err.Code != attemptapi.CodeWrongScope {
			t.Fatalf("a frame for another attempt answered %+v, want a 403 wrong_scope on the stream", an)
		}
		sb.unchanged(t, before)
		if n := sb.meter.Count("heartbeat/" + attemptapi.CodeWrongScope); n != 1 {
			t.Fatalf("wrong scope metered %d times", n)
		}
		if !strings.Contains(sb.log.String(), "attempt api call refused") {
			t.Errorf("not logged:\n%s", sb.log)
		}
		// Answered on the stream, which goes on.
		if _, err := c.Write(frame(sb.ta, sb.a)); err != nil {
			t.Fatal(err)
		}
		if an := readAnswer(t, c); an.kind != 0 {
			t.Fatalf("own heartbeat after the refusal: %+v", an)
		}
	})

	t.Run("ATokenThatExpiresWhileTheStreamLivesIsRefused", func(t *testing.T) {
		sb := streamSetup(t, streamLimits, streamClients())
		hs, err := attemptapi.NewHeartbeatStream(sb.ln.URL, sb.ln.CA)
		if err != nil {
			t.Fatal(err)
		}
		defer hs.Close()
		sb.clk.Advance(time.Second)
		if _, err := hs.Heartbeat(ctx, sb.ta, sb.a); err != nil {
			t.Fatal(err)
		}
		before := sb.rows(t)
		sb.clk.Advance(ttl) // the token expires on the server's clock; the stream is the same
		_, err = hs.Heartbeat(ctx, sb.ta, sb.a)
		refusedWith(t, err, attemptapi.CodeExpired)
		sb.unchanged(t, before)
		if n := sb.meter.Count("heartbeat/" + attemptapi.CodeExpired); n != 1 {
			t.Fatalf("expired metered %d times", n)
		}
		if all, _ := sb.ln.Open(""); all != 1 {
			t.Fatalf("%d connections open: the refusal is answered on the stream, which stays", all)
		}
	})

	t.Run("ATokenThatDoesNotVerifyClosesTheStream", func(t *testing.T) {
		sb := streamSetup(t, streamLimits, streamClients())
		before := sb.rows(t)
		c := sb.rawStream(t, "127.0.0.1")
		forged := sb.ta[:len(sb.ta)-4] + "AAAA"
		if _, err := c.Write(frame(forged, sb.a)); err != nil {
			t.Fatal(err)
		}
		an := readAnswer(t, c)
		if an.kind != 2 || an.status != 401 || an.err.Code != attemptapi.CodeForged {
			t.Fatalf("a forged token answered %+v, want a closing 401 forged", an)
		}
		closed(t, c, "after a token that does not verify")
		if n := sb.meter.Count("heartbeat/" + attemptapi.CodeForged); n != 1 {
			t.Fatalf("forged metered %d times: %s", n, sb.meter)
		}
		// No token at all: the same.
		c = sb.rawStream(t, "127.0.0.1")
		if _, err := c.Write(frame("", sb.a)); err != nil {
			t.Fatal(err)
		}
		if an := readAnswer(t, c); an.kind != 2 || an.err.Code != attemptapi.CodeNoToken {
			t.Fatalf("no token answered %+v", an)
		}
		closed(t, c, "after a frame without a token")
		sb.unchanged(t, before)
	})

	t.Run("CallBoundsCountEveryFrame", func(t *testing.T) {
		bounds := streamClients()
		bounds.SubjectRequests, bounds.AddressRequests = 5, 8
		sb := streamSetup(t, streamLimits, bounds)
		c := sb.rawStream(t, "127.0.0.2")
		for i := range 5 {
			if _, err := c.Write(frame(sb.ta, sb.a)); err != nil {
				t.Fatal(err)
			}
			if an := readAnswer(t, c); an.kind != 0 {
				t.Fatalf("frame %d within the bounds: %+v", i, an)
			}
		}
		before := sb.rows(t)
		if _, err := c.Write(frame(sb.ta, sb.a)); err != nil {
			t.Fatal(err)
		}
		if an := readAnswer(t, c); an.kind != 2 || an.status != 429 || an.err.Code != attemptapi.CodeTooManyRequests {
			t.Fatalf("the token's 6th frame in a heartbeat answered %+v, want a closing 429", an)
		}
		closed(t, c, "after a frame over the token's bound")
		// The address's bound too, across streams and tokens: 8 a period.
		c = sb.rawStream(t, "127.0.0.2")
		for i := range 2 {
			if _, err := c.Write(frame(sb.tb, sb.b)); err != nil {
				t.Fatal(err)
			}
			if an := readAnswer(t, c); an.kind != 0 {
				t.Fatalf("other's frame %d: %+v", i, an)
			}
		}
		if _, err := c.Write(frame(sb.tb, sb.b)); err != nil {
			t.Fatal(err)
		}
		if an := readAnswer(t, c); an.kind != 2 || an.status != 429 {
			t.Fatalf("the address's 9th frame answered %+v, want a closing 429", an)
		}
		closed(t, c, "after a frame over the address's bound")
		if n := sb.meter.Count("heartbeat/" + attemptapi.CodeTooManyRequests); n != 2 {
			t.Fatalf("%d refusals of the bounds metered, want 2", n)
		}
		for _, line := range []string{"over its calls per heartbeat"} {
			if !strings.Contains(sb.log.String(), line) {
				t.Errorf("%q not logged:\n%s", line, sb.log)
			}
		}
		if got := sb.ti(t, sb.a); got != before[sb.a] {
			t.Errorf("a refused frame wrote: %+v", got)
		}
		// A period later the token may beat again.
		sb.clk.Advance(bounds.Per)
		hs, err := attemptapi.NewHeartbeatStream(sb.ln.URL, sb.ln.CA)
		if err != nil {
			t.Fatal(err)
		}
		defer hs.Close()
		if _, err := hs.Heartbeat(ctx, sb.ta, sb.a); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("TheTokensCallsInFlightCountFramesOfEveryStream", func(t *testing.T) {
		bounds := streamClients()
		bounds.SubjectInFlight = 1
		wclk := clock.NewFake(base)
		sb := streamSetupWith(t, streamLimits, bounds, func(c *attemptapi.ServerConfig) {
			c.HeartbeatWindow, c.WindowClock = window, wclk
		})
		first := sb.rawStream(t, "127.0.0.1")
		if _, err := first.Write(frame(sb.ta, sb.a)); err != nil {
			t.Fatal(err)
		}
		inWindow(t, wclk) // the first frame waits in its batch: in flight
		second := sb.rawStream(t, "127.0.0.1")
		if _, err := second.Write(frame(sb.ta, sb.a)); err != nil {
			t.Fatal(err)
		}
		if an := readAnswer(t, second); an.kind != 2 || an.status != 429 || an.err.Code != attemptapi.CodeTooManyRequests {
			t.Fatalf("a second frame of the token while one is in flight answered %+v, want a closing 429", an)
		}
		closed(t, second, "after a frame over the token's calls in flight")
		wclk.Advance(window)
		if an := readAnswer(t, first); an.kind != 0 {
			t.Fatalf("the first frame: %+v", an)
		}
		if n := sb.meter.Count("heartbeat/" + attemptapi.CodeTooManyRequests); n != 1 {
			t.Fatalf("%d refusals of the bound metered, want 1", n)
		}
		if !strings.Contains(sb.log.String(), "too many calls in flight") {
			t.Errorf("not logged:\n%s", sb.log)
		}
	})

	t.Run("AStreamBetweenFramesGivesWayUnderTheAddressCap_OneServingAFrameDoesNot", func(t *testing.T) {
		bounds := streamClients()
		bounds.MaxConnsPerAddress = 2
		sb := streamSetup(t, streamLimits, bounds)
		waiting := sb.rawStream(t, "127.0.0.2")
		if _, err := waiting.Write(frame(sb.ta, sb.a)); err != nil {
			t.Fatal(err)
		}
		if an := readAnswer(t, waiting); an.kind != 0 {
			t.Fatalf("heartbeat: %+v", an)
		}
		serving := sb.rawStream(t, "127.0.0.2")
		f := frame(sb.tb, sb.b)
		if _, err := serving.Write(f[:8]); err != nil { // a frame begun: served from its length on
			t.Fatal(err)
		}
		waitFor(t, "the second stream serving its frame", func() bool { return sb.ln.Serving() == 1 })
		sb.clk.Advance(httplimit.NewGraceDefault)
		// A third connection of the address: the stream waiting between
		// frames gives way, the one serving a frame does not.
		third := sb.rawStream(t, "127.0.0.2")
		closed(t, waiting, "the stream waiting between frames, at the address's cap")
		waitFor(t, "the eviction metered", func() bool { return sb.meter.Conns(attemptapi.ConnEvictedAddressCap) == 1 })
		if _, err := serving.Write(f[8:]); err != nil {
			t.Fatal(err)
		}
		if an := readAnswer(t, serving); an.kind != 0 {
			t.Fatalf("the frame served across the eviction: %+v", an)
		}
		// A fourth, with every connection of the address serving a frame:
		// refused.
		if _, err := serving.Write(f[:8]); err != nil {
			t.Fatal(err)
		}
		if _, err := third.Write(frame(sb.ta, sb.a)[:8]); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "both serving", func() bool { return sb.ln.Serving() == 2 })
		sb.clk.Advance(httplimit.NewGraceDefault)
		d := &tls.Dialer{NetDialer: &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}},
			Config: &tls.Config{RootCAs: certPool(sb.ln.CA), NextProtos: []string{attemptapi.ProtoHeartbeatStream}}}
		if c, err := d.DialContext(ctx, "tcp", sb.ln.Addr().String()); err == nil {
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			closed(t, c, "a new connection with every one of its address's serving a frame")
		}
		waitFor(t, "the refusal metered", func() bool { return sb.meter.Conns(attemptapi.ConnRefusedAddressCap) == 1 })
	})

	t.Run("IdleTimeoutClosesAStreamWithoutFrames_TheClientRedials", func(t *testing.T) {
		idle := 300 * time.Millisecond
		limits := streamLimits
		limits.ReadHeaderTimeout, limits.IdleTimeout = idle, idle
		sb := streamSetup(t, limits, streamClients())
		c := sb.rawStream(t, "127.0.0.1")
		began := time.Now()
		closed(t, c, "a stream that sent no frame, past read_header_timeout")
		if took := time.Since(began); took < idle {
			t.Fatalf("closed after %s, before the timeout %s", took, idle)
		}
		c = sb.rawStream(t, "127.0.0.1")
		if _, err := c.Write(frame(sb.ta, sb.a)); err != nil {
			t.Fatal(err)
		}
		readAnswer(t, c)
		began = time.Now()
		closed(t, c, "a stream idle past idle_timeout")
		if took := time.Since(began); took < idle {
			t.Fatalf("closed after %s, before the idle timeout %s", took, idle)
		}
		// The agent's stream, closed by the server between heartbeats:
		// its next heartbeat goes on a new stream, without a failure.
		hs, err := attemptapi.NewHeartbeatStream(sb.ln.URL, sb.ln.CA)
		if err != nil {
			t.Fatal(err)
		}
		defer hs.Close()
		if _, err := hs.Heartbeat(ctx, sb.ta, sb.a); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the idle stream closed", func() bool { all, _ := sb.ln.Open(""); return all == 0 })
		sb.clk.Advance(time.Second)
		if _, err := hs.Heartbeat(ctx, sb.ta, sb.a); err != nil {
			t.Fatalf("a heartbeat after the server closed the idle stream: %v", err)
		}
		if got := sb.ti(t, sb.a).LastHeartbeatAt; !got.Equal(sb.clk.Now()) {
			t.Fatalf("heartbeat on the board at %v, want %v", got, sb.clk.Now())
		}
	})

	t.Run("HTTPOnANegotiatedStreamAndGarbageClose", func(t *testing.T) {
		sb := streamSetup(t, streamLimits, streamClients())
		before := sb.rows(t)
		c := sb.rawStream(t, "127.0.0.1")
		req := "POST " + attemptapi.PathHeartbeat + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + sb.ta +
			"\r\nContent-Length: 2\r\n\r\n{}"
		if _, err := c.Write([]byte(req)); err != nil {
			t.Fatal(err)
		}
		closed(t, c, "HTTP on the stream")
		for i, junk := range [][]byte{{0, 0, 0, 0}, {0, 0, 0, 1, 7}, {0xff, 0xff, 0xff, 0xff, 1, 2, 3}} {
			c := sb.rawStream(t, "127.0.0.1")
			if _, err := c.Write(junk); err != nil {
				t.Fatal(err)
			}
			closed(t, c, fmt.Sprintf("garbage %d", i))
		}
		waitFor(t, "each metered", func() bool { return sb.meter.Conns(attemptapi.ConnStreamFrameSize) == 4 })
		// A well-framed body that is no JSON: answered 400 on the stream.
		c = sb.rawStream(t, "127.0.0.1")
		if _, err := c.Write(rawFrame(len(sb.ta), sb.ta+"\x00garbage{")); err != nil {
			t.Fatal(err)
		}
		if an := readAnswer(t, c); an.kind != 1 || an.status != 400 || an.err.Code != attemptapi.CodeBadRequest {
			t.Fatalf("a body of garbage answered %+v, want 400 bad_request", an)
		}
		if n := sb.meter.Count("heartbeat/" + attemptapi.CodeBadRequest); n != 1 {
			t.Fatalf("bad request metered %d times", n)
		}
		sb.unchanged(t, before)
	})

	t.Run("ShutdownClosesTheStreams", func(t *testing.T) {
		sb := streamSetup(t, streamLimits, streamClients())
		c := sb.rawStream(t, "127.0.0.1")
		if _, err := c.Write(frame(sb.ta, sb.a)); err != nil {
			t.Fatal(err)
		}
		readAnswer(t, c)
		began := time.Now()
		sb.stop()
		if took := time.Since(began); took > 3*time.Second {
			t.Fatalf("shutdown took %s with a stream open: it waited for the stream", took)
		}
		closed(t, c, "after shutdown")
	})
}

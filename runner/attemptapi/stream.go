package attemptapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"time"
)

// The heartbeat stream: an agent's heartbeats as small frames on one
// long-lived TLS connection of the API's own listener, instead of one
// HTTP/1.1 request each. The client asks for it by ALPN
// (ProtoHeartbeatStream beside "http/1.1"); a server that does not offer
// it answers the handshake with HTTP/1.1, and the agent's heartbeats go
// over HTTP as before. The stream carries heartbeats and nothing else.
//
// A frame in (client to server):
//
//	length   uint32, big-endian: the bytes that follow (2 to maxStreamFrame)
//	tokenLen uint16, big-endian
//	token    tokenLen bytes: the attempt's token, as the Authorization header carries it
//	body     the rest: the heartbeat's JSON body, as over HTTP
//
// A frame out (server to client), one per frame in, in order:
//
//	length   uint32, big-endian: the bytes that follow
//	kind     1 byte: frameAnswer, frameRefusal or frameRefusalClosing
//	answer   the JSON answer, as over HTTP (frameAnswer), or
//	status   uint16, big-endian, the HTTP status the refusal has over HTTP,
//	         then its JSON error body (the refusals)
//
// Each frame is served by the very code an HTTP heartbeat is
// (Server.authorized with Server.heartbeat, then Server.settle): the call
// bounds, the token's envelope from the stream's own cache, the expiry on
// the server's clock, the scope against the frame's body, the renewal's
// judgment, the batcher, the same answer, metered and logged as over HTTP.
// What the stream changes is the transport only: no request line, no
// headers, one TLS record each way.

// ProtoHeartbeatStream is the heartbeat stream's ALPN protocol name.
const ProtoHeartbeatStream = "reaper-heartbeat/1"

// maxStreamFrame bounds a frame, in either direction, past its length: a
// token (a few hundred bytes; a few KiB at most for the longest names a
// board takes) and a heartbeat's body (under a hundred bytes). It is read
// from the length before any byte of the frame is, so a client cannot make
// the server buffer more; a frame over it closes the stream. A client
// whose token and body would not fit sends that heartbeat over HTTP.
const maxStreamFrame = 16 << 10

// Kinds of a frame out.
const (
	frameAnswer = 0
	// frameRefusal: a refusal answered on the stream, which goes on.
	frameRefusal = 1
	// frameRefusalClosing: a refusal after which the server closes the
	// stream, as it closes an HTTP connection after the same refusal
	// (refused before the body would be read: the call bounds, a token
	// that does not verify).
	frameRefusalClosing = 2
)

// Results of ConnMeter.AttemptAPIConnection for the heartbeat stream: one
// negotiated, and one the server closed for its framing (each of those also
// logged at a bounded rate).
const (
	// ConnStreamOpened: a connection negotiated the heartbeat stream.
	ConnStreamOpened = "stream_opened"
	// ConnStreamFrameSize: a frame's length was under the least a frame
	// holds or over maxStreamFrame (a client speaking anything else than
	// the stream after negotiating it lands here too).
	ConnStreamFrameSize = "stream_frame_size"
	// ConnStreamMalformed: a frame's token length ran past the frame.
	ConnStreamMalformed = "stream_malformed"
)

// streamSet is the streams a Serve holds open, so that its shutdown can
// close them: a stream waiting for a frame at once, one serving a frame
// once it is answered.
type streamSet struct {
	mu      sync.Mutex
	open    map[*tls.Conn]bool // true: waiting for its next frame
	closing bool
}

func newStreamSet() *streamSet { return &streamSet{open: map[*tls.Conn]bool{}} }

// add counts c in; false when the server is shutting down (c is then not
// served).
func (s *streamSet) add(c *tls.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.open[c] = false
	return true
}

func (s *streamSet) remove(c *tls.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.open, c)
}

// wait marks c waiting for its next frame, with deadline as its read
// deadline; false when the server is shutting down (c is then closed).
// The deadline is set under the lock, so a shutdown either sees c waiting
// (and ends its read) or c sees the shutdown.
func (s *streamSet) wait(c *tls.Conn, deadline time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.open[c] = true
	_ = c.SetReadDeadline(deadline)
	return true
}

// serving marks c serving a frame: a shutdown lets it answer.
func (s *streamSet) serving(c *tls.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open[c] = false
}

// shutdown ends every stream's wait for a frame, and every stream's
// service after the frame it serves: the http.Server's RegisterOnShutdown
// hook, as Shutdown does not close the connections it handed to
// TLSNextProto.
func (s *streamSet) shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing = true
	for c, waiting := range s.open {
		if waiting {
			_ = c.SetReadDeadline(time.Unix(1, 0))
		}
	}
}

// serveStream serves the heartbeat stream on c (its TLS handshake done,
// ProtoHeartbeatStream negotiated) until the client goes, the stream idles
// past the idle timeout, a frame closes it, the listener closes it to make
// room, or the server shuts down. The caller (net/http) closes c after.
//
// The listener's bounds hold as for an HTTP connection: c counts against
// the server's and its source address's connection caps, and between
// frames it is waiting (StateIdle), closed first to make room exactly as
// a kept-alive connection between requests is; while a frame is served it
// is active (StateActive). Deadlines are the server's limits: a new
// stream's first frame must begin within read_header_timeout (a new
// connection's first request), each next one within idle_timeout; a
// frame, once its length is read, must arrive within read_timeout, and
// its answer be written within write_timeout.
func (s *Server) serveStream(ctx context.Context, ln *Listener, c *tls.Conn, set *streamSet) {
	if !set.add(c) {
		return
	}
	defer set.remove(c)
	if ln.streamOpened != nil {
		ln.streamOpened()
	}
	limits := ln.limits
	connState := func(http.ConnState) {}
	if ln.tracked != nil {
		connState = func(st http.ConnState) { ln.tracked.ConnState(c, st) }
	}
	// Where the frames come from, read once for the stream: the source
	// address the bounds count (requestAddr: "" for a client on this
	// host), as for an HTTP request on the same connection.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	from := originOf((&http.Request{RemoteAddr: c.RemoteAddr().String()}).
		WithContext(context.WithValue(sctx, http.LocalAddrContextKey, c.LocalAddr())))
	tokens := &connTokens{}
	var (
		head [4]byte
		out  bytes.Buffer
	)
	wait := limits.ReadHeaderTimeout
	for {
		connState(http.StateIdle)
		if !set.wait(c, time.Now().Add(wait)) {
			return
		}
		if _, err := io.ReadFull(c, head[:]); err != nil {
			return
		}
		set.serving(c)
		connState(http.StateActive)
		wait = limits.IdleTimeout
		began := time.Now()
		_ = c.SetReadDeadline(began.Add(limits.ReadTimeout))
		_ = c.SetWriteDeadline(began.Add(limits.WriteTimeout))
		n := binary.BigEndian.Uint32(head[:])
		if n < 2 || n > maxStreamFrame {
			if ln.streamClosed != nil {
				ln.streamClosed(ConnStreamFrameSize, from.remote, int64(n))
			}
			return
		}
		bp := s.wire.frame()
		frame := (*bp)[:n]
		if _, err := io.ReadFull(c, frame); err != nil {
			s.wire.frames.Put(bp)
			return
		}
		tl := int(binary.BigEndian.Uint16(frame[:2]))
		if 2+tl > int(n) {
			s.wire.frames.Put(bp)
			if ln.streamClosed != nil {
				ln.streamClosed(ConnStreamMalformed, from.remote, int64(tl))
			}
			return
		}
		closing := s.streamFrame(sctx, from, tokens, string(frame[2:2+tl]), frame[2+tl:], &out)
		s.wire.frames.Put(bp)
		if _, err := c.Write(out.Bytes()); err != nil || closing {
			return
		}
	}
}

// streamFrame serves one frame's heartbeat, exactly as an HTTP heartbeat
// is served (the same authorisation, handler, answer, log and meter), and
// writes the frame out into out; true: the stream closes after it.
func (s *Server) streamFrame(ctx context.Context, from origin, tokens *connTokens, token string, body []byte,
	out *bytes.Buffer) bool {
	start := s.cfg.Clock.Now()
	resp, err := s.authorized(ctx, from, tokens, PathHeartbeat, token, bytes.NewReader(body), s.heartbeat)
	ref, result := s.settle(CallHeartbeat, from.remote, resp, err)
	out.Reset()
	out.Write([]byte{0, 0, 0, 0, frameAnswer})
	switch {
	case ref == nil:
		s.wire.writeResponse(out, resp)
	default:
		kind := byte(frameRefusal)
		if ref.unread {
			kind = frameRefusalClosing
		}
		out.Bytes()[4] = kind
		var status [2]byte
		binary.BigEndian.PutUint16(status[:], uint16(ref.status))
		out.Write(status[:])
		_ = json.NewEncoder(out).Encode(ref.body)
	}
	binary.BigEndian.PutUint32(out.Bytes()[:4], uint32(out.Len()-4))
	s.meterCall(CallHeartbeat, result, start)
	return ref != nil && ref.unread
}

package attemptapi

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// ErrNoStream: the heartbeat was not sent on the stream, and nothing of it
// reached the server: the server did not negotiate the stream (a server
// from before it, or something in between that speaks HTTP/1.1 only), or
// the heartbeat would not fit a frame. Send it over HTTP.
var ErrNoStream = errors.New("attempt api: no heartbeat stream")

// streamHandshakeTimeout bounds the stream's dial and TLS handshake, as
// NewTransport bounds an HTTP connection's handshake.
const streamHandshakeTimeout = 10 * time.Second

// HeartbeatStream is the agent's side of the heartbeat stream (stream.go):
// one TLS connection to the API on which heartbeats go as frames, one at a
// time. It is dialed at the first heartbeat and again at the next
// heartbeat after it broke; a heartbeat on a stream kept from before that
// finds it closed by the server (its idle timeout, a connection closed to
// make room, a restart) is sent once more on a new one at once, as
// net/http resends a request on a kept-alive connection the server had
// closed. A heartbeat may be sent twice that way: it moves a timestamp,
// and the second is judged on its own. Safe for concurrent use (the
// heartbeats then take turns).
type HeartbeatStream struct {
	addr string
	tls  *tls.Config

	mu       sync.Mutex
	conn     *tls.Conn
	used     bool // conn has carried a heartbeat
	noStream bool // the server did not negotiate the stream
	in       []byte
	out      []byte
}

// NewHeartbeatStream is a heartbeat stream to base (https://host:port),
// trusting caPEM ("" = the system's roots). Nothing is dialed yet.
func NewHeartbeatStream(base, caPEM string) (*HeartbeatStream, error) {
	u, err := url.Parse(base)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("attempt api heartbeat stream: %q is not an https:// address", base)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "443")
	}
	tc, err := clientTLS(caPEM)
	if err != nil {
		return nil, err
	}
	tc.ServerName = u.Hostname()
	tc.NextProtos = []string{ProtoHeartbeatStream, "http/1.1"}
	return &HeartbeatStream{addr: addr, tls: tc}, nil
}

// Close closes the stream's connection, if one is open; a later heartbeat
// dials again.
func (s *HeartbeatStream) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drop()
}

func (s *HeartbeatStream) drop() {
	if s.conn != nil {
		_ = s.conn.Close()
		s.conn, s.used = nil, false
	}
}

// Heartbeat sends a heartbeat of a with token and returns the answer. Its
// errors are the Client's over HTTP: an API's refusal is a CallError
// (ErrRefused for a 4xx but 429), a failure short of an answer is any
// other error, and ErrNoStream says the heartbeat was not sent (send it
// over HTTP).
func (s *HeartbeatStream) Heartbeat(ctx context.Context, token string, a sdk.Attempt) (Response, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.noStream {
		return Response{}, ErrNoStream
	}
	body, err := json.Marshal(request(a, nil))
	if err != nil {
		return Response{}, fmt.Errorf("attempt api %s: %w", PathHeartbeat, err)
	}
	if 2+len(token)+len(body) > maxStreamFrame || len(token) > 0xffff {
		return Response{}, fmt.Errorf("%w: the heartbeat is over a frame", ErrNoStream)
	}
	s.out = binary.BigEndian.AppendUint32(s.out[:0], uint32(2+len(token)+len(body)))
	s.out = binary.BigEndian.AppendUint16(s.out, uint16(len(token)))
	s.out = append(append(s.out, token...), body...)
	for retried := false; ; retried = true {
		if s.conn == nil {
			if err := s.dial(ctx); err != nil {
				return Response{}, err
			}
		}
		kept := s.used
		resp, answered, err := s.roundTrip(ctx)
		s.used = true
		var ce *CallError
		switch {
		case err == nil:
			return resp, nil
		case errors.As(err, &ce):
			return Response{}, fmt.Errorf("attempt api %s: %w", PathHeartbeat, err)
		}
		s.drop()
		if ctx.Err() != nil {
			return Response{}, fmt.Errorf("attempt api %s (stream): %w", PathHeartbeat, ctx.Err())
		}
		if kept && !answered && !retried {
			continue
		}
		return Response{}, fmt.Errorf("attempt api %s (stream): %w", PathHeartbeat, err)
	}
}

// dial opens the stream; ErrNoStream when the server answers with another
// protocol (it is then not asked again: its heartbeats go over HTTP).
func (s *HeartbeatStream) dial(ctx context.Context) error {
	dctx, cancel := context.WithTimeout(ctx, streamHandshakeTimeout)
	defer cancel()
	c, err := (&tls.Dialer{Config: s.tls}).DialContext(dctx, "tcp", s.addr)
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return fmt.Errorf("attempt api %s (stream): dialing %s: %w", PathHeartbeat, s.addr, err)
	}
	tc := c.(*tls.Conn)
	if tc.ConnectionState().NegotiatedProtocol != ProtoHeartbeatStream {
		_ = tc.Close()
		s.noStream = true
		return ErrNoStream
	}
	s.conn, s.used = tc, false
	return nil
}

// roundTrip writes the frame in s.out and reads its answer. answered: a
// byte of the answer arrived (a failure after it is not resent). The
// connection is left usable only when err is nil or a CallError of a
// refusal the server answers on the stream.
func (s *HeartbeatStream) roundTrip(ctx context.Context) (resp Response, answered bool, err error) {
	c := s.conn
	deadline, _ := ctx.Deadline()
	_ = c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer func() {
		if !stop() {
			// The context ended during the call: its deadline may land on
			// the connection at any time now.
			s.drop()
			if err == nil {
				err = ctx.Err()
			}
		}
	}()
	if _, err := c.Write(s.out); err != nil {
		return Response{}, false, fmt.Errorf("sending the frame: %w", err)
	}
	var head [4]byte
	if n, err := io.ReadFull(c, head[:]); err != nil {
		return Response{}, n > 0, fmt.Errorf("reading the answer: %w", err)
	}
	n := binary.BigEndian.Uint32(head[:])
	if n < 1 || n > maxStreamFrame {
		return Response{}, true, fmt.Errorf("an answer frame of %d bytes", n)
	}
	if cap(s.in) < int(n) {
		s.in = make([]byte, n)
	}
	frame := s.in[:n]
	if _, err := io.ReadFull(c, frame); err != nil {
		return Response{}, true, fmt.Errorf("reading the answer: %w", err)
	}
	switch kind := frame[0]; kind {
	case frameAnswer:
		if err := json.Unmarshal(frame[1:], &resp); err != nil {
			return Response{}, true, fmt.Errorf("decoding the answer: %w", err)
		}
		return resp, true, nil
	case frameRefusal, frameRefusalClosing:
		if len(frame) < 3 {
			return Response{}, true, errors.New("a refusal frame without its status")
		}
		ce := &CallError{Status: int(binary.BigEndian.Uint16(frame[1:3]))}
		if json.Unmarshal(frame[3:], &ce.Body) != nil || ce.Body.Code == "" {
			ce.Body = ErrorBody{Code: fmt.Sprint(ce.Status), Message: strings.TrimSpace(string(frame[3:]))}
		}
		if kind == frameRefusalClosing {
			s.drop()
		}
		return Response{}, true, ce
	default:
		return Response{}, true, fmt.Errorf("an answer frame of unknown kind %d", kind)
	}
}

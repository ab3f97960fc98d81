// Package httplimit holds what bounds an HTTP server of reaperd against a
// slow or greedy client: the read, write and idle timeouts of each
// connection and a cap on the connections served at once.
//
// A client that opens a connection and never finishes its request headers
// (slowloris) is cut off after ReadHeaderTimeout; one that never finishes
// its body after ReadTimeout; an idle keep-alive connection is closed after
// IdleTimeout. Past MaxConns, new connections wait in the kernel's accept
// queue until a served one closes, so a flood costs the process no more
// than MaxConns sockets and goroutines.
package httplimit

import (
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// Limits bound one server. Every field must be positive (Validate). The
// tags are the keys a server's configuration block gives them.
type Limits struct {
	// ReadHeaderTimeout bounds reading a request's headers (and, on TLS,
	// the handshake before them).
	ReadHeaderTimeout time.Duration `reaper:"read_header_timeout"`
	// ReadTimeout bounds reading a whole request, body included.
	ReadTimeout time.Duration `reaper:"read_timeout"`
	// WriteTimeout bounds writing a response, from the end of the request
	// headers.
	WriteTimeout time.Duration `reaper:"write_timeout"`
	// IdleTimeout closes a keep-alive connection that waits this long for
	// its next request.
	IdleTimeout time.Duration `reaper:"idle_timeout"`
	// MaxConns is the most connections served at once.
	MaxConns int `reaper:"max_connections"`
}

// DefaultTelemetry are the telemetry server's bounds: a scrape or a probe
// is one short request, and its askers are few.
func DefaultTelemetry() Limits {
	return Limits{ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: time.Minute, MaxConns: 64}
}

// DefaultAttemptAPI are the attempt API's bounds. Every live agent keeps
// one connection open between its heartbeats, so the cap is well above the
// attempts one replica serves; a request is a small JSON body, answered
// after one short statement.
func DefaultAttemptAPI() Limits {
	return Limits{ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, MaxConns: 4096}
}

// Validate reports the first field that is not positive, by the name the
// configuration gives it.
func (l Limits) Validate() error {
	for _, f := range []struct {
		key string
		d   time.Duration
	}{
		{"read_header_timeout", l.ReadHeaderTimeout}, {"read_timeout", l.ReadTimeout},
		{"write_timeout", l.WriteTimeout}, {"idle_timeout", l.IdleTimeout},
	} {
		if f.d <= 0 {
			return fmt.Errorf("%s (%s) must be positive", f.key, f.d)
		}
	}
	if l.ReadHeaderTimeout > l.ReadTimeout {
		return fmt.Errorf("read_header_timeout (%s) must not be longer than read_timeout (%s)", l.ReadHeaderTimeout, l.ReadTimeout)
	}
	if l.MaxConns < 1 {
		return fmt.Errorf("max_connections (%d) must be 1 or more", l.MaxConns)
	}
	return nil
}

// Server returns a server of h bounded by l's timeouts (the connection cap
// is the listener's: see Listener).
func (l Limits) Server(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: l.ReadHeaderTimeout, ReadTimeout: l.ReadTimeout,
		WriteTimeout: l.WriteTimeout, IdleTimeout: l.IdleTimeout}
}

// Listener returns ln accepting at most n connections open at once: Accept
// waits while n are open. Wrap the raw TCP listener (under TLS), so a
// handshake in progress counts.
func Listener(ln net.Listener, n int) net.Listener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, n), done: make(chan struct{})}
}

type limitListener struct {
	net.Listener
	slots     chan struct{} // one token per open connection
	done      chan struct{} // closed by Close: a waiting Accept returns
	closeOnce sync.Once
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.slots }}, nil
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

package httplimit

import (
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"time"
)

// TrackedListener is a listener bounded per server and per client:
//   - at most max connections are open at once. At the cap, the connection
//     that has waited longest without a request in progress (idle between
//     requests, or not yet past its TLS handshake and headers after
//     NewGrace) is closed to make room; when every open connection is serving a request, Accept
//     waits until one closes (those are bounded by the server's read and
//     write timeouts). A client that opens connections and holds them
//     without asking anything therefore holds no slot another client needs.
//   - at most perAddr are open at once from one source address. Past it, the
//     address's own longest-waiting connection gives way; when all of its
//     connections are serving requests or still within their grace, the
//     new one is refused (closed at once). Connections from the server's own address (the other end of
//     a loopback connection: every agent of a Lite host) are not counted
//     per address, since every local client shares it.
//
// Wrap the raw TCP listener (under TLS), so that a handshake in progress is
// counted, and set the server's ConnState to the listener's ConnState, which
// tells it when a connection starts and ends a request.
type TrackedListener struct {
	net.Listener
	cfg TrackConfig

	mu      sync.Mutex
	open    int // connections open, and the slot reserved for the next
	pending int // 1 while a slot is reserved for the next connection
	byAddr  map[string]int
	waiting map[*trackedConn]uint64 // connections with no request in progress, by when they began to wait
	seq     uint64

	freed     chan struct{} // a slot was released (buffered 1: the one Accept loop waits on it)
	done      chan struct{} // closed by Close: a waiting Accept returns
	closeOnce sync.Once
}

// TrackConfig configures a TrackedListener.
type TrackConfig struct {
	// Max is the most connections open at once; PerAddr the most from one
	// source address (0: no bound per address).
	Max, PerAddr int
	// NewGrace is how long a new connection may take over its handshake
	// and first headers before it can be closed to make room: a client
	// that is connecting is not cut off by the next one. Default
	// NewGraceDefault.
	NewGrace time.Duration
	// Now and After are the time NewGrace is measured with; default
	// time.Now and time.After.
	Now   func() time.Time
	After func(time.Duration) <-chan time.Time
	// Hooks are told of refusals and evictions.
	Hooks TrackHooks
}

// NewGraceDefault is TrackConfig.NewGrace's default: far above a TLS
// handshake on a loaded machine, far below ReadHeaderTimeout.
const NewGraceDefault = time.Second

// TrackHooks are told of what a TrackedListener does to a client; each is
// optional. They are called from the accept loop: keep them quick.
type TrackHooks struct {
	// Refused: a connection from addr was closed at once, its address over
	// its cap with every one of its connections serving a request.
	Refused func(addr string)
	// Evicted: a connection from addr that waited without a request was
	// closed to make room (reason "address_cap" or "server_cap").
	Evicted func(addr, reason string)
}

// Track returns ln bounded as TrackedListener says.
func Track(ln net.Listener, cfg TrackConfig) *TrackedListener {
	if cfg.NewGrace <= 0 {
		cfg.NewGrace = NewGraceDefault
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.After == nil {
		cfg.After = time.After
	}
	return &TrackedListener{Listener: ln, cfg: cfg, byAddr: map[string]int{},
		waiting: map[*trackedConn]uint64{}, freed: make(chan struct{}, 1), done: make(chan struct{})}
}

type trackedConn struct {
	net.Conn
	l    *TrackedListener
	addr string // the source address counted per address; "" when not counted
	once sync.Once
	// Under l.mu:
	gone   bool      // released
	fresh  bool      // no request begun yet
	opened time.Time // accepted
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c) })
	return err
}

// Accept returns the next admitted connection.
func (l *TrackedListener) Accept() (net.Conn, error) {
	for {
		if err := l.reserve(); err != nil {
			return nil, err
		}
		c, err := l.Listener.Accept()
		if err != nil {
			l.unreserve()
			return nil, err
		}
		if tc := l.admit(c); tc != nil {
			return tc, nil
		}
	}
}

// reserve takes a slot under the server's cap, closing the longest-waiting
// connection when there is none, or waiting when every connection is
// serving a request.
func (l *TrackedListener) reserve() error {
	for {
		l.mu.Lock()
		if l.open < l.cfg.Max {
			l.open++
			l.pending++
			l.mu.Unlock()
			return nil
		}
		victim := l.longestWaiting("")
		l.mu.Unlock()
		if victim != nil {
			l.evict(victim, "server_cap")
			continue
		}
		// Every connection is serving a request or still within its
		// grace: wait for one to close, or for a grace to end.
		select {
		case <-l.freed:
		case <-l.cfg.After(l.cfg.NewGrace):
		case <-l.done:
			return net.ErrClosed
		}
	}
}

func (l *TrackedListener) unreserve() {
	l.mu.Lock()
	l.open--
	l.pending--
	l.mu.Unlock()
	l.signal()
}

// admit counts c against its address's cap, or refuses it; it holds the
// slot reserve took.
func (l *TrackedListener) admit(c net.Conn) *trackedConn {
	tc := &trackedConn{Conn: c, l: l, addr: clientAddr(c), fresh: true, opened: l.cfg.Now()}
	l.mu.Lock()
	l.pending--
	l.mu.Unlock()
	for {
		l.mu.Lock()
		if tc.addr == "" || l.cfg.PerAddr <= 0 || l.byAddr[tc.addr] < l.cfg.PerAddr {
			if tc.addr != "" {
				l.byAddr[tc.addr]++
			}
			l.waiting[tc] = l.seq
			l.seq++
			l.mu.Unlock()
			return tc
		}
		victim := l.longestWaiting(tc.addr)
		if victim == nil {
			l.open--
			l.mu.Unlock()
			_ = c.Close()
			l.signal()
			if l.cfg.Hooks.Refused != nil {
				l.cfg.Hooks.Refused(tc.addr)
			}
			return nil
		}
		l.mu.Unlock()
		l.evict(victim, "address_cap")
	}
}

func (l *TrackedListener) evict(c *trackedConn, reason string) {
	_ = c.Close()
	if l.cfg.Hooks.Evicted != nil {
		l.cfg.Hooks.Evicted(clientHost(c.RemoteAddr()), reason)
	}
}

// longestWaiting is the connection (of addr, or any when addr is "") that
// has waited longest without a request in progress; nil if none. Call with
// l.mu held.
func (l *TrackedListener) longestWaiting(addr string) *trackedConn {
	var (
		best  *trackedConn
		since uint64
	)
	now := l.cfg.Now()
	for c, s := range l.waiting {
		if c.fresh && now.Sub(c.opened) < l.cfg.NewGrace {
			continue
		}
		if (addr == "" || c.addr == addr) && (best == nil || s < since) {
			best, since = c, s
		}
	}
	return best
}

func (l *TrackedListener) release(c *trackedConn) {
	l.mu.Lock()
	c.gone = true
	l.open--
	if c.addr != "" {
		if l.byAddr[c.addr]--; l.byAddr[c.addr] <= 0 {
			delete(l.byAddr, c.addr)
		}
	}
	delete(l.waiting, c)
	l.mu.Unlock()
	l.signal()
}

func (l *TrackedListener) signal() {
	select {
	case l.freed <- struct{}{}:
	default:
	}
}

// ConnState is the server's ConnState hook: a connection serving a request
// (StateActive) cannot be closed to make room; one that is new or idle can.
func (l *TrackedListener) ConnState(c net.Conn, s http.ConnState) {
	if t, ok := c.(*tls.Conn); ok {
		c = t.NetConn()
	}
	tc, ok := c.(*trackedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if tc.gone {
		return
	}
	switch s {
	case http.StateNew, http.StateIdle:
		if _, open := l.waiting[tc]; open || s == http.StateIdle {
			l.waiting[tc] = l.seq
			l.seq++
		}
	case http.StateActive, http.StateHijacked:
		tc.fresh = false
		delete(l.waiting, tc)
	case http.StateClosed:
		delete(l.waiting, tc)
	}
}

// Close stops Accept.
func (l *TrackedListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// Open is how many connections are open now, and how many of them from
// addr (tests and diagnostics).
func (l *TrackedListener) Open(addr string) (all, fromAddr int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open - l.pending, l.byAddr[addr]
}

// Serving is how many open connections are serving a request now.
func (l *TrackedListener) Serving() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open - l.pending - len(l.waiting)
}

// clientAddr is the source address c is counted under: its remote host,
// or "" when that is the server's own address (a client on this host
// dialing it over loopback).
func clientAddr(c net.Conn) string {
	remote, local := clientHost(c.RemoteAddr()), clientHost(c.LocalAddr())
	if remote == local {
		return ""
	}
	return remote
}

// ClientHost is the host part of addr (an IP for TCP).
func clientHost(addr net.Addr) string {
	if ta, ok := addr.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	return host
}

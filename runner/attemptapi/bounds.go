package attemptapi

import (
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/internal/httplimit"
	"github.com/dexaflow/reaper/sdk/clock"
)

// Per-client bounds of the attempt API (httplimit.Clients): one task, or
// one pod, cannot take the connections or the calls every other agent
// needs for its heartbeats.
//
// Connections (the listener, httplimit.TrackedListener): at most
// max_connections_per_address from one source address; at the cap (of the
// address or of the server) a connection waiting without a request in
// progress is closed to make room, and a new one is refused only when all
// of its address's connections are serving requests. Calls (the server):
// a source address may make address_requests_per_heartbeat calls per
// heartbeat, a subject (the attempt or warm worker a token is for, its
// bootstrap token included) token_requests_per_heartbeat, and at most
// token_calls_in_flight of one subject are served at once. The subject is
// read from the token's verified envelope before the body is read, so a
// client without a valid token never holds a connection through a slow
// body. A refused call is answered 429 (CodeTooManyRequests: retry later),
// metered like every call, and logged at a bounded rate.

// CodeTooManyRequests answers a call over its client's bounds (429): the
// agent retries it later.
const CodeTooManyRequests = "too_many_requests"

// ConnMeter receives what the listener does to a client's connection:
// "refused_address_cap" (closed at once: its address is at its cap, each
// of its connections in a call or just opened), "evicted_address_cap" or
// "evicted_server_cap" (a connection waiting without a request, closed to
// make room), and of the heartbeat stream: "stream_opened",
// "stream_frame_size", "stream_malformed" (stream.go). The host's Meter
// implements it; a Meter that does not is not told.
type ConnMeter interface {
	AttemptAPIConnection(result string)
}

// Results of ConnMeter.AttemptAPIConnection.
const (
	ConnRefusedAddressCap = "refused_address_cap"
	ConnEvictedAddressCap = "evicted_address_cap"
	ConnEvictedServerCap  = "evicted_server_cap"
)

// refusalLogEvery is how often a kind of refusal of a flood is logged: the
// first at once, then one line per period carrying how many were not.
const refusalLogEvery = 10 * time.Second

// sparseLog logs a kind of event at most once per period, with the count
// of those left unlogged since.
type sparseLog struct {
	log   hclog.Logger
	clock clock.Clock
	every time.Duration

	mu   sync.Mutex
	last map[string]time.Time
	held map[string]int
}

func newSparseLog(log hclog.Logger, clk clock.Clock) *sparseLog {
	return &sparseLog{log: log, clock: clk, every: refusalLogEvery, last: map[string]time.Time{}, held: map[string]int{}}
}

// Warn logs msg under kind unless one was logged less than a period ago.
func (s *sparseLog) Warn(kind, msg string, args ...any) {
	now := s.clock.Now()
	s.mu.Lock()
	last, seen := s.last[kind]
	if seen && now.Sub(last) < s.every {
		s.held[kind]++
		s.mu.Unlock()
		return
	}
	held := s.held[kind]
	s.last[kind], s.held[kind] = now, 0
	s.mu.Unlock()
	s.log.Warn(msg, append(args, "kind", kind, "not_logged_since_last", held)...)
}

// clientBounds are the server's per-client call bounds.
type clientBounds struct {
	byAddr     *httplimit.Buckets
	bySubject  *httplimit.Buckets
	inFlight   *httplimit.InFlight
	log        *sparseLog
	addrRate   int
	subjRate   int
	subjFlight int
}

func newClientBounds(c httplimit.Clients, log *sparseLog) *clientBounds {
	return &clientBounds{byAddr: httplimit.NewBuckets(c.AddressRequests, c.Per),
		bySubject: httplimit.NewBuckets(c.SubjectRequests, c.Per), inFlight: httplimit.NewInFlight(c.SubjectInFlight),
		log: log, addrRate: c.AddressRequests, subjRate: c.SubjectRequests, subjFlight: c.SubjectInFlight}
}

// admit counts the call against its source address and its token's
// subject (subjectOf: the token's envelope verified), and refuses it when
// either is over its bounds; a token whose envelope does not verify is
// refused here, before its body is read. The returned release ends the
// call's place in flight.
func (b *clientBounds) admit(from origin, subjectOf func() (string, error), now time.Time) (func(), *refusal) {
	if addr := from.addr; addr != "" && !b.byAddr.Take(addr, now) {
		b.log.Warn("address_requests", "attempt api: a source address is over its calls per heartbeat: refused",
			"remote", addr, "limit", b.addrRate)
		return nil, refuse(http.StatusTooManyRequests, CodeTooManyRequests,
			"this address made more than %d calls per heartbeat", b.addrRate)
	}
	subject, err := subjectOf()
	if err != nil {
		return nil, tokenRefusal(err)
	}
	if !b.bySubject.Take(subject, now) {
		b.log.Warn("token_requests", "attempt api: a token's subject is over its calls per heartbeat: refused",
			"subject", subject, "remote", from.remote, "limit", b.subjRate)
		return nil, refuse(http.StatusTooManyRequests, CodeTooManyRequests,
			"%s made more than %d calls per heartbeat", subject, b.subjRate)
	}
	if !b.inFlight.Acquire(subject) {
		b.log.Warn("token_in_flight", "attempt api: a token's subject has too many calls in flight: refused",
			"subject", subject, "remote", from.remote, "limit", b.subjFlight)
		return nil, refuse(http.StatusTooManyRequests, CodeTooManyRequests,
			"%s has %d calls in flight already", subject, b.subjFlight)
	}
	return func() { b.inFlight.Release(subject) }, nil
}

// origin is where a call comes from: its source address as the bounds
// count it (requestAddr), its remote address for the log, and the pod
// token it carries (an exchange's proof; "" when none). An HTTP call's is
// read from its request; a heartbeat stream's once, for all its frames.
type origin struct {
	addr, remote, podToken string
}

// originOf is r's origin.
func originOf(r *http.Request) origin {
	return origin{addr: requestAddr(r), remote: r.RemoteAddr, podToken: podToken(r)}
}

// requestAddr is the source address a call is counted under: its remote
// host, or "" when that is the server's own address (a client on this host
// over loopback: every Lite agent shares it, so only the subject bounds
// apply).
func requestAddr(r *http.Request) string {
	remote, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		if local, _, err := net.SplitHostPort(la.String()); err == nil && local == remote {
			return ""
		}
	}
	return remote
}

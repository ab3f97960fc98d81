package httplimit

import (
	"fmt"
	"time"
)

// Clients bound what one client may hold of a server or ask of it, so that
// one greedy or hostile client cannot take what every other client needs.
// A client is a source address (connections, requests) or, where the server
// authenticates its callers, a credential's subject (requests, calls in
// flight). The request bounds are rates: so many per Per, and at most that
// many at once after a quiet spell (a token bucket).
type Clients struct {
	// MaxConnsPerAddress is the most connections open at once from one
	// source address. Connections from the server's own address (every
	// agent of a Lite host dials the loopback address) are not counted per
	// address: there only the server's cap holds, and a connection waiting
	// for a request (idle, or not yet past its headers) gives way to a new
	// one (see TrackedListener).
	MaxConnsPerAddress int
	// AddressRequests is how many requests one source address may make per
	// Per (the server's own address excepted, as above).
	AddressRequests int
	// SubjectRequests is how many requests one subject (an attempt, a warm
	// worker) may make per Per.
	SubjectRequests int
	// SubjectInFlight is how many requests of one subject are served at once.
	SubjectInFlight int
	// Per is the period of the request rates: the ladder's heartbeat, so
	// that a rate reads as requests per heartbeat.
	Per time.Duration
}

// Defaults of the attempt API's per-client bounds (see
// DefaultAttemptAPIClients).
const (
	// AttemptAPIConnsPerAddressDefault: a task pod's agent keeps one or two
	// connections; a warm worker keeps one per attempt it runs (at most
	// the 100 one claim hands out) and its own.
	AttemptAPIConnsPerAddressDefault = 128
	// AttemptAPIAddressRequestsDefault: a warm worker running the most
	// attempts one claim hands out (100) heartbeats 100 times per heartbeat
	// and claims once a second; an address shared by a node's pods (a
	// masquerading proxy) carries one heartbeat per pod.
	AttemptAPIAddressRequestsDefault = 1000
	// AttemptAPISubjectRequestsDefault: an agent makes one call per
	// heartbeat (and a few at its start and end, and retries); a warm
	// worker claims once a second (15 per ladder heartbeat) while it has a
	// free slot.
	AttemptAPISubjectRequestsDefault = 30
	// AttemptAPISubjectInFlightDefault: an agent waits for each answer; its
	// heartbeats and its report may overlap.
	AttemptAPISubjectInFlightDefault = 4
)

// DefaultAttemptAPIClients are the attempt API's per-client bounds on a
// ladder whose heartbeat is heartbeat.
func DefaultAttemptAPIClients(heartbeat time.Duration) Clients {
	return Clients{MaxConnsPerAddress: AttemptAPIConnsPerAddressDefault, AddressRequests: AttemptAPIAddressRequestsDefault,
		SubjectRequests: AttemptAPISubjectRequestsDefault, SubjectInFlight: AttemptAPISubjectInFlightDefault, Per: heartbeat}
}

// Validate reports the first bound that is not positive, by the name the
// configuration gives it.
func (c Clients) Validate() error {
	for _, f := range []struct {
		key string
		n   int
	}{
		{"max_connections_per_address", c.MaxConnsPerAddress}, {"address_requests_per_heartbeat", c.AddressRequests},
		{"token_requests_per_heartbeat", c.SubjectRequests}, {"token_calls_in_flight", c.SubjectInFlight},
	} {
		if f.n < 1 {
			return fmt.Errorf("%s (%d) must be 1 or more", f.key, f.n)
		}
	}
	if c.Per <= 0 {
		return fmt.Errorf("the period of the request bounds (%s) must be positive", c.Per)
	}
	return nil
}

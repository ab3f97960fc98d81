package scale_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/loadproc"
	"github.com/dexaflow/reaper/testkit/machinecpu"
	"github.com/dexaflow/reaper/testkit/massbench"
)

// envHeartbeatLoad names the load's plan (a file of heartbeatPlan): set
// only in the load generator's own process, which BenchmarkScaleHeartbeats
// starts as this test binary running TestScaleHeartbeatLoad.
const envHeartbeatLoad = "REAPER_SCALE_HEARTBEAT_LOAD"

// heartbeatLoadMark prefixes the generator's lines on its standard output
// (the testing package writes its own lines there too).
const heartbeatLoadMark = "heartbeat-load: "

// heartbeatPlan is what the generator is told: where the API is, which CA
// it trusts, every agent's token (in massbench.Attempts order), and the
// load's shape.
type heartbeatPlan struct {
	URL       string        `json:"url"`
	CA        string        `json:"ca"`
	Tokens    []string      `json:"tokens"`
	Seconds   int           `json:"seconds"`
	Rate      int           `json:"rate"`
	Conns     int           `json:"conns"`
	Heartbeat time.Duration `json:"heartbeat"`
	// Transport is how the agents' heartbeats travel: heartbeatStream
	// (the heartbeat stream, as agents send them) or heartbeatHTTP1.
	Transport string `json:"transport"`
}

// Transports of the load (REAPER_SCALE_HEARTBEAT_TRANSPORT).
const (
	heartbeatStream = "stream"
	heartbeatHTTP1  = "http1"
)

// beater sends agent j's heartbeat and keeps its renewed token.
type beater interface {
	heartbeat(ctx context.Context, j int) (attemptapi.Response, error)
	close()
}

// httpBeater: every agent's Client over one shared HTTP/1.1 transport of
// plan.Conns keep-alive connections.
type httpBeater struct {
	tr       *http.Transport
	clients  []*attemptapi.Client
	attempts []sdk.Attempt
}

func (h *httpBeater) heartbeat(ctx context.Context, j int) (attemptapi.Response, error) {
	return h.clients[j].Heartbeat(ctx, h.attempts[j])
}

func (h *httpBeater) close() { h.tr.CloseIdleConnections() }

// streamBeater: plan.Conns heartbeat streams, each taken by whichever
// agent is due while it is free; each agent keeps its own token.
type streamBeater struct {
	free     chan *attemptapi.HeartbeatStream
	all      []*attemptapi.HeartbeatStream
	attempts []sdk.Attempt
	mu       sync.Mutex
	tokens   []string
}

func (s *streamBeater) heartbeat(ctx context.Context, j int) (attemptapi.Response, error) {
	var hs *attemptapi.HeartbeatStream
	select {
	case hs = <-s.free:
	case <-ctx.Done():
		return attemptapi.Response{}, fmt.Errorf("waiting for a free stream: %w", ctx.Err())
	}
	defer func() { s.free <- hs }()
	s.mu.Lock()
	tok := s.tokens[j]
	s.mu.Unlock()
	resp, err := hs.Heartbeat(ctx, tok, s.attempts[j])
	if err == nil && resp.Token != "" {
		s.mu.Lock()
		s.tokens[j] = resp.Token
		s.mu.Unlock()
	}
	return resp, err
}

func (s *streamBeater) close() {
	for _, hs := range s.all {
		hs.Close()
	}
}

func newBeater(plan heartbeatPlan, attempts []sdk.Attempt) (beater, error) {
	switch plan.Transport {
	case heartbeatHTTP1:
		tr, err := attemptapi.NewTransport(plan.CA)
		if err != nil {
			return nil, err
		}
		tr.MaxConnsPerHost, tr.MaxIdleConnsPerHost = plan.Conns, plan.Conns
		hc := &http.Client{Transport: tr}
		h := &httpBeater{tr: tr, clients: make([]*attemptapi.Client, len(plan.Tokens)), attempts: attempts}
		for i, tok := range plan.Tokens {
			if h.clients[i], err = attemptapi.NewClientOver(plan.URL, tok, hc); err != nil {
				return nil, err
			}
		}
		return h, nil
	case heartbeatStream:
		s := &streamBeater{free: make(chan *attemptapi.HeartbeatStream, plan.Conns), attempts: attempts,
			tokens: slices.Clone(plan.Tokens)}
		for range plan.Conns {
			hs, err := attemptapi.NewHeartbeatStream(plan.URL, plan.CA)
			if err != nil {
				return nil, err
			}
			s.all = append(s.all, hs)
			s.free <- hs
		}
		return s, nil
	}
	return nil, fmt.Errorf("no heartbeat transport %q (%s or %s)", plan.Transport, heartbeatStream, heartbeatHTTP1)
}

// heartbeatOutcome is what the generator measured of the load.
type heartbeatOutcome struct {
	Total      int             `json:"total"`
	Failed     int64           `json:"failed"`
	FirstError string          `json:"first_error,omitempty"`
	Elapsed    time.Duration   `json:"elapsed"`
	Quantiles  []time.Duration `json:"quantiles"` // p50, p99, p99.9
	// CPU is the generator's own CPU seconds over the load.
	CPU float64 `json:"cpu"`
}

// TestScaleHeartbeatLoad is the heartbeat load generator of
// BenchmarkScaleHeartbeats, run in a process of its own so that the
// benchmark can tell its CPU from the API's: it opens the connections,
// says "warm", waits for "go" on its standard input, runs the load and
// writes its outcome as one JSON line. Without envHeartbeatLoad it is not
// part of a run.
func TestScaleHeartbeatLoad(t *testing.T) {
	var plan heartbeatPlan
	if ok, err := loadproc.ReadPlan(envHeartbeatLoad, &plan); !ok {
		t.Skip("run only as BenchmarkScaleHeartbeats's load generator")
	} else if err != nil {
		t.Fatal(err)
	}
	out, err := runHeartbeatLoad(context.Background(), plan, bufio.NewReader(os.Stdin), os.Stdout)
	if err != nil {
		t.Fatal(err)
	}
	line, err := json.Marshal(out)
	if err != nil {
		t.Fatalf("encoding the outcome: %v", err)
	}
	loadproc.Say(os.Stdout, heartbeatLoadMark, string(line))
}

// runHeartbeatLoad is the generator: see BenchmarkScaleHeartbeats for what
// it models.
func runHeartbeatLoad(ctx context.Context, plan heartbeatPlan, in *bufio.Reader, out *os.File) (heartbeatOutcome, error) {
	agents := len(plan.Tokens)
	attempts := massbench.Attempts(agents)
	beat, err := newBeater(plan, attempts)
	if err != nil {
		return heartbeatOutcome{}, err
	}
	defer beat.close()
	// The connections are opened before the load: an agent's connection
	// is open long before its heartbeats (its one handshake is at its
	// start), so the pool's handshakes are not paid inside the load's
	// latencies, where hundreds at once would be a burst no fleet sends.
	var warm sync.WaitGroup
	warmErrs := make([]error, plan.Conns)
	for i := range plan.Conns {
		warm.Go(func() {
			j := agents - 1 - i
			_, warmErrs[i] = beat.heartbeat(ctx, j)
		})
	}
	warm.Wait()
	if err := errors.Join(warmErrs...); err != nil {
		return heartbeatOutcome{}, fmt.Errorf("opening the connections: %w", err)
	}
	loadproc.Say(out, heartbeatLoadMark, "warm")
	if line, err := in.ReadString('\n'); err != nil || line != "go\n" {
		return heartbeatOutcome{}, fmt.Errorf("waiting for go: %q, %v", line, err)
	}

	total := plan.Seconds * plan.Rate
	latencies := make([]time.Duration, total) // each written by its heartbeat's goroutine alone
	var (
		failed   atomic.Int64
		firstErr atomic.Value
		wg       sync.WaitGroup
	)
	cpuBefore := machinecpu.Process(os.Getpid())
	began := time.Now()
	// Heartbeat j is agent j mod agents's, due at began + j/rate.
	due := func(j int) time.Time { return began.Add(time.Duration(j) * time.Second / time.Duration(plan.Rate)) }
	for sent := 0; sent < total; {
		// The load's own pace, not a wait for anything: send every
		// heartbeat that is due, then look again a millisecond later.
		for ; sent < total && !due(sent).After(time.Now()); sent++ {
			wg.Add(1)
			go func(j int) {
				defer wg.Done()
				// An agent gives up on a heartbeat after one heartbeat
				// interval (runner/agent): so does the load, counting it
				// failed, which also bounds the run on an overloaded machine.
				hctx, cancel := context.WithDeadline(ctx, due(j).Add(plan.Heartbeat))
				defer cancel()
				resp, err := beat.heartbeat(hctx, j%agents)
				latencies[j] = time.Since(due(j))
				if err == nil && resp.ShouldTerminate {
					err = fmt.Errorf("%s told to terminate", attempts[j%agents])
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}(sent)
		}
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
	o := heartbeatOutcome{Total: total, Failed: failed.Load(), Elapsed: time.Since(began),
		CPU: machinecpu.Process(os.Getpid()) - cpuBefore}
	if e, ok := firstErr.Load().(string); ok {
		o.FirstError = e
	}
	slices.Sort(latencies)
	for _, p := range []float64{0.50, 0.99, 0.999} {
		o.Quantiles = append(o.Quantiles, latencies[min(len(latencies)-1, int(p*float64(len(latencies))))])
	}
	return o, nil
}

package attemptapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/sdk"
)

// ErrRefused is wrapped by every error of a call the API refused (a 4xx:
// the token or the request is not acceptable). Retrying it cannot succeed.
// Any other error (the API unreachable, a 5xx) may pass: retry it.
var ErrRefused = errors.New("attempt api refused the call")

// CallError is an error answer of the API.
type CallError struct {
	Status int
	Body   ErrorBody
}

func (e *CallError) Error() string {
	return fmt.Sprintf("attempt api: %d %s: %s", e.Status, e.Body.Code, e.Body.Message)
}

// Is makes a 4xx answer match ErrRefused.
func (e *CallError) Is(target error) bool {
	return target == ErrRefused && e.Status >= 400 && e.Status < 500 && e.Status != http.StatusTooManyRequests
}

// Client is the agent's side of the API. It keeps the attempt's token and
// replaces it with each renewal. Safe for concurrent use.
type Client struct {
	base string
	hc   *http.Client

	// podTokenFile holds the pod's projected ServiceAccount token, read at
	// each exchange (the kubelet renews it); "": none.
	podTokenFile string

	// stream carries the heartbeats when the server negotiates it (nil:
	// every call over HTTP). ownsHTTP: hc is the client's own, so its
	// idle connection may be closed once the stream carries the
	// heartbeats (see Heartbeat).
	stream     *HeartbeatStream
	ownsHTTP   bool
	calledHTTP atomic.Bool // an HTTP call since the last heartbeat on the stream

	mu    sync.Mutex
	token string
}

// NewClient dials base (https://host:port), trusting caPEM ("" = the
// system's roots), with the attempt's token, over a transport of its own;
// its heartbeats go on a heartbeat stream of its own when the server
// negotiates one (HeartbeatStream), else over HTTP like its other calls.
func NewClient(base, token, caPEM string) (*Client, error) {
	tr, err := NewTransport(caPEM)
	if err != nil {
		return nil, err
	}
	c, err := NewClientOver(base, token, &http.Client{Transport: tr})
	if err != nil {
		return nil, err
	}
	if c.stream, err = NewHeartbeatStream(c.base, caPEM); err != nil {
		return nil, err
	}
	c.ownsHTTP = true
	return c, nil
}

// NewTransport is the agent's transport to the API, trusting caPEM ("" =
// the system's roots): it keeps its connection alive between heartbeats
// (the API's idle_timeout is far above the heartbeat).
func NewTransport(caPEM string) (*http.Transport, error) {
	tc, err := clientTLS(caPEM)
	if err != nil {
		return nil, err
	}
	return &http.Transport{TLSClientConfig: tc, MaxIdleConnsPerHost: 2, IdleConnTimeout: time.Minute,
		ForceAttemptHTTP2: true, TLSHandshakeTimeout: 10 * time.Second}, nil
}

// clientTLS is the agent's TLS configuration, trusting caPEM ("" = the
// system's roots).
func clientTLS(caPEM string) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if caPEM != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(caPEM)) {
			return nil, errors.New("attempt api client: the CA holds no PEM certificate")
		}
		tc.RootCAs = pool
	}
	return tc, nil
}

// NewClientOver is a client of base with the attempt's token over hc's
// connections, which it shares with the other clients given hc (a process
// that speaks for many attempts; Close then closes hc's idle connections
// for all of them). Its heartbeats go over HTTP too.
func NewClientOver(base, token string, hc *http.Client) (*Client, error) {
	if base == "" || token == "" || hc == nil {
		return nil, errors.New("attempt api client: no API address, no token or no HTTP client")
	}
	return &Client{base: strings.TrimSuffix(base, "/"), hc: hc, token: token}, nil
}

// ClientFromEnv builds the client from the environment a runner gave the
// agent (attempttoken.EnvAPI, EnvToken, EnvCA, and EnvPodTokenFile when
// the agent runs in a kube runner's pod).
func ClientFromEnv(getenv func(string) string) (*Client, error) {
	c, err := NewClient(getenv(attempttoken.EnvAPI), getenv(attempttoken.EnvToken), getenv(attempttoken.EnvCA))
	if err != nil {
		return nil, err
	}
	c.UsePodToken(getenv(EnvPodTokenFile))
	return c, nil
}

// UsePodToken makes the client's exchanges carry the pod token held in the
// file at path (HeaderPodToken), read at each exchange: the proof that the
// exchange comes from the pod recorded for it. "": none. Call it before
// the first exchange.
func (c *Client) UsePodToken(path string) { c.podTokenFile = path }

// Token is the token the client holds now.
func (c *Client) Token() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.token
}

// Close releases idle connections, and the heartbeat stream.
func (c *Client) Close() {
	c.hc.CloseIdleConnections()
	if c.stream != nil {
		c.stream.Close()
	}
}

// Running reports the attempt running.
func (c *Client) Running(ctx context.Context, a sdk.Attempt) (bool, error) {
	resp, err := c.do(ctx, PathRunning, request(a, nil))
	return resp.ShouldTerminate, err
}

// Exchange trades the bootstrap token the client holds for the attempt's
// working token, which it then holds: the agent's first call, before
// Running. shouldTerminate: the attempt has moved on (no token given). A
// client that holds no bootstrap token (a warm worker's claimed attempt)
// has nothing to exchange: Exchange returns at once. A second exchange of
// the same attempt is refused (CodeBootstrapSpent, wraps ErrRefused).
func (c *Client) Exchange(ctx context.Context, a sdk.Attempt) (shouldTerminate bool, err error) {
	if !attempttoken.IsBootstrap(c.Token()) {
		return false, nil
	}
	resp, err := c.do(ctx, PathExchange, request(a, nil))
	if err != nil || resp.ShouldTerminate {
		return resp.ShouldTerminate, err
	}
	if resp.Token == "" || attempttoken.IsBootstrap(resp.Token) {
		return false, fmt.Errorf("attempt api %s: the answer holds no working token", PathExchange)
	}
	c.mu.Lock()
	c.token = resp.Token
	c.mu.Unlock()
	return false, nil
}

// ExchangeWorker trades the worker bootstrap token the client holds for
// the worker token of worker, which it then holds: a warm worker's first
// call, before its first claim. A client that holds no worker bootstrap
// token has nothing to exchange: ExchangeWorker returns at once.
func (c *Client) ExchangeWorker(ctx context.Context, worker string) error {
	if !attempttoken.IsWorkerBootstrap(c.Token()) {
		return nil
	}
	resp, err := c.do(ctx, PathWorkerExchange, Request{Worker: worker})
	if err != nil {
		return err
	}
	if resp.Token == "" || attempttoken.IsWorkerBootstrap(resp.Token) {
		return fmt.Errorf("attempt api %s: the answer holds no worker token", PathWorkerExchange)
	}
	c.mu.Lock()
	c.token = resp.Token
	c.mu.Unlock()
	return nil
}

// Heartbeat reports the attempt alive and keeps a renewed token: on the
// client's heartbeat stream when the server negotiates it, else over HTTP.
// Its answer and errors are the same either way. Once the stream carries
// the heartbeats, the client's own HTTP connection, idle since its last
// call (the exchange, RUNNING), is closed: an agent holds one connection
// while its task runs, as before the stream, and dials HTTP again for its
// report.
func (c *Client) Heartbeat(ctx context.Context, a sdk.Attempt) (Response, error) {
	var (
		resp Response
		err  = ErrNoStream
	)
	if c.stream != nil {
		resp, err = c.stream.Heartbeat(ctx, c.Token(), a)
		if err == nil && c.ownsHTTP && c.calledHTTP.Swap(false) {
			c.hc.CloseIdleConnections()
		}
	}
	if errors.Is(err, ErrNoStream) {
		resp, err = c.do(ctx, PathHeartbeat, request(a, nil))
	}
	if err == nil && resp.Token != "" {
		c.mu.Lock()
		c.token = resp.Token
		c.mu.Unlock()
	}
	return resp, err
}

// Report reports the attempt's outcome.
func (c *Client) Report(ctx context.Context, a sdk.Attempt, o ReportBody) (bool, error) {
	resp, err := c.do(ctx, PathReport, request(a, &o))
	return resp.ShouldTerminate, err
}

// State reads the attempt's state.
func (c *Client) State(ctx context.Context, a sdk.Attempt) (Response, error) {
	return c.do(ctx, PathState, request(a, nil))
}

// Claim asks, as warm worker worker (the client holds its worker token),
// for the attempts bound to it, at most slots, saying which attempts it
// runs now (running; none is an empty list, never "unknown"), and keeps
// the renewed worker token.
func (c *Client) Claim(ctx context.Context, worker string, slots int, running []sdk.Attempt) ([]Claimed, error) {
	list := make([]Slot, len(running))
	for i, a := range running {
		list[i] = Slot{RunID: a.RunID, TaskID: a.TaskID, Try: a.Try, Epoch: a.Epoch}
	}
	resp, err := c.doLimited(ctx, PathClaim, Request{Worker: worker, Slots: slots, Running: &list}, MaxClaimReply)
	if err != nil {
		return nil, err
	}
	if resp.Token != "" {
		c.mu.Lock()
		c.token = resp.Token
		c.mu.Unlock()
	}
	return resp.Attempts, nil
}

func request(a sdk.Attempt, o *ReportBody) Request {
	return Request{RunID: a.RunID, TaskID: a.TaskID, Try: a.Try, Epoch: a.Epoch, Outcome: o}
}

// ErrReplyTooLarge: an answer was over what the client reads (maxBody, or
// MaxClaimReply for a claim); nothing of it was used.
var ErrReplyTooLarge = errors.New("attempt api answer over the size the client reads")

func (c *Client) do(ctx context.Context, path string, body Request) (Response, error) {
	return c.doLimited(ctx, path, body, maxBody)
}

func (c *Client) doLimited(ctx context.Context, path string, body Request, limit int64) (Response, error) {
	var podToken string
	if path == PathExchange || path == PathWorkerExchange {
		var err error
		if podToken, err = readPodToken(c.podTokenFile); err != nil {
			return Response{}, fmt.Errorf("attempt api %s: %w", path, err)
		}
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return Response{}, fmt.Errorf("attempt api %s: %w", path, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(raw))
	if err != nil {
		return Response{}, fmt.Errorf("attempt api %s: %w", path, err)
	}
	c.calledHTTP.Store(true)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.Token())
	if podToken != "" {
		req.Header.Set(HeaderPodToken, podToken)
	}
	res, err := c.hc.Do(req)
	if err != nil {
		return Response{}, fmt.Errorf("attempt api %s: %w", path, err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, limit+1))
	if err != nil {
		return Response{}, fmt.Errorf("attempt api %s: reading the answer: %w", path, err)
	}
	if int64(len(data)) > limit {
		return Response{}, fmt.Errorf("attempt api %s: %w (%d bytes)", path, ErrReplyTooLarge, limit)
	}
	if res.StatusCode != http.StatusOK {
		ce := &CallError{Status: res.StatusCode}
		if json.Unmarshal(data, &ce.Body) != nil || ce.Body.Code == "" {
			ce.Body = ErrorBody{Code: http.StatusText(res.StatusCode), Message: strings.TrimSpace(string(data))}
		}
		return Response{}, fmt.Errorf("attempt api %s: %w", path, ce)
	}
	var resp Response
	if err := json.Unmarshal(data, &resp); err != nil {
		return Response{}, fmt.Errorf("attempt api %s: decoding the answer: %w", path, err)
	}
	return resp, nil
}

package attemptapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/internal/httplimit"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// Board is what the server writes and reads: the board's guarded writers
// (lifecycle.Writer).
type Board interface {
	// RunningFor, HeartbeatCredentials and ReportOutcomeFor apply a call
	// only for the credential the board holds for the attempt (the
	// token's first mint; see lifecycle.RunningFor).
	RunningFor(ctx context.Context, a sdk.Attempt, minted, now time.Time) (bool, error)
	HeartbeatCredentials(ctx context.Context, calls []lifecycle.HeartbeatCall) ([]bool, error)
	ReportOutcomeFor(ctx context.Context, a sdk.Attempt, minted time.Time, o lifecycle.TerminalReport, now time.Time) (lifecycle.ReportResult, error)
	TaskInstance(ctx context.Context, runID, taskID string) (board.TaskInstance, error)
	BoundTo(ctx context.Context, worker string, limit int) ([]board.TaskInstance, error)
	ExchangeBootstrap(ctx context.Context, a sdk.Attempt, mintedAt, now time.Time) (lifecycle.Exchange, error)
	ExchangeWorkerBootstrap(ctx context.Context, worker string, issuedAt, expiresAt, now time.Time) (bool, error)
	RecordClaim(ctx context.Context, c lifecycle.WarmClaim) error
	// PodUID and WarmWorkerPodUID read the pod the kube runner recorded
	// for an attempt and for a warm worker ("": none yet), which an
	// exchange must prove it comes from (see PodVerifier).
	PodUID(ctx context.Context, a sdk.Attempt) (string, error)
	WarmWorkerPodUID(ctx context.Context, worker string) (string, error)
}

// Meter receives one observation per call: result is "ok",
// "should_terminate", or the error code of a refused or failed call.
type Meter interface {
	AttemptAPICall(call, result string, took time.Duration)
	CredentialRenewal(renewal string)
}

// ServerConfig configures a Server.
type ServerConfig struct {
	// Keys returns the keyring in force (reread on rotation). Required.
	Keys func() *attempttoken.Keyring
	// TTL is the attempt token TTL of renewed tokens. Required.
	TTL time.Duration
	// Ceiling is auth.max_attempt_credential_lifetime: no renewal once the
	// credential is this old (from its first mint). <= 0: no ceiling.
	Ceiling time.Duration
	// WorkerCeiling is auth.max_worker_credential_lifetime: a warm worker's
	// claim renews its token only while its credential is younger than
	// this (from its first mint, the worker pod's creation); past it the
	// claim is answered capped and the worker's last token lapses one TTL
	// later. <= 0: no ceiling.
	WorkerCeiling time.Duration
	// Board is written through. Required.
	Board Board
	// Meter, when set, meters every call.
	Meter Meter
	// Pods, when set, reviews the pod token an exchange of a kube
	// attempt's or a warm worker's bootstrap must carry (the kube
	// edition's; see PodVerifier). nil: no pod proof is asked (Lite).
	Pods PodVerifier
	// Clock is the time of every check and write. Default clock.Real{}.
	Clock clock.Clock
	// Logger logs refusals and failures. Default: none.
	Logger hclog.Logger
	// Decisions, when set, receives the judgments the board made of a call
	// (a reschedule it refused: reschedule_not_sensor, sensor_timeout,
	// sensor_credential_ceiling), for the host to meter and audit. Each is
	// also logged here.
	Decisions func(ctx context.Context, ds []sdk.Decision)
	// HeartbeatWriters is how many batches of heartbeats are written at
	// once (each takes one board connection while it is written).
	// Default 2.
	HeartbeatWriters int
	// HeartbeatBatch is the most heartbeats written in one batch. Default
	// 500.
	HeartbeatBatch int
	// HeartbeatWindow is how long a batch of heartbeats waits for company
	// before it is written (attempt_api.heartbeat_window): each heartbeat's
	// write, and its answer, wait at most this long for it. 0: a batch is
	// written as soon as a writer is free.
	HeartbeatWindow time.Duration
	// WindowClock times the heartbeat window. Default clock.Real{}, even
	// when Clock is another: the window delays writes and answers and
	// decides nothing (the times written are Clock's), and a fake Clock
	// would hold every heartbeat until its test moved it. A test of the
	// window itself sets a fake one.
	WindowClock clock.Clock
	// Clients bound the calls of one source address and of one token's
	// subject (see bounds.go; its MaxConnsPerAddress is the listener's).
	// The zero value: httplimit.DefaultAttemptAPIClients on the ladder's
	// default heartbeat.
	Clients httplimit.Clients
}

// DecisionSource is the reaper name the attempt API's decisions carry.
const DecisionSource = "attempt-api"

// Server is the attempt API's http.Handler.
type Server struct {
	cfg        ServerConfig
	mux        *http.ServeMux
	heartbeats *heartbeatBatcher
	clients    *clientBounds
	wire       wireBuffers
}

// NewServer checks cfg and builds the handler.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Keys == nil || cfg.Board == nil || cfg.TTL <= 0 {
		return nil, errors.New("attempt api: the server needs keys, a board and a positive token TTL")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.WindowClock == nil {
		cfg.WindowClock = clock.Real{}
	}
	if cfg.HeartbeatWriters <= 0 {
		cfg.HeartbeatWriters = 2
	}
	if cfg.HeartbeatBatch <= 0 {
		cfg.HeartbeatBatch = 500
	}
	if cfg.Clients == (httplimit.Clients{}) {
		cfg.Clients = httplimit.DefaultAttemptAPIClients(ladder.Defaults().Heartbeat)
	}
	if err := cfg.Clients.Validate(); err != nil {
		return nil, fmt.Errorf("attempt api: %w", err)
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(),
		heartbeats: newHeartbeatBatcher(cfg.Board.HeartbeatCredentials, cfg.WindowClock, max(cfg.HeartbeatWindow, 0),
			cfg.HeartbeatWriters, cfg.HeartbeatBatch),
		clients: newClientBounds(cfg.Clients, newSparseLog(cfg.Logger, cfg.Clock))}
	s.mux.HandleFunc(PathRunning, s.handle(CallRunning, s.running))
	s.mux.HandleFunc(PathHeartbeat, s.handle(CallHeartbeat, s.heartbeat))
	s.mux.HandleFunc(PathReport, s.handle(CallReport, s.report))
	s.mux.HandleFunc(PathState, s.handle(CallState, s.state))
	s.mux.HandleFunc(PathClaim, s.handle(CallClaim, s.claim))
	s.mux.HandleFunc(PathExchange, s.handle(CallExchange, s.exchange))
	s.mux.HandleFunc(PathWorkerExchange, s.handle(CallWorkerExchange, s.workerExchange))
	return s, nil
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, pattern := s.mux.Handler(r); pattern == "" {
		writeError(w, http.StatusNotFound, ErrorBody{Code: CodeNotFound, Message: "no such call: " + r.URL.Path})
		return
	}
	s.mux.ServeHTTP(w, r)
}

// refusal is a call answered with an error, nothing written. cause, when
// set, is the error behind it: for the log only, never the body.
type refusal struct {
	status int
	body   ErrorBody
	// unread: refused before the body was read; the answer closes the
	// connection, so that the server does not wait for a body a client
	// may hold back to keep the connection.
	unread bool
	cause  error
}

func (e *refusal) Error() string {
	if e.cause != nil {
		return e.body.Code + ": " + e.body.Message + ": " + e.cause.Error()
	}
	return e.body.Code + ": " + e.body.Message
}

func (e *refusal) Unwrap() error { return e.cause }

// unread marks r refused before the body was read.
func unread(r *refusal) *refusal {
	r.unread = true
	return r
}

func refuse(status int, code, format string, args ...any) *refusal {
	return &refusal{status: status, body: ErrorBody{Code: code, Message: fmt.Sprintf(format, args...)}}
}

// call is one authorised call: its attempt, the token's claims (a
// worker's for a claim), its now.
type call struct {
	req    Request
	token  string // the bearer token, verified
	claims attempttoken.Claims
	// worker is the worker token's claims (claim), or the claims of a
	// worker exchange's bootstrap token.
	worker attempttoken.WorkerClaims
	// podToken is what an exchange carries in HeaderPodToken.
	podToken string
	now      time.Time
}

type handlerFunc func(ctx context.Context, c call) (Response, error)

func (s *Server) handle(name string, h handlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := s.cfg.Clock.Now()
		resp, err := s.serve(r, h)
		ref, result := s.settle(name, r.RemoteAddr, resp, err)
		if ref != nil {
			if ref.unread {
				w.Header().Set("Connection", "close")
			}
			writeError(w, ref.status, ref.body)
		} else {
			w.Header().Set("Content-Type", "application/json")
			s.wire.writeResponse(w, resp)
		}
		s.meterCall(name, result, start)
	}
}

// settle is what a call served (resp, err) is answered with: nil and its
// result as metered ("ok", "should_terminate") when it was accepted, else
// the refusal it is answered with, logged (a refusal of the bounds at a
// bounded rate, by the bounds), and its code. The HTTP handler and the
// heartbeat stream both answer through it.
func (s *Server) settle(name, remote string, resp Response, err error) (*refusal, string) {
	if err == nil {
		if resp.ShouldTerminate {
			return nil, "should_terminate"
		}
		return nil, "ok"
	}
	var ref *refusal
	if !errors.As(err, &ref) {
		// The error's text is for the log: it may carry the
		// database's words.
		ref = &refusal{status: http.StatusInternalServerError, cause: err,
			body: ErrorBody{Code: CodeInternal, Message: "the call failed inside the server; see its log"}}
	}
	switch {
	case ref.body.Code == CodeTooManyRequests: // logged at a bounded rate by the bounds
	case ref.status >= 500:
		s.cfg.Logger.Error("attempt api call failed", "call", name, "error", err)
	default:
		s.cfg.Logger.Warn("attempt api call refused", "call", name, "code", ref.body.Code, "why", ref.body.Message,
			"remote", remote)
	}
	return ref, ref.body.Code
}

// meterCall meters a call that began at start.
func (s *Server) meterCall(name, result string, start time.Time) {
	if s.cfg.Meter != nil {
		s.cfg.Meter.AttemptAPICall(name, result, s.cfg.Clock.Now().Sub(start))
	}
}

// serve authorises an HTTP call and runs h (see authorized).
func (s *Server) serve(r *http.Request, h handlerFunc) (Response, error) {
	if r.Method != http.MethodPost {
		return Response{}, unread(refuse(http.StatusMethodNotAllowed, CodeMethod, "%s: only POST", r.Method))
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		token = ""
	}
	return s.authorized(r.Context(), originOf(r), connTokensOf(r.Context()), r.URL.Path, token, r.Body, h)
}

// authorized authorises the call of path with token and body, from from,
// on a connection whose verified token tokens caches (nil: none), and runs
// h with ctx: the call bounds, then the token must verify at now and be
// for exactly the attempt the body names. It is the one path of every
// call, an HTTP request or a frame of the heartbeat stream (stream.go)
// alike.
func (s *Server) authorized(ctx context.Context, from origin, tokens *connTokens, path, token string,
	body io.Reader, h handlerFunc) (Response, error) {
	if token == "" {
		return Response{}, unread(refuse(http.StatusUnauthorized, CodeNoToken, "no bearer token"))
	}
	// One keyring for the whole call. An attempt token's envelope is
	// verified once per connection while the agent sends the same token
	// (connTokens); its expiry and scope are checked below, on every call.
	keys := s.cfg.Keys()
	var (
		attempt    attempttoken.Claims
		isAttempt  bool
		connTokens = tokens
	)
	subjectOf := func() (string, error) {
		c, subject, err := connTokens.envelope(keys, token)
		if errors.Is(err, attempttoken.ErrWrongKind) {
			return keys.Subject(token) // a worker's or a bootstrap token
		}
		attempt, isAttempt = c, err == nil
		return subject, err
	}
	release, ref := s.clients.admit(from, subjectOf, s.cfg.Clock.Now())
	if ref != nil {
		return Response{}, unread(ref)
	}
	defer release()
	var req Request
	tooLarge, err := s.wire.readRequest(body, &req)
	switch {
	case tooLarge:
		return Response{}, refuse(http.StatusBadRequest, codeTooLarge, "body over %d bytes", maxBody)
	case errors.As(err, new(errTrailing)):
		return Response{}, refuse(http.StatusBadRequest, CodeBadRequest, "trailing data after the body")
	case err != nil:
		return Response{}, refuse(http.StatusBadRequest, CodeBadRequest, "reading the body: %v", err)
	}
	now := s.cfg.Clock.Now()
	if path == PathClaim {
		wc, err := keys.VerifyWorker(token, now)
		if err != nil {
			return Response{}, tokenRefusal(err)
		}
		if wc.Worker != req.Worker {
			return Response{}, refuse(http.StatusForbidden, CodeWrongScope,
				"the token is for warm worker %s, the call names %q", wc.Worker, req.Worker)
		}
		return h(ctx, call{req: req, worker: wc, now: now})
	}
	if path == PathWorkerExchange {
		wc, err := keys.VerifyWorkerBootstrapFor(token, req.Worker, now)
		if err != nil {
			return Response{}, tokenRefusal(err)
		}
		return h(ctx, call{req: req, worker: wc, podToken: from.podToken, now: now})
	}
	if path == PathExchange {
		claims, err := keys.VerifyBootstrapFor(token, req.Attempt(), now)
		if err != nil {
			return Response{}, tokenRefusal(err)
		}
		return h(ctx, call{req: req, claims: claims, podToken: from.podToken, now: now})
	}
	if !isAttempt {
		// Not an attempt token (a worker's, a bootstrap): refused as
		// VerifyFor refuses it.
		_, err := keys.VerifyFor(token, req.Attempt(), now)
		return Response{}, tokenRefusal(err)
	}
	// VerifyFor's checks past the envelope, on every call: the expiry at
	// the server's now, then the scope.
	if err := attempttoken.Expired(attempt, now); err != nil {
		return Response{}, tokenRefusal(err)
	}
	if err := attempttoken.Scoped(attempt, req.Attempt()); err != nil {
		return Response{}, tokenRefusal(err)
	}
	return h(ctx, call{req: req, token: token, claims: attempt, now: now})
}

// podToken is the pod token the request carries ("" when none, or one
// over maxPodToken, which no projected token is).
func podToken(r *http.Request) string {
	t := strings.TrimSpace(r.Header.Get(HeaderPodToken))
	if len(t) > maxPodToken {
		return ""
	}
	return t
}

func tokenRefusal(err error) *refusal {
	for _, m := range []struct {
		err    error
		status int
		code   string
	}{
		{attempttoken.ErrWrongScope, http.StatusForbidden, CodeWrongScope},
		{attempttoken.ErrWrongKind, http.StatusForbidden, CodeWrongKind},
		{attempttoken.ErrExpired, http.StatusUnauthorized, CodeExpired},
		{attempttoken.ErrForged, http.StatusUnauthorized, CodeForged},
		{attempttoken.ErrUnknownKey, http.StatusUnauthorized, CodeUnknownKey},
	} {
		if errors.Is(err, m.err) {
			return refuse(m.status, m.code, "%v", err)
		}
	}
	return refuse(http.StatusUnauthorized, CodeMalformed, "%v", err)
}

// boardFailure turns a board error into a retryable refusal (the agent
// retries Unavailable). The body says what could not be done, in the
// server's fixed words; the board's error, which may carry the database's
// text (a host, a role, a statement), goes to the log only.
func boardFailure(what string, err error) error {
	return &refusal{status: http.StatusServiceUnavailable, cause: err,
		body: ErrorBody{Code: CodeUnavailable, Message: what + ": the board could not be reached; retry"}}
}

func (s *Server) running(ctx context.Context, c call) (Response, error) {
	term, err := s.cfg.Board.RunningFor(ctx, c.req.Attempt(), c.claims.MintedAt, c.now)
	if err != nil {
		return Response{}, boardFailure("recording running", err)
	}
	return Response{ShouldTerminate: term}, nil
}

// heartbeat records the heartbeat and what it does to the credential (see
// renewalOf), in one write batched with the heartbeats that arrive
// meanwhile, and answers with a renewed token only once the board has
// accepted the heartbeat.
func (s *Server) heartbeat(ctx context.Context, c call) (Response, error) {
	keys := s.cfg.Keys()
	r := renewalOf(c.claims, c.now, s.cfg.TTL, s.cfg.Ceiling, keys.SignedWithCurrent(c.token))
	term, err := s.heartbeats.heartbeat(ctx, lifecycle.HeartbeatCall{Attempt: c.req.Attempt(), MintedAt: c.claims.MintedAt,
		Renewal: r, At: c.now})
	if err != nil {
		return Response{}, boardFailure("recording a heartbeat", err)
	}
	switch {
	case term:
		return Response{ShouldTerminate: true}, nil
	case r == lifecycle.Capped:
		s.meterRenewal("capped")
		return Response{Capped: true}, nil
	case r == lifecycle.NotRenewed:
		return Response{}, nil
	}
	tok, rc, err := keys.Renew(c.claims, c.now, s.cfg.TTL)
	if err != nil {
		return Response{}, fmt.Errorf("renewing the credential of %s: %w", c.claims.Attempt, err)
	}
	s.meterRenewal("renewed")
	return Response{Token: tok, ExpiresAt: rc.ExpiresAt}, nil
}

// renewalDueShare: a token is renewed once this share of a TTL is spent
// (at most three quarters of it left): with the ladder's 10 min TTL
// and 15 s heartbeat, one heartbeat in ten renews, and a token the agent
// holds always has at least three quarters of a TTL left to ride out an
// outage of the API.
const renewalDueShare = 4

// renewalOf is what a heartbeat accepted at now does to the credential of
// claims, whose token verified:
//   - Capped: the credential is as old as the ceiling (counted from its
//     first mint); it is never renewed again.
//   - Renewed: a renewal is due: the token has at most three quarters of
//     ttl left; or the ceiling is at most a quarter of ttl away, so that
//     the last renewal is the last heartbeat before the ceiling, exactly as
//     when every heartbeat renewed; or the token is signed with a key that
//     is no longer the current one (a rotation moves a live agent to the
//     new key at its next heartbeat).
//   - NotRenewed: none is due; the agent keeps the token it holds.
func renewalOf(c attempttoken.Claims, now time.Time, ttl, ceiling time.Duration, currentKey bool) lifecycle.Renewal {
	switch {
	case ceiling > 0 && !(now.Sub(c.MintedAt) < ceiling):
		return lifecycle.Capped
	case c.ExpiresAt.Sub(now) <= ttl-ttl/renewalDueShare,
		ceiling > 0 && c.MintedAt.Add(ceiling).Sub(now) <= ttl/renewalDueShare,
		!currentKey:
		return lifecycle.Renewed
	}
	return lifecycle.NotRenewed
}

func (s *Server) meterRenewal(what string) {
	if s.cfg.Meter != nil {
		s.cfg.Meter.CredentialRenewal(what)
	}
}

func (s *Server) report(ctx context.Context, c call) (Response, error) {
	o := c.req.Outcome
	if o == nil {
		return Response{}, refuse(http.StatusBadRequest, CodeBadRequest, "a report needs an outcome")
	}
	switch o.State {
	case sdk.StateSuccess, sdk.StateFailed, sdk.StateUpForRetry, sdk.StateUpForReschedule, sdk.StateSkipped:
	default:
		return Response{}, refuse(http.StatusBadRequest, CodeBadRequest, "%q is not an outcome", o.State)
	}
	a := c.req.Attempt()
	res, err := s.cfg.Board.ReportOutcomeFor(ctx, a, c.claims.MintedAt, lifecycle.TerminalReport{State: o.State, Reason: o.Reason, Message: o.Message}, c.now)
	if err != nil {
		return Response{}, boardFailure("recording the report", err)
	}
	if res.RescheduleRefused != "" {
		s.refusedReschedule(ctx, a, res.RescheduleRefused)
	}
	return Response{ShouldTerminate: res.ShouldTerminate}, nil
}

// refusedReschedule logs, and hands on as a decision, a reschedule the
// board refused: the attempt was failed with the reason instead of parked.
// The caller is the attempt's own token: task code can forge this report.
func (s *Server) refusedReschedule(ctx context.Context, a sdk.Attempt, reason string) {
	detail := sdk.RescheduleFailure(reason)
	s.cfg.Logger.Warn("a reschedule report was refused: the attempt failed instead", "attempt", a.String(),
		"reason", reason)
	if s.cfg.Decisions != nil {
		s.cfg.Decisions(ctx, []sdk.Decision{{Reaper: DecisionSource, Label: reason, Attempt: a, Applied: true,
			Detail: detail, Evidence: map[string]string{"call": CallReport, "asked": sdk.StateUpForReschedule}}})
	}
}

// state reads the state of the token's own attempt; an attempt that has
// moved on reads nothing and is answered should_terminate.
func (s *Server) state(ctx context.Context, c call) (Response, error) {
	a := c.req.Attempt()
	ti, err := s.cfg.Board.TaskInstance(ctx, a.RunID, a.TaskID)
	if errors.Is(err, board.ErrNotFound) {
		return Response{ShouldTerminate: true}, nil
	}
	if err != nil {
		return Response{}, boardFailure("reading the attempt", err)
	}
	if ti.Attempt != a {
		return Response{ShouldTerminate: true}, nil
	}
	return Response{State: ti.State}, nil
}

// claim answers a warm worker (its token verified for the worker the call
// names) with the queued attempts bound to it, up to its free slots, each
// with the attempt's own token, and renews the worker's token. Its one
// write is the worker's claim record (warm_worker_claims): what the worker
// said it runs, so the kube sweep can tell a live worker that no longer
// runs a marked attempt. The record's time is the issue time of the worker
// token the claim presented, not the time the claim arrived: a worker
// claims one call at a time and takes each renewed token from an answer,
// so its claim speaks for every attempt handed to it by an answer made
// before that time, even when a request sent earlier arrives late (it
// carries an older token, and an older record never replaces a newer one).
// A claim listing more than MaxClaimRunning attempts, or a malformed one,
// is refused and records nothing. The worker reports each attempt running
// through the attempt's own call, whose guard lets exactly one execution
// start it.
// The attempt's credential counts from its bind (credential_minted_at,
// recorded at the warm dispatch; else its queue time), so the credential
// ceiling and the worker's watchdog count from the dispatch, as for a pod.
func (s *Server) claim(ctx context.Context, c call) (Response, error) {
	if c.req.RunID != "" || c.req.TaskID != "" || c.req.Outcome != nil {
		return Response{}, refuse(http.StatusBadRequest, CodeBadRequest, "a claim names a worker, not an attempt")
	}
	rec := lifecycle.WarmClaim{Worker: c.req.Worker, At: c.worker.IssuedAt}
	if c.req.Running != nil {
		running := *c.req.Running
		if len(running) > MaxClaimRunning {
			return Response{}, refuse(http.StatusBadRequest, CodeBadRequest,
				"the claim lists %d running attempts, at most %d", len(running), MaxClaimRunning)
		}
		rec.Known, rec.Running = true, make([]sdk.Attempt, len(running))
		for i, sl := range running {
			if sl.RunID == "" || sl.TaskID == "" || sl.Try < 0 || sl.Epoch < 0 {
				return Response{}, refuse(http.StatusBadRequest, CodeBadRequest,
					"running attempt #%d of the claim is malformed: %s", i, sl.Attempt())
			}
			rec.Running[i] = sl.Attempt()
		}
	}
	if err := s.cfg.Board.RecordClaim(ctx, rec); err != nil {
		return Response{}, boardFailure("recording the worker's claim", err)
	}
	slots := min(max(c.req.Slots, 1), maxClaim)
	tis, err := s.cfg.Board.BoundTo(ctx, c.req.Worker, slots)
	if err != nil {
		return Response{}, boardFailure("listing the attempts bound to the worker", err)
	}
	keys := s.cfg.Keys()
	resp := Response{}
	reply := claimReply{left: MaxClaimReply - claimReplyReserve}
	for _, ti := range tis {
		minted := ti.CredentialMintedAt
		if minted.IsZero() {
			minted = ti.QueuedAt
		}
		// The token never outlives what renewals could have given: past the
		// ceiling no renewal is made, so the last token lapses one TTL
		// after it. A credential already lapsed that way is not handed out.
		expires := c.now.Add(s.cfg.TTL)
		if s.cfg.Ceiling > 0 {
			if last := minted.Add(s.cfg.Ceiling + s.cfg.TTL); last.Before(expires) {
				expires = last
			}
		}
		if !expires.After(c.now) {
			s.cfg.Logger.Warn("a bound warm attempt's credential is past its ceiling: not handed to its worker",
				"attempt", ti.Attempt.String(), "worker", c.req.Worker, "minted_at", minted)
			continue
		}
		tok, err := keys.Sign(attempttoken.Claims{Attempt: ti.Attempt, MintedAt: minted, IssuedAt: c.now, ExpiresAt: expires})
		if err != nil {
			return Response{}, fmt.Errorf("signing the credential of %s for warm worker %s: %w", ti.Attempt, c.req.Worker, err)
		}
		cl := Claimed{RunID: ti.RunID, TaskID: ti.TaskID, Try: ti.Try, Epoch: ti.Epoch,
			Command: ti.Command, ExecutionTimeoutSeconds: int64(ti.ExecutionTimeout / time.Second),
			Token: tok, ExpiresAt: expires}
		if lifecycle.CheckCommand(ti.Command) != nil {
			s.cfg.Logger.Error("a bound warm attempt's command is over the limit: handed to its worker without it, to be refused",
				"attempt", ti.Attempt.String(), "worker", c.req.Worker, "bytes", len(ti.Command), "limit", lifecycle.CommandMax)
			cl.Command, cl.CommandWithheld = "", len(ti.Command)
		}
		if !reply.fits(cl) {
			s.cfg.Logger.Info("a claim's answer is full: the attempts left wait for the worker's next claim",
				"worker", c.req.Worker, "handed", len(resp.Attempts), "bound", len(tis))
			break
		}
		resp.Attempts = append(resp.Attempts, cl)
	}
	// The worker's own credential renews like an attempt's: only while it
	// is younger than its ceiling, counted from its first mint. Past it the
	// claim is answered (the attempts bound to the worker have their own
	// credentials) without a new worker token, so the worker stops
	// claiming once its last token lapses and its pod is replaced.
	if s.cfg.WorkerCeiling > 0 && !(c.now.Sub(c.worker.MintedAt) < s.cfg.WorkerCeiling) {
		s.cfg.Logger.Warn("a warm worker's credential is past its ceiling: its token is not renewed",
			"worker", c.req.Worker, "minted_at", c.worker.MintedAt, "ceiling", s.cfg.WorkerCeiling,
			"token_expires_at", c.worker.ExpiresAt)
		s.meterRenewal(RenewalWorkerCapped)
		resp.Capped = true
		return resp, nil
	}
	tok, wc, err := keys.RenewWorker(c.worker, c.now, s.cfg.TTL)
	if err != nil {
		return Response{}, fmt.Errorf("renewing the token of warm worker %s: %w", c.req.Worker, err)
	}
	s.meterRenewal(RenewalWorkerRenewed)
	resp.Token, resp.ExpiresAt = tok, wc.ExpiresAt
	return resp, nil
}

// claimReplyReserve is what a claim's answer holds besides its attempts
// (the worker's renewed token, the field names), with room to spare.
const claimReplyReserve = 4 << 10

// claimReply counts what a claim's answer can still take.
type claimReply struct{ left int }

// fits takes cl's room in the answer if there is room for it.
func (r *claimReply) fits(cl Claimed) bool {
	b, err := json.Marshal(cl)
	if err != nil || len(b)+1 > r.left {
		return false
	}
	r.left -= len(b) + 1
	return true
}

// Results of Meter.CredentialRenewal for a warm worker's own credential
// (an attempt's are "renewed" and "capped").
const (
	RenewalWorkerRenewed = "worker_renewed"
	RenewalWorkerCapped  = "worker_capped"
)

// exchange trades the attempt's bootstrap token (verified for the attempt
// the call names) for its working token, once: the board records the
// exchange on the queued attempt, and a second exchange of the same
// attempt is refused (bootstrap_spent) and changes nothing. The working
// token keeps the bootstrap's first mint time, so the credential ceiling
// counts from the dispatch; an attempt that has moved on is answered
// should_terminate without a token.
func (s *Server) exchange(ctx context.Context, c call) (Response, error) {
	if c.req.Outcome != nil || c.req.Worker != "" {
		return Response{}, refuse(http.StatusBadRequest, CodeBadRequest, "an exchange names its attempt and nothing else")
	}
	if err := s.proveKubeAttempt(ctx, c); err != nil {
		return Response{}, err
	}
	a := c.req.Attempt()
	res, err := s.cfg.Board.ExchangeBootstrap(ctx, a, c.claims.MintedAt, c.now)
	if err != nil {
		return Response{}, boardFailure("recording the exchange", err)
	}
	switch res {
	case lifecycle.Exchanged:
	case lifecycle.ExchangeSpent:
		return Response{}, refuse(http.StatusForbidden, CodeBootstrapSpent,
			"the bootstrap credential of %s was exchanged already: a copy of it is worth nothing", a)
	default:
		return Response{ShouldTerminate: true}, nil
	}
	tok, wc, err := s.cfg.Keys().Renew(c.claims, c.now, s.cfg.TTL)
	if err != nil {
		return Response{}, fmt.Errorf("signing the working token of %s: %w", a, err)
	}
	return Response{Token: tok, ExpiresAt: wc.ExpiresAt}, nil
}

// workerExchange trades a warm worker's bootstrap token (verified for the
// worker the call names) for its worker token, once: the board records the
// exchange, and a second exchange of the same token is refused
// (bootstrap_spent) and changes nothing.
func (s *Server) workerExchange(ctx context.Context, c call) (Response, error) {
	if c.req.RunID != "" || c.req.TaskID != "" || c.req.Outcome != nil {
		return Response{}, refuse(http.StatusBadRequest, CodeBadRequest, "a worker exchange names a worker, not an attempt")
	}
	if err := s.proveWorker(ctx, c); err != nil {
		return Response{}, err
	}
	ok, err := s.cfg.Board.ExchangeWorkerBootstrap(ctx, c.worker.Worker, c.worker.IssuedAt, c.worker.ExpiresAt, c.now)
	if err != nil {
		return Response{}, boardFailure("recording the worker exchange", err)
	}
	if !ok {
		return Response{}, refuse(http.StatusForbidden, CodeBootstrapSpent,
			"the bootstrap credential of warm worker %s was exchanged already: a copy of it is worth nothing", c.worker.Worker)
	}
	// The worker's credential was first minted with its bootstrap, at the
	// pod's creation: the lifetime ceiling counts from there.
	tok, wc, err := s.cfg.Keys().RenewWorker(attempttoken.WorkerClaims{Worker: c.worker.Worker, MintedAt: c.worker.IssuedAt}, c.now, s.cfg.TTL)
	if err != nil {
		return Response{}, fmt.Errorf("signing the token of warm worker %s: %w", c.worker.Worker, err)
	}
	return Response{Token: tok, ExpiresAt: wc.ExpiresAt}, nil
}

// maxClaim is the most attempts one claim hands out.
const maxClaim = 100

func writeError(w http.ResponseWriter, status int, body ErrorBody) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

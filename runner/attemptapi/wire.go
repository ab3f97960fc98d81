// Package attemptapi is the attempt API: the calls an agent makes to the
// control plane for its one attempt (running, heartbeat, report, state),
// served by every reaperd replica over HTTPS with JSON bodies, each call
// authorised by the attempt's own bearer token (package attempttoken).
//
// Both sides live here: Server, the http.Handler reaperd serves (its writes
// go through the board's guarded writers), and Client, the agent's side. A
// call names its attempt in its body, and the token must be for exactly that
// attempt: a token cannot act for another run, task, try or epoch. A
// refused call (no token, a malformed, forged, unknown-key or expired one, a
// wrong scope) writes nothing, is metered, and is answered with a JSON error
// whose code says why.
//
// What a runner hands an agent is a bootstrap token (attempttoken
// MintBootstrap): the agent's first call, before RUNNING, is the exchange
// (PathExchange), which the board records on the attempt and answers with
// the attempt's working token. A bootstrap token authorises the exchange
// and nothing else, and a second exchange of the same attempt is refused
// (CodeBootstrapSpent): the copy a pod spec keeps is worth nothing once
// the agent has started.
//
// An accepted heartbeat of an attempt whose credential is younger than the
// credential ceiling (auth.max_attempt_credential_lifetime, counted from the
// first mint at dispatch) is answered with a fresh token when a renewal is
// due (a quarter of the token's TTL spent, the ceiling a quarter TTL away,
// or the token signed with a retired key), and without one otherwise: the
// agent keeps the token it holds. Past the ceiling no token is given, so
// the last one runs out one attempt token TTL later and the agent can no
// longer report.
package attemptapi

import (
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// Paths of the calls (all POST, JSON in and out).
const (
	PathRunning   = "/v1/attempt/running"
	PathHeartbeat = "/v1/attempt/heartbeat"
	PathReport    = "/v1/attempt/report"
	PathState     = "/v1/attempt/state"
	// PathClaim is a warm worker's call, authorised by its worker token
	// (attempttoken.MintWorker), not by an attempt's.
	PathClaim = "/v1/worker/claim"
	// PathExchange trades an attempt's bootstrap token (what its pod spec
	// carries) for its working token, once; it is authorised by the
	// bootstrap token, which authorises nothing else.
	PathExchange = "/v1/attempt/exchange"
	// PathWorkerExchange trades a warm worker's bootstrap token (what its
	// pod spec carries) for its worker token, once.
	PathWorkerExchange = "/v1/worker/exchange"
)

// Call names, as metered.
const (
	CallRunning   = "running"
	CallHeartbeat = "heartbeat"
	CallReport    = "report"
	CallState     = "state"
	CallClaim     = "claim"
	CallExchange  = "exchange"
)

// CallWorkerExchange is PathWorkerExchange, as metered.
const CallWorkerExchange = "worker_exchange"

// Request is the body of every call.
type Request struct {
	RunID  string `json:"run_id"`
	TaskID string `json:"task_id"`
	Try    int32  `json:"try"`
	Epoch  int32  `json:"epoch"`
	// Outcome is the report's outcome (PathReport only).
	Outcome *ReportBody `json:"outcome,omitempty"`
	// Worker is the warm worker that claims (PathClaim only; the run, task,
	// try and epoch are then empty).
	Worker string `json:"worker,omitempty"`
	// Slots is how many attempts the worker can take now (PathClaim only;
	// at least 1, at most a page).
	Slots int `json:"slots,omitempty"`
	// Running lists the attempts the worker runs at the moment of the
	// claim, one per busy slot (PathClaim only; at most MaxClaimRunning).
	// Absent (a worker from before this field): unknown, never "runs
	// nothing"; an empty list says the worker runs nothing.
	Running *[]Slot `json:"running,omitempty"`
}

// Slot is one attempt a warm worker runs, as its claim reports it.
type Slot struct {
	RunID  string `json:"run_id"`
	TaskID string `json:"task_id"`
	Try    int32  `json:"try"`
	Epoch  int32  `json:"epoch"`
}

// Attempt is the attempt the slot runs.
func (s Slot) Attempt() sdk.Attempt {
	return sdk.Attempt{RunID: s.RunID, TaskID: s.TaskID, Try: s.Try, Epoch: s.Epoch}
}

// MaxClaimRunning is the most running attempts one claim may list (a
// worker has at most this many slots); a longer list is refused.
const MaxClaimRunning = maxClaim

// Attempt is the attempt the request names.
func (r Request) Attempt() sdk.Attempt {
	return sdk.Attempt{RunID: r.RunID, TaskID: r.TaskID, Try: r.Try, Epoch: r.Epoch}
}

// ReportBody is the wire form of an attempt's terminal report: the body's
// "outcome" field on PathReport.
type ReportBody struct {
	State   string `json:"state"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// Response answers an accepted call.
type Response struct {
	// ShouldTerminate: the attempt has moved on (another try or epoch, a
	// reap, a finished run): nothing was written and the agent must stop.
	ShouldTerminate bool `json:"should_terminate"`
	// Token is a renewed token (heartbeat, and a claim: the worker's own;
	// "" when not renewed), or the working token an exchange gives.
	Token string `json:"token,omitempty"`
	// ExpiresAt is the renewed token's expiry.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// Capped: the credential (the attempt's, or a claiming worker's) reached
	// its ceiling and is no longer renewed.
	Capped bool `json:"capped,omitempty"`
	// State is the task instance's state (state call only; "" when the
	// attempt has moved on).
	State string `json:"state,omitempty"`
	// Attempts are the attempts bound to the worker that it may start
	// (claim only), each with its own credential. Token and ExpiresAt are
	// then the worker's renewed token.
	Attempts []Claimed `json:"attempts,omitempty"`
}

// Claimed is one attempt handed to a warm worker: what it runs and the
// attempt's own token, with which the worker makes the attempt's calls
// (running, heartbeats, report) exactly as a dedicated agent does.
type Claimed struct {
	RunID   string `json:"run_id"`
	TaskID  string `json:"task_id"`
	Try     int32  `json:"try"`
	Epoch   int32  `json:"epoch"`
	Command string `json:"command"`
	// ExecutionTimeoutSeconds is the task's declared timeout (0: none).
	ExecutionTimeoutSeconds int64 `json:"execution_timeout_seconds,omitempty"`
	// Token is the attempt's token; its credential counts from the bind
	// (the warm dispatch), not from the claim.
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
	// CommandWithheld is the size in bytes of a command the server did not
	// hand over (Command is then empty): over lifecycle.CommandMax, from a
	// row written around the board's check. The worker refuses the
	// attempt (fails it) instead of running something else.
	CommandWithheld int `json:"command_withheld,omitempty"`
}

// MaxClaimReply bounds a claim's answer, in bytes: the server hands over
// only the attempts that fit (the rest wait for the next claim), and the
// worker reads no more. One attempt always fits: a command of
// lifecycle.CommandMax bytes, each escaped to six in JSON, and its token
// are far below it.
const MaxClaimReply = 1 << 20

// Attempt is the attempt claimed.
func (c Claimed) Attempt() sdk.Attempt {
	return sdk.Attempt{RunID: c.RunID, TaskID: c.TaskID, Try: c.Try, Epoch: c.Epoch}
}

// Error codes of a refused call (ErrorBody.Code).
const (
	CodeNoToken     = "no_token"       // 401: no bearer token
	CodeMalformed   = "malformed"      // 401
	CodeUnknownKey  = "unknown_key"    // 401
	CodeForged      = "forged"         // 401
	CodeExpired     = "expired"        // 401
	CodeWrongScope  = "wrong_scope"    // 403: a valid token for another attempt (or worker)
	CodeWrongKind   = "wrong_kind"     // 403: a token of another kind than the call takes (worker, bootstrap, attempt)
	CodeBadRequest  = "bad_request"    // 400
	CodeUnavailable = "unavailable"    // 503: the board could not be reached; retry
	CodeInternal    = "internal"       // 500
	CodeMethod      = "bad_method"     // 405
	CodeNotFound    = "unknown_call"   // 404
	codeTooLarge    = "body_too_large" // 400
)

// CodeBootstrapSpent (403) refuses an exchange of a bootstrap credential
// that was exchanged already (a copy replayed); nothing was written.
const CodeBootstrapSpent = "bootstrap_spent"

// ErrorBody is the body of a refused or failed call.
type ErrorBody struct {
	Code    string `json:"error"`
	Message string `json:"message"`
}

// maxBody bounds a request body (an outcome's message included).
const maxBody = 64 << 10

package attempttoken

import (
	"fmt"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// The environment a runner gives an attempt's agent: the token, the attempt
// API's base URL and the PEM certificate(s) the agent trusts for it. Never
// flags: a command line is visible to every user of the machine. The agent
// removes all three from its task's environment.
const (
	EnvToken = "REAPER_ATTEMPT_TOKEN"
	EnvAPI   = "REAPER_ATTEMPT_API"
	EnvCA    = "REAPER_ATTEMPT_API_CA"
)

// Credential is what a runner hands one attempt's agent.
type Credential struct {
	// Token is the attempt's bootstrap token (see MintBootstrap): the agent
	// exchanges it for the working token on its first call.
	Token  string
	Claims Claims
	// Env is the agent's environment entries (EnvToken, EnvAPI, EnvCA).
	Env []string
}

// Issuer mints credentials at dispatch. Runners (Lite, kube) share it.
type Issuer struct {
	// Keys signs. Required.
	Keys func() *Keyring
	// TTL is the attempt token TTL (ladder.AttemptTokenTTL). Required.
	TTL time.Duration
	// API is the attempt API's base URL, e.g. https://127.0.0.1:9465.
	API string
	// CA is the PEM the agent trusts for API ("" when the system's roots do).
	CA string
}

// Mint mints the credential of a at now: its bootstrap token, which
// expires one TTL after now unless exchanged before.
func (is Issuer) Mint(a sdk.Attempt, now time.Time) (Credential, error) {
	if is.Keys == nil || is.TTL <= 0 || is.API == "" {
		return Credential{}, fmt.Errorf("minting the credential of %s: the issuer has no keys, TTL or API address", a)
	}
	tok, c, err := is.Keys().MintBootstrap(a, now, is.TTL)
	if err != nil {
		return Credential{}, fmt.Errorf("minting the credential of %s: %w", a, err)
	}
	env := []string{EnvToken + "=" + tok, EnvAPI + "=" + is.API}
	if is.CA != "" {
		env = append(env, EnvCA+"="+is.CA)
	}
	return Credential{Token: tok, Claims: c, Env: env}, nil
}

// WorkerCredential is what a runner hands a warm worker at its pod's
// creation: the worker token and the environment entries (EnvWorkerToken,
// EnvAPI, EnvCA).
type WorkerCredential struct {
	Token  string
	Claims WorkerClaims
	Env    []string
}

// MintWorker mints the worker credential of worker at now, with the
// attempt token TTL: the worker renews it with every claim. (A worker pod
// is created with a bootstrap instead: MintWorkerBootstrap.)
func (is Issuer) MintWorker(worker string, now time.Time) (WorkerCredential, error) {
	return is.mintWorker(worker, now, func(kr *Keyring) (string, WorkerClaims, error) {
		return kr.MintWorker(worker, now, is.TTL)
	})
}

// mintWorker checks the issuer, signs worker's token with sign and puts it
// in the worker's environment entries (EnvWorkerToken, EnvAPI, EnvCA).
func (is Issuer) mintWorker(worker string, now time.Time, sign func(*Keyring) (string, WorkerClaims, error)) (WorkerCredential, error) {
	if is.Keys == nil || is.TTL <= 0 || is.API == "" {
		return WorkerCredential{}, fmt.Errorf("minting the credential of warm worker %s: the issuer has no keys, TTL or API address", worker)
	}
	tok, c, err := sign(is.Keys())
	if err != nil {
		return WorkerCredential{}, fmt.Errorf("minting the credential of warm worker %s: %w", worker, err)
	}
	env := []string{EnvWorkerToken + "=" + tok, EnvAPI + "=" + is.API}
	if is.CA != "" {
		env = append(env, EnvCA+"="+is.CA)
	}
	return WorkerCredential{Token: tok, Claims: c, Env: env}, nil
}

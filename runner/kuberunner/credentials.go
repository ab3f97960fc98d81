package kuberunner

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/sdk"
)

// Minter mints an attempt's credential: attempttoken.Issuer, whose API
// address is the attempt API as the pods reach it.
type Minter interface {
	Mint(a sdk.Attempt, now time.Time) (attempttoken.Credential, error)
}

// MintRecorder records when an attempt's credential was minted: the
// lifecycle writer's RecordMint.
type MintRecorder interface {
	RecordMint(ctx context.Context, a sdk.Attempt, mintedAt time.Time) (bool, error)
}

// MintedCredentials is the Credentials of a runner whose agents report to
// the attempt API (-reporter api), as the Lite runner's do: each dispatch
// mints the attempt's credential, records its mint time on the attempt
// (what the credential ceiling and start_expired measure) and hands the
// pod the token, the API's address and the CA to trust as environment.
type MintedCredentials struct {
	Minter Minter
	// Recorder records the mint; nil: the runner's own board writer, whose
	// writes are fenced by the cycle's leadership term (see
	// Runner.RunOnceFenced).
	Recorder MintRecorder
}

// fencedBy returns c with the mint recorded through w when c is a
// MintedCredentials without a recorder of its own; c otherwise.
func fencedBy(c Credentials, w MintRecorder) Credentials {
	if m, ok := c.(MintedCredentials); ok && m.Recorder == nil {
		m.Recorder = w
		return m
	}
	return c
}

// Env mints a's credential at now and records it.
func (m MintedCredentials) Env(ctx context.Context, a sdk.Attempt, now time.Time) ([]corev1.EnvVar, error) {
	if m.Recorder == nil {
		return nil, fmt.Errorf("minting the credential of %s: no recorder for its mint time", a)
	}
	cred, err := m.Minter.Mint(a, now)
	if err != nil {
		return nil, err
	}
	if _, err := m.Recorder.RecordMint(ctx, a, cred.Claims.MintedAt); err != nil {
		return nil, fmt.Errorf("recording the credential of %s: %w", a, err)
	}
	return envVars(cred.Env), nil
}

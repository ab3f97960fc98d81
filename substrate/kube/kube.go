// Package kube is the Kubernetes substrate: task pods watched through an
// informer, pinned teardown, and the reconcile sweep.
//
// STUB: this package serves the protocol and declares its configuration, but
// talks to no API server yet. Liveness answers "unknown" for every attempt
// (a reaper that asks defers); Synced is always false, so a leader's
// settling gate would hold until its valve opens at twice the grace, after
// which a reaper judging on heartbeat silence alone (agentlost) would fail
// attempts it cannot see; Sweep does nothing; Teardown and WarmWorkers
// return an error; StopOrphan stops nothing. That is why reaperd refuses
// edition = "kube" (host/config/unavailable.go) until the kube substrate
// issue fills this package in over client-go.
package kube

import (
	"context"
	"errors"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// Name is the label the substrate is configured under.
const Name = "kube"

// Substrate is the Kubernetes substrate.
type Substrate struct {
	logger hclog.Logger
}

var _ sdk.Substrate = (*Substrate)(nil)

// New returns the substrate.
func New(logger hclog.Logger) *Substrate { return &Substrate{logger: logger} }

// Info describes the plugin.
func (s *Substrate) Info(context.Context) (sdk.Info, error) {
	return sdk.Info{Name: Name, Kind: sdk.KindSubstrate, Version: sdk.BuildVersion,
		Editions: []string{ladder.EditionKube}, Description: "task pods on Kubernetes (stub)"}, nil
}

// ConfigSchema declares the block's attributes.
func (s *Substrate) ConfigSchema(context.Context) (sdk.Schema, error) {
	return sdk.Schema{Attributes: []sdk.Attribute{
		{Name: "namespace", Type: sdk.TypeString, Default: "default", Description: "namespace of the task pods"},
		{Name: "kubeconfig", Type: sdk.TypeString, Default: "", Description: "path to a kubeconfig; empty: in-cluster"},
	}}, nil
}

// Configure accepts the decoded block.
func (s *Substrate) Configure(context.Context, sdk.ConfigureRequest) error { return nil }

// Sweep does nothing yet.
func (s *Substrate) Sweep(context.Context, sdk.SweepRequest, sdk.Board) (sdk.SweepResult, error) {
	return sdk.SweepResult{}, nil
}

// Synced is false: the stub has no informer.
func (s *Substrate) Synced(context.Context) (bool, error) { return false, nil }

// Liveness answers unknown for every attempt, so reapers defer.
func (s *Substrate) Liveness(_ context.Context, req sdk.LivenessRequest) ([]sdk.AttemptLiveness, error) {
	out := make([]sdk.AttemptLiveness, len(req.Attempts))
	for i, a := range req.Attempts {
		out[i] = sdk.AttemptLiveness{Attempt: a, State: sdk.Unknown, Agent: sdk.Unknown, Group: sdk.Unknown,
			Detail: "the kube substrate is a stub in this release: liveness is unknown, so reapers defer"}
	}
	return out, nil
}

var errNotImplemented = errors.New("kube substrate: teardown is not available in this build")

// Teardown is not available yet.
func (s *Substrate) Teardown(context.Context, sdk.TeardownRequest) ([]sdk.TeardownOutcome, error) {
	return nil, errNotImplemented
}

// StopOrphan never stops anything on kube (pods are torn down instead).
func (s *Substrate) StopOrphan(context.Context, sdk.StopRequest) (sdk.StopResult, error) {
	return sdk.StopResult{Detail: "kube has no process groups"}, nil
}

// WarmWorkers lists no workers yet.
func (s *Substrate) WarmWorkers(context.Context) ([]sdk.WarmWorker, error) {
	return nil, errNotImplemented
}

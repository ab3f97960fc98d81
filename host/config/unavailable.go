package config

import (
	"github.com/hashicorp/hcl/v2"
)

// refuseUnavailable refuses what this build cannot run yet: the kubernetes
// leader, which the daemon does not wire to an elector (host/leader/kubelease
// exists, but nothing builds it from a leader "kubernetes" block). The kube
// edition itself is available: run it with leader "postgres".
//
// This is the only place that refuses it: the work that wires the Lease
// into the daemon lifts the refusal by deleting this file and its call in
// Check.
func (cfg *Config) refuseUnavailable() hcl.Diagnostics {
	var diags hcl.Diagnostics
	if cfg.Leader.Kind == LeaderKubernetes {
		r := cfg.leaderRange
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
			Summary: `Leader "kubernetes" is not available`,
			Detail:  `The Kubernetes lease is not available in this build yet; use leader "postgres".`})
	}
	return diags
}

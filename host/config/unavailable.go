package config

import (
	"github.com/hashicorp/hcl/v2"

	"github.com/dexaflow/reaper/sdk/ladder"
)

// refuseUnavailable refuses what this build cannot run safely yet: the kube
// edition. The kube substrate is a stub that never reports its cache
// synced, so the settling valve would open after twice the grace and
// agentlost would then fail kube attempts on heartbeat silence alone, while
// every teardown errors.
//
// This is the only place that refuses it: the Kubernetes work lifts the
// refusal by deleting this file and its call in Check.
func (cfg *Config) refuseUnavailable() hcl.Diagnostics {
	var diags hcl.Diagnostics
	if cfg.Edition == ladder.EditionKube {
		r := cfg.editionRange
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
			Summary: `Edition "kube" is not available`,
			Detail:  `The Kubernetes edition is not available in this build yet; use edition = "lite".`})
	}
	return diags
}

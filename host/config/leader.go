package config

import (
	"fmt"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/dexaflow/reaper/host/leader"
)

// Leader elector kinds.
const (
	LeaderPostgres   = "postgres"
	LeaderKubernetes = "kubernetes"
)

// LeaseDefault is the leader block's lease.
const LeaseDefault = 15 * time.Second

// Leader is the leader block.
type Leader struct {
	Kind  string        // LeaderPostgres or LeaderKubernetes
	Lease time.Duration // lease duration
	// Renew is how often the leader renews, and a follower tries to take
	// over; 0: the elector's default (a third of the lease). It must leave
	// room inside the part of the lease a leader trusts (four fifths).
	Renew time.Duration
	// Namespace and Name of the Kubernetes Lease (kubernetes only).
	Namespace string
	Name      string
	// Kubeconfig reaches the API server (kubernetes only): a file,
	// relative to the configuration's; empty: the in-cluster config of
	// the pod's service account.
	Kubeconfig string
}

// leaderBlock is the leader block as the file writes it; its label is the
// elector's kind.
type leaderBlock struct {
	Lease      time.Duration `reaper:"lease"` // 0: LeaseDefault
	Renew      time.Duration `reaper:"renew"`
	Namespace  string        `reaper:"namespace"`
	Name       string        `reaper:"name"`
	Kubeconfig string        `reaper:"kubeconfig"`
}

func (cfg *Config) decodeLeader(b *hcl.Block) hcl.Diagnostics {
	kind := b.Labels[0]
	cfg.Leader.Kind = kind
	var lb leaderBlock
	_, diags := decodeInto(b.Body, &lb)
	if lb.Lease != 0 {
		cfg.Leader.Lease = lb.Lease
	}
	cfg.Leader.Renew = lb.Renew
	cfg.Leader.Namespace = lb.Namespace
	cfg.Leader.Name = lb.Name
	cfg.Leader.Kubeconfig = cfg.relative(lb.Kubeconfig)
	r := b.LabelRanges[0]
	switch kind {
	case LeaderPostgres:
		if cfg.Leader.Namespace != "" || cfg.Leader.Name != "" || cfg.Leader.Kubeconfig != "" {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
				Summary: "Unexpected attributes for the postgres leader",
				Detail:  `namespace, name and kubeconfig belong to leader "kubernetes".`})
		}
	case LeaderKubernetes:
		if cfg.Leader.Namespace == "" || cfg.Leader.Name == "" {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
				Summary: "Missing attributes for the kubernetes leader",
				Detail:  `leader "kubernetes" needs namespace and name.`})
		}
	default:
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
			Summary: "Unknown leader kind",
			Detail:  fmt.Sprintf(`leader must be "postgres" or "kubernetes", not %q.`, kind)})
	}
	if cfg.Leader.Lease <= 0 {
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
			Summary: `Invalid value for "lease"`, Detail: "the lease must be positive."})
	} else if trusted := cfg.Leader.Lease - cfg.Leader.Lease/leader.MarginShareDefault; cfg.Leader.Renew < 0 || cfg.Leader.Renew >= trusted {
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
			Summary: `Invalid value for "renew"`,
			Detail: fmt.Sprintf("renew %s must be positive and shorter than the part of the lease a leader trusts (%s of %s), "+
				"or the leader would stop trusting its lease between two renewals.", cfg.Leader.Renew, trusted, cfg.Leader.Lease)})
	}
	return diags
}

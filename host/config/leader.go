package config

import (
	"fmt"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/sdk"
)

// Leader elector kinds.
const (
	LeaderPostgres   = "postgres"
	LeaderKubernetes = "kubernetes"
)

// DefaultLease is the leader block's lease.
const DefaultLease = 15 * time.Second

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

var leaderSchema = sdk.Schema{Attributes: []sdk.Attribute{
	{Name: "lease", Type: sdk.TypeDuration},
	{Name: "renew", Type: sdk.TypeDuration},
	{Name: "namespace", Type: sdk.TypeString},
	{Name: "name", Type: sdk.TypeString},
	{Name: "kubeconfig", Type: sdk.TypeString},
}}

func (cfg *Config) decodeLeader(b *hcl.Block) hcl.Diagnostics {
	kind := b.Labels[0]
	cfg.Leader.Kind = kind
	v, _, diags := DecodeBlock(b.Body, leaderSchema)
	if lease, _ := v.Duration("lease"); lease != 0 {
		cfg.Leader.Lease = lease
	}
	cfg.Leader.Renew, _ = v.Duration("renew")
	cfg.Leader.Namespace = v.String("namespace")
	cfg.Leader.Name = v.String("name")
	cfg.Leader.Kubeconfig = cfg.relative(v.String("kubeconfig"))
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
	} else if trusted := cfg.Leader.Lease - cfg.Leader.Lease/leader.DefaultMarginShare; cfg.Leader.Renew < 0 || cfg.Leader.Renew >= trusted {
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
			Summary: `Invalid value for "renew"`,
			Detail: fmt.Sprintf("renew %s must be positive and shorter than the part of the lease a leader trusts (%s of %s), "+
				"or the leader would stop trusting its lease between two renewals.", cfg.Leader.Renew, trusted, cfg.Leader.Lease)})
	}
	return diags
}

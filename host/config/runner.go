package config

import (
	"fmt"
	"path/filepath"
	"regexp"

	"github.com/hashicorp/hcl/v2"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/kuberunner/kubesettings"
	"github.com/dexaflow/reaper/runner/literunner"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// PodRunAsDefault is runner.kube.run_as_user and run_as_group: the
// non-root uid and gid of the runner's pods.
const PodRunAsDefault = kubesettings.RunAsDefault

// Runner is the runner block: the runner's own settings
// (literunner.Settings, with their defaults and rules; the kube runner
// takes its tick, caps, pools and recovery budget too), and its kube block.
type Runner struct {
	literunner.Settings
	// Kube is the runner's kube block: required on edition "kube", refused
	// on "lite". nil when absent.
	Kube *KubeRunner
}

// PoolSlotsMax bounds a pool's slots (literunner.PoolSlotsMax).
const PoolSlotsMax = literunner.PoolSlotsMax

// KubeNamespaceDefault is the task pods' namespace when neither the runner's
// kube block nor the kube substrate names one (the substrate's own default).
const KubeNamespaceDefault = kubesettings.NamespaceDefault

// KubeRunner is the runner's kube block: the task pods' template, in the
// kube runner's own terms (kubesettings.Settings, which kuberunner.Settings
// is), decoded here and checked by its own rules. Its namespace defaults
// to the kube substrate's, else "default", and its kubeconfig is the kube
// substrate's.
type KubeRunner struct {
	kubesettings.Settings

	graceRange *hcl.Range // where termination_grace is set, if it is
}

// WarmPool is the warm_pool block of the runner's kube block.
type WarmPool = kubesettings.WarmPool

func (cfg *Config) decodeRunner(b *hcl.Block) hcl.Diagnostics {
	inner, rest, diags := b.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{
		{Type: "kube"}, {Type: "pool", LabelNames: []string{"name"}}}})
	rb := literunner.DefaultBlock()
	ranges, d := decodeInto(rest, &rb)
	diags = append(diags, d...)
	if rb.RunAs != "" {
		refuse := func(detail string) { diags = append(diags, invalid(ranges, "run_as", detail)) }
		if cfg.Edition == ladder.EditionKube {
			refuse("run_as is Lite's: on kube, the pods' user is runner.kube.run_as_user.")
		} else if err := literunner.CheckRunAs(rb.RunAs); err != nil {
			refuse(err.Error() + ".")
		}
	}
	s, problems := rb.Settings()
	diags = append(diags, refusals(b.DefRange, ranges, problems)...)
	r := &Runner{Settings: s}
	if r.Agent == "" && cfg.PluginDir != "" {
		r.Agent = filepath.Join(cfg.PluginDir, "reaper-agent")
	} else {
		r.Agent = cfg.relative(r.Agent)
	}
	r.Pools, r.Recovery.Pools, d = decodePools(inner.Blocks, r.Recovery.Default)
	diags = append(diags, d...)
	kubes := inner.Blocks.OfType("kube")
	kb, dups := oneBlock(kubes, "kube", "The runner")
	if kb != nil {
		k, d := decodeKubeRunner(kb)
		diags = append(diags, d...)
		r.Kube = k
	}
	diags = append(diags, dups...)
	switch {
	case cfg.Edition == ladder.EditionKube && r.Kube == nil:
		dr := b.DefRange
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &dr,
			Summary: "Runner needs a kube block on edition \"kube\"",
			Detail: "On edition \"kube\" the runner dispatches pods: add a kube { image = ... } block " +
				"(the runner's other attributes are those of the lite edition's runner, and its tick and caps)."})
	case cfg.Edition != ladder.EditionKube && r.Kube != nil:
		dr := kubes[0].DefRange
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &dr,
			Summary: "Runner kube block needs the kube edition",
			Detail:  "The kube block configures task pods; edition \"lite\" dispatches local processes."})
	}
	cfg.Runner = r
	return diags
}

// kubeRunnerFromSubstrate gives the runner's kube block what it takes from
// the kube substrate's block: the cluster (its kubeconfig), and the
// namespace its pods go to when the kube block names none, so that they go
// where the substrate looks for them.
func (cfg *Config) kubeRunnerFromSubstrate() {
	if cfg.Runner == nil || cfg.Runner.Kube == nil {
		return
	}
	k := cfg.Runner.Kube
	if cfg.Substrate.Body != nil {
		k.Kubeconfig = peekString(cfg.Substrate.Body, "kubeconfig")
		if k.Namespace == "" {
			k.Namespace = peekString(cfg.Substrate.Body, "namespace")
		}
	}
	if k.Namespace == "" {
		k.Namespace = KubeNamespaceDefault
	}
}

// decodeKubeRunner decodes the runner's kube block, and holds it to its
// rules (kubesettings.Block.Settings).
func decodeKubeRunner(b *hcl.Block) (*KubeRunner, hcl.Diagnostics) {
	inner, rest, diags := b.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "warm_pool"}}})
	kb := kubesettings.DefaultBlock()
	ranges, d := decodeInto(rest, &kb)
	diags = append(diags, d...)
	s, problems := kb.Settings()
	k := &KubeRunner{Settings: s}
	if r, ok := ranges["termination_grace"]; ok {
		k.graceRange = &r
	}
	diags = append(diags, refusals(b.DefRange, ranges, problems)...)
	wb, dups := oneBlock(inner.Blocks, "warm_pool", "The kube block")
	if wb != nil {
		var pb kubesettings.WarmPoolBlock
		ranges, d := decodeInto(wb.Body, &pb)
		diags = append(diags, d...)
		_, sizeGiven := ranges["size"] // absent: DecodeBlock said it is required
		wp, problems := pb.WarmPool(sizeGiven)
		diags = append(diags, refusals(wb.DefRange, ranges, problems)...)
		k.WarmPool = wp
	}
	diags = append(diags, dups...)
	return k, diags
}

// oneBlock is the first of blocks (nil when none), and the refusals of
// each further one as a duplicate of the block type parent takes once.
func oneBlock(blocks hcl.Blocks, typ, parent string) (*hcl.Block, hcl.Diagnostics) {
	if len(blocks) == 0 {
		return nil, nil
	}
	var dups hcl.Diagnostics
	for _, b := range blocks[1:] {
		dr := b.DefRange
		dups = append(dups, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &dr,
			Summary: "Duplicate " + typ + " block", Detail: parent + " takes one " + typ + " block."})
	}
	return blocks[0], dups
}

// decodePools decodes the runner's pool blocks: each names a pool once
// and gives its slots, a whole number from 1, and may set its own recovery
// budget (def where it does not).
func decodePools(blocks hcl.Blocks, def lifecycle.RecoveryLimit) (map[string]int, map[string]lifecycle.RecoveryLimit, hcl.Diagnostics) {
	var (
		diags    hcl.Diagnostics
		pools    map[string]int
		recovery map[string]lifecycle.RecoveryLimit
		where    = map[string]hcl.Range{}
	)
	for _, b := range blocks {
		if b.Type != "pool" {
			continue
		}
		name := b.Labels[0]
		if !poolName.MatchString(name) {
			r := b.LabelRanges[0]
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r, Summary: "Invalid pool name",
				Detail: fmt.Sprintf("Pool %q: a pool's name is a letter, then letters, digits, '_', '-' or '.', "+
					"at most 64 bytes.", name)})
			continue
		}
		if prev, dup := where[name]; dup {
			r := b.DefRange
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r, Summary: "Pool declared twice",
				Detail: fmt.Sprintf("Pool %q is also declared at %s.", name, prev)})
			continue
		}
		where[name] = b.DefRange
		pb := literunner.DefaultPoolBlock(def)
		ranges, d := decodeInto(b.Body, &pb)
		diags = append(diags, d...)
		if d.HasErrors() {
			continue
		}
		slots, l, ok, problems := pb.Pool(name)
		diags = append(diags, refusals(b.DefRange, ranges, problems)...)
		if !ok {
			continue
		}
		if pools == nil {
			pools, recovery = map[string]int{}, map[string]lifecycle.RecoveryLimit{}
		}
		pools[name] = slots
		if l != def {
			recovery[name] = l
		}
	}
	return pools, recovery, diags
}

// poolName is what a pool may be called: it names a metric series.
var poolName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.-]{0,63}$`)

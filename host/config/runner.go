package config

import (
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/internal/runas"
	"github.com/dexaflow/reaper/runner/kuberunner/kubesettings"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// PodRunAsDefault is runner.kube.run_as_user and run_as_group: the
// non-root uid and gid of the runner's pods.
const PodRunAsDefault = kubesettings.RunAsDefault

// Runner is the runner block.
type Runner struct {
	Interval      time.Duration // the runner's tick; 0: its default (1s)
	MaxParallel   int           // bound on queued plus running Lite attempts; 0: none
	MaxActiveRuns int           // the run start cap: most runs running at once; 0: none
	Agent         string        // the reaper-agent binary; default <plugin_dir>/reaper-agent
	LogDir        string        // where task output and agent logs go; default: the record directory
	// RunAs is run_as (Lite only): the user every task runs as, another
	// than reaperd's, which must be able to switch to it (root, or
	// CAP_SETUID and CAP_SETGID); "": reaperd's own user.
	RunAs string
	// Kube is the runner's kube block: required on edition "kube", refused
	// on "lite". nil when absent.
	Kube *KubeRunner
	// Pools are the pool blocks' slots, by pool name; nil when none.
	Pools map[string]int
	// Recovery is the recovery budget: recovery_rate and recovery_burst of
	// the runner block for every pool, and of the pool blocks that set
	// their own.
	Recovery lifecycle.RecoveryBudget
}

// poolBlock is a pool block of the runner block. A recovery_rate of -1
// (unset) takes the runner block's.
type poolBlock struct {
	Slots         float64 `reaper:"slots,required"`
	RecoveryRate  float64 `reaper:"recovery_rate"`
	RecoveryBurst float64 `reaper:"recovery_burst"`
}

// PoolSlotsMax bounds a pool's slots.
const PoolSlotsMax = 1 << 30

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

// runnerBlock is the runner block (its kube block apart). Numbers are read
// as numbers, not ints, so that the block's own checks word the refusal of
// -1 or 1.5.
type runnerBlock struct {
	Interval      time.Duration `reaper:"interval"`
	RecoveryRate  float64       `reaper:"recovery_rate"`
	RecoveryBurst float64       `reaper:"recovery_burst"`
	MaxParallel   float64       `reaper:"max_parallel"`
	MaxActiveRuns float64       `reaper:"max_active_runs"`
	Agent         string        `reaper:"agent"`
	LogDir        string        `reaper:"log_dir"`
	RunAs         string        `reaper:"run_as"`
}

func (cfg *Config) decodeRunner(b *hcl.Block) hcl.Diagnostics {
	inner, rest, diags := b.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{
		{Type: "kube"}, {Type: "pool", LabelNames: []string{"name"}}}})
	rb := runnerBlock{RecoveryRate: lifecycle.RecoveryRateDefault, RecoveryBurst: lifecycle.RecoveryBurstDefault}
	ranges, d := decodeInto(rest, &rb)
	diags = append(diags, d...)
	r := &Runner{Agent: rb.Agent, LogDir: rb.LogDir, RunAs: rb.RunAs}
	if r.RunAs != "" {
		refuse := func(detail string) { diags = append(diags, invalid(ranges, "run_as", detail)) }
		if cfg.Edition == ladder.EditionKube {
			refuse("run_as is Lite's: on kube, the pods' user is runner.kube.run_as_user.")
		} else if _, err := runas.Lookup(r.RunAs); err != nil {
			refuse(err.Error() + ".")
		} else if err := runas.CheckCanSwitch(); err != nil {
			refuse(err.Error() + ".")
		}
	}
	r.Interval = rb.Interval
	if n := rb.MaxParallel; n < 0 || n != float64(int(n)) {
		diags = append(diags, invalid(ranges, "max_parallel", "max_parallel must be a whole number, 0 or more."))
	}
	r.MaxParallel = int(rb.MaxParallel)
	if n := rb.MaxActiveRuns; n < 0 || n != float64(int(n)) {
		diags = append(diags, invalid(ranges, "max_active_runs", "max_active_runs must be a whole number, 0 (no cap) or more."))
	}
	r.MaxActiveRuns = int(rb.MaxActiveRuns)
	if r.Agent == "" && cfg.PluginDir != "" {
		r.Agent = filepath.Join(cfg.PluginDir, "reaper-agent")
	} else {
		r.Agent = cfg.relative(r.Agent)
	}
	r.Recovery.Default, d = recoveryLimit(ranges, rb.RecoveryRate, rb.RecoveryBurst, "")
	diags = append(diags, d...)
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

// recoveryLimit checks a recovery_rate (0: unbounded) and recovery_burst
// (0: a second of the rate) of the block of ranges (pool: "" for the
// runner block).
func recoveryLimit(ranges map[string]hcl.Range, rate, burst float64, pool string) (lifecycle.RecoveryLimit, hcl.Diagnostics) {
	var diags hcl.Diagnostics
	of := ""
	if pool != "" {
		of = fmt.Sprintf(" of pool %q", pool)
	}
	if rate < 0 || math.IsInf(rate, 0) || math.IsNaN(rate) {
		diags = append(diags, invalid(ranges, "recovery_rate",
			"recovery_rate"+of+" is recovery dispatches a second: 0 (unbounded) or more."))
	}
	if burst < 0 || burst > PoolSlotsMax || burst != float64(int(burst)) {
		diags = append(diags, invalid(ranges, "recovery_burst",
			"recovery_burst"+of+fmt.Sprintf(" must be a whole number from 0 (one second of the rate) to %d.", PoolSlotsMax)))
	}
	return lifecycle.RecoveryLimit{Rate: rate, Burst: int(burst)}, diags
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
		pb := poolBlock{RecoveryRate: def.Rate, RecoveryBurst: float64(def.Burst)}
		ranges, d := decodeInto(b.Body, &pb)
		diags = append(diags, d...)
		if d.HasErrors() {
			continue
		}
		if n := pb.Slots; n < 1 || n > PoolSlotsMax || n != float64(int(n)) {
			diags = append(diags, invalid(ranges, "slots", fmt.Sprintf("slots of pool %q must be a whole number from 1 to %d.",
				name, PoolSlotsMax)))
			continue
		}
		l, d := recoveryLimit(ranges, pb.RecoveryRate, pb.RecoveryBurst, name)
		diags = append(diags, d...)
		if pools == nil {
			pools, recovery = map[string]int{}, map[string]lifecycle.RecoveryLimit{}
		}
		pools[name] = int(pb.Slots)
		if l != def {
			recovery[name] = l
		}
	}
	return pools, recovery, diags
}

// poolName is what a pool may be called: it names a metric series.
var poolName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.-]{0,63}$`)

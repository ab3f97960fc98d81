package config

import (
	"fmt"
	"math"
	"net/url"
	"path/filepath"
	"regexp"
	"time"

	"github.com/hashicorp/hcl/v2"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/dexaflow/reaper/internal/runas"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// DefaultPodRunAs is runner.kube.run_as_user and run_as_group: the
// non-root uid and gid of the runner's pods.
const DefaultPodRunAs = 65532

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
}

// DefaultKubeNamespace is the task pods' namespace when neither the runner's
// kube block nor the kube substrate names one (the substrate's own default).
const DefaultKubeNamespace = "default"

// KubeRunner is the runner's kube block: the task pods' template.
type KubeRunner struct {
	Namespace        string        // the task pods' namespace; default: the kube substrate's, else "default"
	Kubeconfig       string        // the kube substrate's kubeconfig ("": the in-cluster service account)
	Image            string        // the task image (holds the agent); required
	Agent            string        // the agent binary inside the image; default "reaper-agent"
	ServiceAccount   string        // "" leaves the namespace's default
	PullPolicy       string        // "", "Always", "IfNotPresent" or "Never"
	TerminationGrace time.Duration // terminationGracePeriodSeconds; 0: ladder.task_termination_grace
	// AttemptAPI is the attempt API's base URL as the task pods reach it
	// (https://host:port, e.g. a Service name the certificate covers); "":
	// attempt_api.advertise, else the API's bound address.
	AttemptAPI string
	// RunAsUser and RunAsGroup are the uid and gid the runner's pods run
	// as (task pods and warm workers): non-root, default DefaultPodRunAs.
	RunAsUser, RunAsGroup int64
	// ReadOnlyRoot: the pods' root filesystem is read-only (default true;
	// false for an image whose tasks write outside /tmp).
	ReadOnlyRoot bool
	// Requests and Limits of the task container, by resource name (cpu,
	// memory, ephemeral-storage), as Kubernetes quantities ("500m", "1Gi").
	Requests, Limits map[string]string
	// WarmPool is the kube block's warm_pool block: long-lived worker pods
	// for the tasks of executor warm. nil when absent (no pool).
	WarmPool *WarmPool

	graceRange *hcl.Range // where termination_grace is set, if it is
}

// WarmPool is the warm_pool block of the runner's kube block.
type WarmPool struct {
	Name   string        // the pool's name, the value of leoflow.io/warm-pool; default "default"
	Size   int           // how many worker pods are kept; required, at least 1
	Slots  int           // attempts a worker runs at once; 0: its default (1)
	Poll   time.Duration // how often a worker claims; 0: its default (1s)
	Refill time.Duration // how often the pool is refilled; 0: its default (5s)
}

var runnerSchema = sdk.Schema{Attributes: []sdk.Attribute{
	{Name: "interval", Type: sdk.TypeDuration},
	{Name: "max_parallel", Type: sdk.TypeNumber, Default: float64(0)},
	{Name: "max_active_runs", Type: sdk.TypeNumber, Default: float64(0)},
	{Name: "agent", Type: sdk.TypeString},
	{Name: "log_dir", Type: sdk.TypeString},
	{Name: "run_as", Type: sdk.TypeString},
}}

var kubeRunnerSchema = sdk.Schema{Attributes: []sdk.Attribute{
	{Name: "namespace", Type: sdk.TypeString},
	{Name: "image", Type: sdk.TypeString, Required: true},
	{Name: "agent", Type: sdk.TypeString},
	{Name: "service_account", Type: sdk.TypeString},
	{Name: "image_pull_policy", Type: sdk.TypeString},
	{Name: "termination_grace", Type: sdk.TypeDuration},
	{Name: "cpu_request", Type: sdk.TypeString},
	{Name: "memory_request", Type: sdk.TypeString},
	{Name: "cpu_limit", Type: sdk.TypeString},
	{Name: "memory_limit", Type: sdk.TypeString},
	{Name: "attempt_api", Type: sdk.TypeString},
	{Name: "run_as_user", Type: sdk.TypeNumber, Default: float64(DefaultPodRunAs)},
	{Name: "run_as_group", Type: sdk.TypeNumber, Default: float64(DefaultPodRunAs)},
	{Name: "read_only_root_filesystem", Type: sdk.TypeBool, Default: true},
}}

var warmPoolSchema = sdk.Schema{Attributes: []sdk.Attribute{
	{Name: "name", Type: sdk.TypeString},
	{Name: "size", Type: sdk.TypeNumber, Required: true},
	{Name: "slots", Type: sdk.TypeNumber, Default: float64(0)},
	{Name: "poll", Type: sdk.TypeDuration},
	{Name: "refill", Type: sdk.TypeDuration},
}}

func (cfg *Config) decodeRunner(b *hcl.Block) hcl.Diagnostics {
	inner, rest, diags := b.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "kube"}}})
	v, ranges, d := DecodeBlock(rest, runnerSchema)
	diags = append(diags, d...)
	r := &Runner{Agent: v.String("agent"), LogDir: v.String("log_dir"), RunAs: v.String("run_as")}
	if r.RunAs != "" {
		rr := ranges["run_as"]
		refuse := func(detail string) {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &rr,
				Summary: `Invalid value for "run_as"`, Detail: detail})
		}
		if cfg.Edition == ladder.EditionKube {
			refuse("run_as is Lite's: on kube, the pods' user is runner.kube.run_as_user.")
		} else if _, err := runas.Lookup(r.RunAs); err != nil {
			refuse(err.Error() + ".")
		} else if err := runas.CheckCanSwitch(); err != nil {
			refuse(err.Error() + ".")
		}
	}
	r.Interval, _ = v.Duration("interval")
	n := v.Number("max_parallel")
	if n < 0 || n != float64(int(n)) {
		rr := ranges["max_parallel"]
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &rr,
			Summary: `Invalid value for "max_parallel"`, Detail: "max_parallel must be a whole number, 0 or more."})
	}
	r.MaxParallel = int(n)
	n = v.Number("max_active_runs")
	if n < 0 || n != float64(int(n)) {
		rr := ranges["max_active_runs"]
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &rr,
			Summary: `Invalid value for "max_active_runs"`, Detail: "max_active_runs must be a whole number, 0 (no cap) or more."})
	}
	r.MaxActiveRuns = int(n)
	if r.Agent == "" && cfg.PluginDir != "" {
		r.Agent = filepath.Join(cfg.PluginDir, "reaper-agent")
	} else {
		r.Agent = cfg.relative(r.Agent)
	}
	for i, kb := range inner.Blocks {
		if i > 0 {
			dr := kb.DefRange
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &dr,
				Summary: "Duplicate kube block", Detail: "The runner takes one kube block."})
			continue
		}
		k, d := decodeKubeRunner(kb)
		diags = append(diags, d...)
		r.Kube = k
	}
	switch {
	case cfg.Edition == ladder.EditionKube && r.Kube == nil:
		dr := b.DefRange
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &dr,
			Summary: "Runner needs a kube block on edition \"kube\"",
			Detail: "On edition \"kube\" the runner dispatches pods: add a kube { image = ... } block " +
				"(the runner's other attributes are those of the lite edition's runner, and its tick and caps)."})
	case cfg.Edition != ladder.EditionKube && r.Kube != nil:
		dr := inner.Blocks[0].DefRange
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &dr,
			Summary: "Runner kube block needs the kube edition",
			Detail:  "The kube block configures task pods; edition \"lite\" dispatches local processes."})
	}
	cfg.Runner = r
	return diags
}

// decodeKubeRunner decodes the runner's kube block.
func decodeKubeRunner(b *hcl.Block) (*KubeRunner, hcl.Diagnostics) {
	inner, rest, diags := b.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "warm_pool"}}})
	v, ranges, d := DecodeBlock(rest, kubeRunnerSchema)
	diags = append(diags, d...)
	k := &KubeRunner{
		Namespace: v.String("namespace"), Image: v.String("image"), Agent: v.String("agent"),
		ServiceAccount: v.String("service_account"), PullPolicy: v.String("image_pull_policy"),
		AttemptAPI: v.String("attempt_api"), Requests: map[string]string{}, Limits: map[string]string{},
	}
	k.TerminationGrace, _ = v.Duration("termination_grace")
	if r, ok := ranges["termination_grace"]; ok {
		k.graceRange = &r
	}
	bad := func(key, detail string) {
		rr := ranges[key]
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &rr,
			Summary: fmt.Sprintf("Invalid value for %q", key), Detail: detail})
	}
	k.ReadOnlyRoot = v.Bool("read_only_root_filesystem")
	for _, id := range []struct {
		key  string
		into *int64
	}{{"run_as_user", &k.RunAsUser}, {"run_as_group", &k.RunAsGroup}} {
		n := v.Number(id.key)
		if n < 1 || n > math.MaxInt32 || n != float64(int64(n)) {
			bad(id.key, id.key+" must be a whole number from 1 to 2147483647: the runner's pods never run as root.")
			continue
		}
		*id.into = int64(n)
	}
	switch k.PullPolicy {
	case "", "Always", "IfNotPresent", "Never":
	default:
		bad("image_pull_policy", `image_pull_policy must be "Always", "IfNotPresent" or "Never".`)
	}
	if k.TerminationGrace < 0 {
		bad("termination_grace", "termination_grace must not be negative.")
	}
	if k.AttemptAPI != "" {
		if u, err := url.Parse(k.AttemptAPI); err != nil || u.Scheme != "https" || u.Host == "" {
			bad("attempt_api", `attempt_api must be the API's https base URL as the pods reach it ("https://reaper.example:9465").`)
		}
	}
	for _, q := range []struct {
		key, resource string
		into          map[string]string
	}{
		{"cpu_request", "cpu", k.Requests}, {"memory_request", "memory", k.Requests},
		{"cpu_limit", "cpu", k.Limits}, {"memory_limit", "memory", k.Limits},
	} {
		s := v.String(q.key)
		if s == "" {
			continue
		}
		if _, err := resource.ParseQuantity(s); err != nil {
			bad(q.key, fmt.Sprintf("%s must be a Kubernetes quantity (\"500m\", \"1Gi\"): %v.", q.key, err))
			continue
		}
		q.into[q.resource] = s
	}
	for i, wb := range inner.Blocks {
		if i > 0 {
			dr := wb.DefRange
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &dr,
				Summary: "Duplicate warm_pool block", Detail: "The kube block takes one warm_pool block."})
			continue
		}
		wp, d := decodeWarmPool(wb)
		diags = append(diags, d...)
		k.WarmPool = wp
	}
	return k, diags
}

// warmPoolName is what a pool's name may be: a label value the worker pod
// names can carry.
var warmPoolName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,28}[a-z0-9])?$`)

// decodeWarmPool decodes the kube block's warm_pool block.
func decodeWarmPool(b *hcl.Block) (*WarmPool, hcl.Diagnostics) {
	v, ranges, diags := DecodeBlock(b.Body, warmPoolSchema)
	wp := &WarmPool{Name: v.String("name")}
	wp.Poll, _ = v.Duration("poll")
	wp.Refill, _ = v.Duration("refill")
	bad := func(key, detail string) {
		rr := ranges[key]
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &rr,
			Summary: fmt.Sprintf("Invalid value for %q", key), Detail: detail})
	}
	if n := v.Number("size"); n >= 1 && n == float64(int(n)) {
		wp.Size = int(n)
	} else if _, given := ranges["size"]; given { // absent: DecodeBlock said it is required
		bad("size", "size must be a whole number, 1 or more.")
	}
	if n := v.Number("slots"); n < 0 || n != float64(int(n)) {
		bad("slots", "slots must be a whole number, 0 (the default, 1) or more.")
	} else {
		wp.Slots = int(n)
	}
	if wp.Name != "" && !warmPoolName.MatchString(wp.Name) {
		bad("name", "name must be 1 to 30 lowercase letters, digits or dashes, starting and ending with a letter or digit.")
	}
	if wp.Poll < 0 {
		bad("poll", "poll must not be negative.")
	}
	if wp.Refill < 0 {
		bad("refill", "refill must not be negative.")
	}
	return wp, diags
}

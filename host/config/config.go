// Package config reads reaperd's HCL configuration file: the shape fixed by
// DESIGN.md, durations as strings, unknown keys and blocks as errors with
// file:line:column diagnostics. Plugin blocks (substrate and reaper) are kept
// undecoded until the plugin has declared its schema; DecodeBlock then
// decodes them the same way.
package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/internal/httplimit"
	"github.com/dexaflow/reaper/internal/runas"
	"github.com/dexaflow/reaper/internal/secretfile"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/substrate/lite/records"
)

// EnvDSN overrides store.dsn when set.
const EnvDSN = "REAPER_DSN"

// EnvTelemetryHost, when set, replaces the host of telemetry.listen (the
// port stays): the chart sets it to the pod's IP from the downward API, so
// telemetry is served on the pod's address rather than on every interface.
const EnvTelemetryHost = "REAPER_TELEMETRY_HOST"

// Leader elector kinds.
const (
	LeaderPostgres   = "postgres"
	LeaderKubernetes = "kubernetes"
)

// Defaults of the top-level settings.
const (
	DefaultPluginDir     = "./bin"
	DefaultLease         = 15 * time.Second
	DefaultTelemetryAddr = "127.0.0.1:9464"
	DefaultAttemptAPI    = "127.0.0.1:9465"
	// DefaultPodRunAs is runner.kube.run_as_user and run_as_group: the
	// non-root uid and gid of the runner's pods.
	DefaultPodRunAs = 65532
	// DefaultWorkerCredentialLifetime is auth.max_worker_credential_lifetime.
	DefaultWorkerCredentialLifetime = 24 * time.Hour
	// DefaultPluginMaxReply is plugin_max_reply's default, in bytes.
	DefaultPluginMaxReply = 8 << 20
	// MinPluginMaxReply and MaxPluginMaxReply bound plugin_max_reply: below
	// a mebibyte a mass sweep's reply would not fit; past 256 MiB one reply
	// could take half of the host's memory.
	MinPluginMaxReply = 1 << 20
	MaxPluginMaxReply = 256 << 20
)

// Config is a parsed, validated configuration file.
type Config struct {
	Path      string // the file it was read from
	Edition   string // "lite" or "kube"
	PluginDir string // absolute, or relative to the working directory
	// PluginMaxReply is the largest message, in bytes, the host accepts
	// from a plugin (plugin_max_reply, a quantity such as "8Mi").
	PluginMaxReply int
	DryRun         bool

	StoreDSN string // store.dsn, or REAPER_DSN when set

	Leader     Leader
	Ladder     ladder.Ladder
	Telemetry  Telemetry
	AttemptAPI AttemptAPI
	// WorkerCredentialCeiling is auth.max_worker_credential_lifetime: a
	// warm worker's credential is renewed by its claims only while it is
	// younger than this, from its first mint (its pod's creation); then it
	// lapses and the worker's pod is replaced. Positive, and greater than
	// attempt_token_ttl.
	WorkerCredentialCeiling time.Duration

	Substrate PluginBlock
	Reapers   []PluginBlock // in configured order

	// RecordDir is the Lite record directory, resolved once here: the
	// record_dir of the substrate "lite" block (relative to the file), or
	// $TMPDIR/dexaflow-agent-pids-<uid> when it is empty or absent. The
	// host hands it to the Lite substrate plugin (as its record_dir value)
	// and to the runner, so the two cannot disagree. Empty on kube.
	RecordDir string

	// Runner is the runner block: the built-in scheduler that dispatches
	// Lite tasks as agent processes, or on edition "kube" (with its kube
	// block) kube tasks as pods. nil when absent.
	Runner *Runner

	// Warnings are accepted settings worth a WARN at boot.
	Warnings []string

	// ranges records where ladder keys were set, for ladder diagnostics.
	ranges map[string]hcl.Range
	file   hcl.Range
}

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

// Telemetry is the telemetry block.
type Telemetry struct {
	Listen string // host:port serving /metrics and /monitor/health
	// Loopback is a second address served when EnvTelemetryHost moved
	// Listen to the pod's IP: 127.0.0.1 on the same port, which only the
	// pod itself reaches (kubectl port-forward dials it there). "": none.
	Loopback string
	// Limits bound the server's connections: read_header_timeout,
	// read_timeout, write_timeout, idle_timeout, max_connections.
	Limits httplimit.Limits
}

// AttemptAPI is the attempt_api block: where every replica serves the
// attempt API agents report through, and the keys and certificate it uses.
type AttemptAPI struct {
	Listen    string // host:port
	Advertise string // the base URL agents dial; default https://<bound address>
	// TLSCert and TLSKey are the operator's certificate and key; both empty:
	// a certificate for loopback use is generated once into StateDir.
	TLSCert, TLSKey string
	// TLSCA is the PEM agents are told to trust; default TLSCert.
	TLSCA string
	// SigningKeyFile is the operator's key file (HCL, current and previous
	// keys); empty: a key generated once into StateDir.
	SigningKeyFile string
	// StateDir holds what reaperd generates (signing key, loopback
	// certificate). Default: $TMPDIR/dexaflow-attempt-api-<uid>.
	StateDir string
	// Limits bound the server's connections (the keys of Telemetry.Limits).
	Limits httplimit.Limits
}

// DefaultAttemptAPIStateDir is the default attempt_api.state_dir.
func DefaultAttemptAPIStateDir() string {
	return filepath.Join(os.TempDir(), "dexaflow-attempt-api-"+strconv.Itoa(os.Getuid()))
}

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

// PluginBlock is a substrate or reaper block. Body holds the plugin's own
// attributes, decoded against the plugin's schema once it is running.
type PluginBlock struct {
	Kind   string // sdk.KindReaper or sdk.KindSubstrate
	Name   string // the block label: the plugin's name
	DryRun bool   // dry_run in the block, or the global dry_run
	SHA256 string // optional hex sha256 the plugin binary must match
	Body   hcl.Body
	Range  hcl.Range
}

// Keys the host reserves inside every plugin block (not passed to plugins).
const (
	keyDryRun = "dry_run"
	keySHA256 = "sha256"
)

// RecordDirKey is the attribute of the substrate "lite" block that the host
// reads too (see Config.RecordDir). It stays the plugin's attribute: the
// plugin declares it and receives the resolved value.
const RecordDirKey = "record_dir"

// Error is a configuration error: one or more diagnostics, each naming the
// file, line and column.
type Error struct {
	Diags hcl.Diagnostics
}

func (e *Error) Error() string { return FormatDiagnostics(e.Diags) }

// FormatDiagnostics renders diagnostics one per line as
// "file:line:col: summary: detail".
func FormatDiagnostics(diags hcl.Diagnostics) string {
	lines := make([]string, 0, len(diags))
	for _, d := range diags {
		var b strings.Builder
		if d.Subject != nil {
			fmt.Fprintf(&b, "%s:%d:%d: ", d.Subject.Filename, d.Subject.Start.Line, d.Subject.Start.Column)
		}
		if d.Severity == hcl.DiagWarning {
			b.WriteString("warning: ")
		}
		b.WriteString(d.Summary)
		if d.Detail != "" {
			b.WriteString(": ")
			b.WriteString(strings.TrimSuffix(d.Detail, "."))
		}
		lines = append(lines, b.String())
	}
	return strings.Join(lines, "\n")
}

// Options are the environment Load reads besides the file.
type Options struct {
	// Getenv looks up environment variables; nil means os.Getenv.
	Getenv func(string) string
}

// Load reads, parses and validates a configuration file (everything but the
// plugins' own attributes). The error is an *Error with diagnostics, or a
// plain error when the file cannot be read.
func Load(path string, opts Options) (*Config, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read configuration: %w", err)
	}
	return Parse(path, src, opts)
}

// Parse is Load on bytes already read.
func Parse(path string, src []byte, opts Options) (*Config, error) {
	cfg, diags := Check(path, src, opts)
	if diags.HasErrors() {
		return nil, &Error{Diags: diags}
	}
	return cfg, nil
}

// CheckFile is Check on a file. The error is a file that cannot be read.
func CheckFile(path string, opts Options) (*Config, hcl.Diagnostics, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read configuration: %w", err)
	}
	cfg, diags := Check(path, src, opts)
	return cfg, diags, nil
}

// Check decodes a configuration like Parse but does not stop at the first
// problem: it returns every diagnostic of the file, and the configuration as
// far as it could be decoded (nil only when the file is not valid HCL), so
// that reaperd validate can go on to check the plugins' blocks too. A
// configuration that comes with errors must not be run.
func Check(path string, src []byte, opts Options) (*Config, hcl.Diagnostics) {
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	parser := hclparse.NewParser()
	file, diags := parser.ParseHCL(src, path)
	if diags.HasErrors() {
		return nil, diags
	}
	content, diags := file.Body.Content(rootSchema)
	cfg := &Config{
		Path:       path,
		Leader:     Leader{Kind: LeaderPostgres, Lease: DefaultLease},
		Ladder:     ladder.Defaults(),
		Telemetry:  Telemetry{Listen: DefaultTelemetryAddr, Limits: httplimit.DefaultTelemetry()},
		AttemptAPI: AttemptAPI{Listen: DefaultAttemptAPI, StateDir: DefaultAttemptAPIStateDir(), Limits: httplimit.DefaultAttemptAPI()},
		ranges:     map[string]hcl.Range{},
		file:       file.Body.MissingItemRange(),

		WorkerCredentialCeiling: DefaultWorkerCredentialLifetime,
	}
	diags = append(diags, cfg.decode(content)...)
	if env := getenv(EnvDSN); env != "" {
		cfg.StoreDSN = env
	}
	diags = append(diags, cfg.telemetryHost(getenv(EnvTelemetryHost))...)
	diags = append(diags, cfg.checkKeyFiles()...)
	diags = append(diags, cfg.validateLadder()...)
	diags = append(diags, cfg.validateWorkerCeiling()...)
	return cfg, diags
}

// validateWorkerCeiling refuses a worker credential ceiling that is not
// positive (a warm worker's credential would renew forever) or not greater
// than attempt_token_ttl (a worker would lapse before its first claim could
// renew it).
func (cfg *Config) validateWorkerCeiling() hcl.Diagnostics {
	c, ttl := cfg.WorkerCredentialCeiling, cfg.Ladder.AttemptTokenTTL
	if c > 0 && c > ttl {
		return nil
	}
	subject := cfg.rangeOf([]string{"auth.max_worker_credential_lifetime"})
	rule := fmt.Sprintf("auth.max_worker_credential_lifetime (%s) must be greater than attempt_token_ttl (%s)",
		ladder.Format(c), ladder.Format(ttl))
	if c <= 0 {
		rule = fmt.Sprintf("auth.max_worker_credential_lifetime (%s) must be positive: a warm worker's credential "+
			"would be renewed without limit", ladder.Format(c))
	}
	return hcl.Diagnostics{{Severity: hcl.DiagError, Subject: &subject,
		Summary: "Invalid worker credential lifetime", Detail: rule + "."}}
}

var rootSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "edition", Required: true},
		{Name: "plugin_dir"},
		{Name: "plugin_max_reply"},
		{Name: "dry_run"},
	},
	Blocks: []hcl.BlockHeaderSchema{
		{Type: "store"},
		{Type: "leader", LabelNames: []string{"kind"}},
		{Type: "maintenance"},
		{Type: "ladder"},
		{Type: "auth"},
		{Type: "telemetry"},
		{Type: "substrate", LabelNames: []string{"name"}},
		{Type: "reaper", LabelNames: []string{"name"}},
		{Type: "runner"},
		{Type: "attempt_api"},
	},
}

// Schemas of the host's own blocks, in the same form plugins declare theirs.
var (
	rootAttrs = sdk.Schema{Attributes: []sdk.Attribute{
		{Name: "edition", Type: sdk.TypeString, Required: true},
		{Name: "plugin_dir", Type: sdk.TypeString, Default: DefaultPluginDir},
		{Name: "plugin_max_reply", Type: sdk.TypeString, Default: "8Mi"},
		{Name: "dry_run", Type: sdk.TypeBool, Default: false},
	}}
	storeSchema = sdk.Schema{Attributes: []sdk.Attribute{
		{Name: "dsn", Type: sdk.TypeString},
	}}
	leaderSchema = sdk.Schema{Attributes: []sdk.Attribute{
		{Name: "lease", Type: sdk.TypeDuration},
		{Name: "renew", Type: sdk.TypeDuration},
		{Name: "namespace", Type: sdk.TypeString},
		{Name: "name", Type: sdk.TypeString},
		{Name: "kubeconfig", Type: sdk.TypeString},
	}}
	maintenanceSchema = sdk.Schema{Attributes: []sdk.Attribute{
		{Name: "interval", Type: sdk.TypeDuration},
	}}
	ladderSchema = sdk.Schema{Attributes: []sdk.Attribute{
		{Name: "heartbeat", Type: sdk.TypeDuration},
		{Name: "agent_lost", Type: sdk.TypeDuration},
		{Name: "settling_grace", Type: sdk.TypeDuration},
		{Name: "attempt_token_ttl", Type: sdk.TypeDuration},
		{Name: "dispatch_lost", Type: sdk.TypeDuration},
		{Name: "pod_lost_floor", Type: sdk.TypeDuration},
		{Name: "orphan_run", Type: sdk.TypeDuration},
		{Name: "infra_confirm_valve", Type: sdk.TypeDuration},
		{Name: "task_termination_grace", Type: sdk.TypeDuration},
	}}
	authSchema = sdk.Schema{Attributes: []sdk.Attribute{
		{Name: "max_attempt_credential_lifetime", Type: sdk.TypeDuration},
		{Name: "max_worker_credential_lifetime", Type: sdk.TypeDuration},
	}}
	kubeRunnerSchema = sdk.Schema{Attributes: []sdk.Attribute{
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
	warmPoolSchema = sdk.Schema{Attributes: []sdk.Attribute{
		{Name: "name", Type: sdk.TypeString},
		{Name: "size", Type: sdk.TypeNumber, Required: true},
		{Name: "slots", Type: sdk.TypeNumber, Default: float64(0)},
		{Name: "poll", Type: sdk.TypeDuration},
		{Name: "refill", Type: sdk.TypeDuration},
	}}
	runnerSchema = sdk.Schema{Attributes: []sdk.Attribute{
		{Name: "interval", Type: sdk.TypeDuration},
		{Name: "max_parallel", Type: sdk.TypeNumber, Default: float64(0)},
		{Name: "max_active_runs", Type: sdk.TypeNumber, Default: float64(0)},
		{Name: "agent", Type: sdk.TypeString},
		{Name: "log_dir", Type: sdk.TypeString},
		{Name: "run_as", Type: sdk.TypeString},
	}}
	attemptAPISchema = sdk.Schema{Attributes: append([]sdk.Attribute{
		{Name: "listen", Type: sdk.TypeString, Default: DefaultAttemptAPI},
		{Name: "advertise", Type: sdk.TypeString},
		{Name: "tls_cert", Type: sdk.TypeString},
		{Name: "tls_key", Type: sdk.TypeString},
		{Name: "tls_ca", Type: sdk.TypeString},
		{Name: "signing_key_file", Type: sdk.TypeString},
		{Name: "state_dir", Type: sdk.TypeString},
	}, serverLimitAttrs...)}
	telemetrySchema = sdk.Schema{Attributes: append([]sdk.Attribute{
		{Name: "listen", Type: sdk.TypeString, Default: DefaultTelemetryAddr},
	}, serverLimitAttrs...)}
	// serverLimitAttrs are the keys bounding an HTTP server's connections,
	// in the telemetry and attempt_api blocks alike.
	serverLimitAttrs = []sdk.Attribute{
		{Name: "read_header_timeout", Type: sdk.TypeDuration},
		{Name: "read_timeout", Type: sdk.TypeDuration},
		{Name: "write_timeout", Type: sdk.TypeDuration},
		{Name: "idle_timeout", Type: sdk.TypeDuration},
		{Name: "max_connections", Type: sdk.TypeNumber},
	}
)

// decode fills cfg from the file's content and returns every problem found.
func (cfg *Config) decode(content *hcl.BodyContent) hcl.Diagnostics {
	var diags hcl.Diagnostics
	// Top-level attributes go through the same typed decoder as blocks.
	attrBody := hcl.Body(attrsOnly{content.Attributes})
	top, _, d := DecodeBlock(attrBody, rootAttrs)
	diags = append(diags, d...)
	cfg.Edition = top.String("edition")
	cfg.PluginDir = top.String("plugin_dir")
	cfg.DryRun = top.Bool("dry_run")
	if a, ok := content.Attributes["edition"]; ok && !d.HasErrors() &&
		cfg.Edition != ladder.EditionLite && cfg.Edition != ladder.EditionKube {
		r := a.Expr.Range()
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
			Summary: `Invalid value for "edition"`,
			Detail:  fmt.Sprintf(`edition must be "lite" or "kube", not %q.`, cfg.Edition)})
	}
	cfg.PluginDir = cfg.relative(cfg.PluginDir)
	cfg.PluginMaxReply = DefaultPluginMaxReply
	if a, ok := content.Attributes["plugin_max_reply"]; ok && !d.HasErrors() {
		n, err := parseMaxReply(top.String("plugin_max_reply"))
		if err != nil {
			r := a.Expr.Range()
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
				Summary: `Invalid value for "plugin_max_reply"`, Detail: err.Error()})
		} else {
			cfg.PluginMaxReply = n
		}
	}

	seen := map[string]*hcl.Block{}
	once := func(b *hcl.Block) bool {
		if prev, ok := seen[b.Type]; ok {
			r := b.DefRange
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
				Summary: fmt.Sprintf("Duplicate %s block", b.Type),
				Detail:  fmt.Sprintf("Only one %s block is allowed; another is at line %d.", b.Type, prev.DefRange.Start.Line)})
			return false
		}
		seen[b.Type] = b
		return true
	}
	reaperSeen := map[string]hcl.Range{}
	for _, b := range content.Blocks {
		switch b.Type {
		case "store":
			if !once(b) {
				continue
			}
			v, _, d := DecodeBlock(b.Body, storeSchema)
			diags = append(diags, d...)
			cfg.StoreDSN = v.String("dsn")
		case "leader":
			if !once(b) {
				continue
			}
			diags = append(diags, cfg.decodeLeader(b)...)
		case "maintenance":
			if !once(b) {
				continue
			}
			v, r, d := DecodeBlock(b.Body, maintenanceSchema)
			diags = append(diags, d...)
			if iv, ok := r["interval"]; ok {
				cfg.ranges["maintenance.interval"] = iv
				cfg.Ladder.MaintenanceInterval, _ = v.Duration("interval")
			}
		case "ladder":
			if !once(b) {
				continue
			}
			diags = append(diags, cfg.decodeLadder(b)...)
		case "auth":
			if !once(b) {
				continue
			}
			v, r, d := DecodeBlock(b.Body, authSchema)
			diags = append(diags, d...)
			if rr, ok := r["max_attempt_credential_lifetime"]; ok {
				cfg.ranges["auth.max_attempt_credential_lifetime"] = rr
				cfg.Ladder.CredentialCeiling, _ = v.Duration("max_attempt_credential_lifetime")
			}
			if rr, ok := r["max_worker_credential_lifetime"]; ok {
				cfg.ranges["auth.max_worker_credential_lifetime"] = rr
				cfg.WorkerCredentialCeiling, _ = v.Duration("max_worker_credential_lifetime")
			}
		case "telemetry":
			if !once(b) {
				continue
			}
			v, r, d := DecodeBlock(b.Body, telemetrySchema)
			diags = append(diags, d...)
			cfg.Telemetry.Listen = v.String("listen")
			if rr, ok := r["listen"]; ok {
				cfg.ranges["telemetry.listen"] = rr
			}
			var ld hcl.Diagnostics
			cfg.Telemetry.Limits, ld = decodeLimits(b, v, r, httplimit.DefaultTelemetry())
			diags = append(diags, ld...)
		case "runner":
			if !once(b) {
				continue
			}
			diags = append(diags, cfg.decodeRunner(b)...)
		case "attempt_api":
			if !once(b) {
				continue
			}
			diags = append(diags, cfg.decodeAttemptAPI(b)...)
		case "substrate":
			if !once(b) {
				continue
			}
			pb, d := decodePluginBlock(b, sdk.KindSubstrate, cfg.DryRun)
			diags = append(diags, d...)
			cfg.Substrate = pb
			if pb.Name == ladder.EditionLite {
				cfg.RecordDir = cfg.relative(peekString(pb.Body, RecordDirKey))
				if cfg.RecordDir == "" {
					cfg.RecordDir = records.DefaultPath()
				}
			}
		case "reaper":
			name := b.Labels[0]
			if prev, ok := reaperSeen[name]; ok {
				r := b.DefRange
				diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
					Summary: "Duplicate reaper block",
					Detail:  fmt.Sprintf("reaper %q is already configured at line %d.", name, prev.Start.Line)})
				continue
			}
			reaperSeen[name] = b.DefRange
			pb, d := decodePluginBlock(b, sdk.KindReaper, cfg.DryRun)
			diags = append(diags, d...)
			cfg.Reapers = append(cfg.Reapers, pb)
		}
	}
	if r := cfg.Runner; r != nil && r.Kube != nil && cfg.Substrate.Body != nil {
		// The runner talks to the substrate's cluster.
		r.Kube.Kubeconfig = peekString(cfg.Substrate.Body, "kubeconfig")
	}
	if r := cfg.Runner; r != nil && r.Kube != nil && r.Kube.Namespace == "" {
		// The pods go where the substrate looks for them.
		if cfg.Substrate.Body != nil {
			r.Kube.Namespace = peekString(cfg.Substrate.Body, "namespace")
		}
		if r.Kube.Namespace == "" {
			r.Kube.Namespace = DefaultKubeNamespace
		}
	}
	if _, ok := seen["substrate"]; !ok {
		r := cfg.file
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
			Summary: "Missing substrate block",
			Detail:  `Exactly one substrate block is required, for example substrate "lite" {}.`})
	} else if cfg.Edition != "" && cfg.Substrate.Name != cfg.Edition {
		r := cfg.Substrate.Range
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
			Summary: "Substrate does not match the edition",
			Detail:  fmt.Sprintf("edition %q needs substrate %q, not %q.", cfg.Edition, cfg.Edition, cfg.Substrate.Name)})
	}
	return diags
}

// relative makes a path written in the file relative to the file's
// directory; "" stays "".
func (cfg *Config) relative(path string) string {
	if path == "" || filepath.IsAbs(path) {
		return path
	}
	return filepath.Join(filepath.Dir(cfg.Path), path)
}

// peekString reads one string attribute of a plugin block without taking
// it from the block (the plugin's schema still decodes it, and reports its
// problems). A missing or malformed value reads "".
func peekString(body hcl.Body, name string) string {
	content, _, _ := body.PartialContent(&hcl.BodySchema{Attributes: []hcl.AttributeSchema{{Name: name}}})
	a, ok := content.Attributes[name]
	if !ok {
		return ""
	}
	v, diags := a.Expr.Value(nil)
	if diags.HasErrors() || v.IsNull() || !v.IsWhollyKnown() {
		return ""
	}
	v, err := convert.Convert(v, cty.String)
	if err != nil {
		return ""
	}
	return v.AsString()
}

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

func (cfg *Config) decodeAttemptAPI(b *hcl.Block) hcl.Diagnostics {
	v, ranges, diags := DecodeBlock(b.Body, attemptAPISchema)
	api := AttemptAPI{
		Listen: v.String("listen"), Advertise: v.String("advertise"),
		TLSCert: cfg.relative(v.String("tls_cert")), TLSKey: cfg.relative(v.String("tls_key")),
		TLSCA: cfg.relative(v.String("tls_ca")), SigningKeyFile: cfg.relative(v.String("signing_key_file")),
		StateDir: cfg.relative(v.String("state_dir")),
	}
	for _, k := range []string{"tls_cert", "tls_key", "tls_ca", "signing_key_file"} {
		if rr, ok := ranges[k]; ok {
			cfg.ranges["attempt_api."+k] = rr
		}
	}
	var ld hcl.Diagnostics
	api.Limits, ld = decodeLimits(b, v, ranges, httplimit.DefaultAttemptAPI())
	diags = append(diags, ld...)
	if api.StateDir == "" {
		api.StateDir = DefaultAttemptAPIStateDir()
	}
	if (api.TLSCert == "") != (api.TLSKey == "") {
		r := b.DefRange
		for _, k := range []string{"tls_cert", "tls_key"} {
			if rr, ok := ranges[k]; ok {
				r = rr
			}
		}
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
			Summary: "Incomplete attempt API certificate", Detail: "tls_cert and tls_key go together."})
	}
	if api.TLSCA != "" && api.TLSCert == "" {
		r := ranges["tls_ca"]
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
			Summary: "tls_ca without a certificate", Detail: "tls_ca names what agents trust for the operator's tls_cert; give tls_cert and tls_key."})
	}
	if api.TLSCert == "" && !loopbackListen(api.Listen) {
		r := b.DefRange
		if rr, ok := ranges["listen"]; ok {
			r = rr
		}
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
			Summary: "Attempt API off loopback without a certificate",
			Detail:  fmt.Sprintf("listen %q is not a loopback address: give tls_cert and tls_key (the generated certificate is for loopback use only).", api.Listen)})
	}
	cfg.AttemptAPI = api
	return diags
}

// decodeLimits reads a server block's connection bounds over defaults and
// refuses, at the key, a bound that is not positive.
func decodeLimits(b *hcl.Block, v sdk.Values, ranges map[string]hcl.Range, defaults httplimit.Limits) (httplimit.Limits, hcl.Diagnostics) {
	l := defaults
	for _, f := range []struct {
		key string
		dst *time.Duration
	}{
		{"read_header_timeout", &l.ReadHeaderTimeout}, {"read_timeout", &l.ReadTimeout},
		{"write_timeout", &l.WriteTimeout}, {"idle_timeout", &l.IdleTimeout},
	} {
		if _, ok := ranges[f.key]; ok {
			*f.dst, _ = v.Duration(f.key)
		}
	}
	var diags hcl.Diagnostics
	if rr, ok := ranges["max_connections"]; ok {
		n := v.Number("max_connections")
		if n < 1 || n != float64(int(n)) {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &rr,
				Summary: `Invalid value for "max_connections"`, Detail: "max_connections must be a whole number, 1 or more."})
			return l, diags
		}
		l.MaxConns = int(n)
	}
	if err := l.Validate(); err != nil {
		r := b.DefRange
		for _, k := range []string{"read_header_timeout", "read_timeout", "write_timeout", "idle_timeout"} {
			if rr, ok := ranges[k]; ok && strings.HasPrefix(err.Error(), k) {
				r = rr
			}
		}
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
			Summary: fmt.Sprintf("Invalid %s limits", b.Type), Detail: err.Error() + "."})
	}
	return l, diags
}

// telemetryHost puts host (EnvTelemetryHost) in place of telemetry.listen's
// host, and keeps loopback on the same port (see Telemetry.Loopback); ""
// leaves the address as configured.
func (cfg *Config) telemetryHost(host string) hcl.Diagnostics {
	if host == "" {
		return nil
	}
	r := cfg.rangeOf([]string{"telemetry.listen"})
	_, port, err := net.SplitHostPort(cfg.Telemetry.Listen)
	if err == nil && net.ParseIP(host) == nil {
		err = fmt.Errorf("%s=%q is not an IP address", EnvTelemetryHost, host)
	}
	if err != nil {
		return hcl.Diagnostics{{Severity: hcl.DiagError, Subject: &r,
			Summary: "Invalid telemetry address", Detail: err.Error() + "."}}
	}
	cfg.Telemetry.Listen = net.JoinHostPort(host, port)
	if ip := net.ParseIP(host); !ip.IsLoopback() {
		cfg.Telemetry.Loopback = net.JoinHostPort("127.0.0.1", port)
	}
	return nil
}

// checkKeyFiles refuses, at its key, a private key file that others may
// read or write (the attempt API's tls_key and signing_key_file), and
// warns of a certificate that others may write (tls_cert, tls_ca). Files
// that do not exist are left to the daemon's load, which names them.
func (cfg *Config) checkKeyFiles() hcl.Diagnostics {
	var diags hcl.Diagnostics
	api := cfg.AttemptAPI
	for _, k := range []struct{ key, path string }{
		{"tls_key", api.TLSKey}, {"signing_key_file", api.SigningKeyFile},
	} {
		if k.path == "" {
			continue
		}
		if err := secretfile.PrivateKey(k.path); err != nil {
			r := cfg.rangeOf([]string{"attempt_api." + k.key})
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
				Summary: fmt.Sprintf("Invalid value for %q", k.key), Detail: err.Error() + "."})
		}
	}
	for _, k := range []struct{ key, path string }{{"tls_cert", api.TLSCert}, {"tls_ca", api.TLSCA}} {
		if k.path == "" {
			continue
		}
		if w := secretfile.Certificate(k.path); w != "" {
			r := cfg.rangeOf([]string{"attempt_api." + k.key})
			cfg.Warnings = append(cfg.Warnings, fmt.Sprintf("%s:%d:%d: attempt_api.%s: %s",
				r.Filename, r.Start.Line, r.Start.Column, k.key, w))
		}
	}
	return diags
}

// loopbackListen reports whether host:port names a loopback host.
func loopbackListen(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
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

func (cfg *Config) decodeLadder(b *hcl.Block) hcl.Diagnostics {
	v, ranges, diags := DecodeBlock(b.Body, ladderSchema)
	set := func(key string, dst *time.Duration) {
		if r, ok := ranges[key]; ok {
			cfg.ranges[key] = r
			*dst, _ = v.Duration(key)
		}
	}
	l := &cfg.Ladder
	set("heartbeat", &l.Heartbeat)
	set("agent_lost", &l.AgentLost)
	set("settling_grace", &l.SettlingGrace)
	set("attempt_token_ttl", &l.AttemptTokenTTL)
	set("dispatch_lost", &l.DispatchLost)
	set("pod_lost_floor", &l.PodLostFloor)
	set("orphan_run", &l.OrphanRun)
	set("infra_confirm_valve", &l.InfraConfirmValve)
	set("task_termination_grace", &l.TaskTerminationGrace)
	return diags
}

// validateLadder checks the ladder's inequalities and turns each broken rule
// into a diagnostic at the offending key (the first of its keys set in the
// file, or the file itself when all are defaults).
func (cfg *Config) validateLadder() hcl.Diagnostics {
	warnings, err := cfg.Ladder.Validate(cfg.Edition)
	var diags hcl.Diagnostics
	for _, w := range warnings {
		subject := cfg.rangeOf([]string{w.Key})
		cfg.Warnings = append(cfg.Warnings, fmt.Sprintf("%s:%d:%d: %s",
			subject.Filename, subject.Start.Line, subject.Start.Column, w.Message))
	}
	var lerr *ladder.Error
	if errors.As(err, &lerr) {
		for _, v := range lerr.Violations {
			subject := cfg.rangeOf(v.Keys)
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &subject,
				Summary: "Timing ladder out of order",
				Detail:  fmt.Sprintf("%s (keys: %s).", v.Rule, strings.Join(v.Keys, ", "))})
		}
	}
	return append(diags, cfg.validatePodGrace()...)
}

// validatePodGrace holds the grace rung against the grace the kube runner
// really gives its pods. The ladder checks task_termination_grace, but
// runner.kube.termination_grace overrides it on every pod the runner makes
// (task pods and warm workers alike; no task sets a grace of its own), so
// a longer one would let the infra confirmation valve re-place a task while
// the old container is still inside its SIGTERM grace: two copies at once.
func (cfg *Config) validatePodGrace() hcl.Diagnostics {
	if cfg.Edition != ladder.EditionKube || cfg.Runner == nil || cfg.Runner.Kube == nil || cfg.Runner.Kube.graceRange == nil {
		return nil
	}
	l, grace := cfg.Ladder, cfg.Runner.Kube.TerminationGrace
	r := *cfg.Runner.Kube.graceRange
	if twice := 2 * l.MaintenanceInterval; twice < 0 || grace > math.MaxInt64-twice {
		// The ladder has refused an interval whose double overflows.
		if twice < 0 {
			return nil
		}
		return hcl.Diagnostics{{Severity: hcl.DiagError, Subject: &r,
			Summary: "Timing ladder out of order",
			Detail: fmt.Sprintf("runner.kube.termination_grace + 2 x maintenance.interval overflows a duration: "+
				"runner.kube.termination_grace (%s) is too large.", ladder.Format(grace))}}
	}
	if floor := grace + 2*l.MaintenanceInterval; floor < l.InfraConfirmValve {
		return nil
	}
	valveAt := "its default"
	if r, ok := cfg.ranges["infra_confirm_valve"]; ok {
		valveAt = fmt.Sprintf("%s:%d", r.Filename, r.Start.Line)
	}
	return hcl.Diagnostics{{Severity: hcl.DiagError, Subject: &r,
		Summary: "Timing ladder out of order",
		Detail: fmt.Sprintf("infra_confirm_valve (%s, at %s) must be greater than runner.kube.termination_grace (%s, at %s:%d) "+
			"+ 2 x maintenance.interval (%s): the valve would re-place a task while its old pod is still inside its termination grace "+
			"(keys: infra_confirm_valve, runner.kube.termination_grace, maintenance.interval).",
			ladder.Format(l.InfraConfirmValve), valveAt, ladder.Format(grace), r.Filename, r.Start.Line,
			ladder.Format(2*l.MaintenanceInterval))}}
}

func (cfg *Config) rangeOf(keys []string) hcl.Range {
	for _, k := range keys {
		if r, ok := cfg.ranges[k]; ok {
			return r
		}
	}
	return cfg.file
}

func decodePluginBlock(b *hcl.Block, kind string, globalDryRun bool) (PluginBlock, hcl.Diagnostics) {
	pb := PluginBlock{Kind: kind, Name: b.Labels[0], DryRun: globalDryRun, Range: b.DefRange}
	reserved := &hcl.BodySchema{Attributes: []hcl.AttributeSchema{{Name: keyDryRun}, {Name: keySHA256}}}
	content, remain, diags := b.Body.PartialContent(reserved)
	pb.Body = remain
	host, _, d := DecodeBlock(attrsOnly{content.Attributes}, sdk.Schema{Attributes: []sdk.Attribute{
		{Name: keyDryRun, Type: sdk.TypeBool},
		{Name: keySHA256, Type: sdk.TypeString},
	}})
	diags = append(diags, d...)
	if v, ok := host[keyDryRun]; ok {
		pb.DryRun = globalDryRun || v.(bool)
	}
	pb.SHA256 = strings.ToLower(host.String(keySHA256))
	if a, ok := content.Attributes[keySHA256]; ok && !validSHA256(pb.SHA256) {
		r := a.Expr.Range()
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
			Summary: `Invalid value for "sha256"`, Detail: "sha256 must be 64 hexadecimal digits."})
	}
	return pb, diags
}

func validSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}

// attrsOnly is a body made of already-extracted attributes, so the typed
// decoder can run over top-level and reserved attributes.
type attrsOnly struct{ attrs hcl.Attributes }

func (b attrsOnly) Content(s *hcl.BodySchema) (*hcl.BodyContent, hcl.Diagnostics) {
	c, _, d := b.PartialContent(s)
	return c, d
}

func (b attrsOnly) PartialContent(s *hcl.BodySchema) (*hcl.BodyContent, hcl.Body, hcl.Diagnostics) {
	c := &hcl.BodyContent{Attributes: hcl.Attributes{}}
	for _, as := range s.Attributes {
		if a, ok := b.attrs[as.Name]; ok {
			c.Attributes[as.Name] = a
		}
	}
	return c, attrsOnly{}, nil
}

func (b attrsOnly) JustAttributes() (hcl.Attributes, hcl.Diagnostics) { return b.attrs, nil }

func (b attrsOnly) MissingItemRange() hcl.Range { return hcl.Range{} }

// ReaperNames lists the configured reapers in order.
func (cfg *Config) ReaperNames() []string {
	out := make([]string, len(cfg.Reapers))
	for i, r := range cfg.Reapers {
		out[i] = r.Name
	}
	return out
}

// parseMaxReply reads plugin_max_reply: a quantity of bytes ("8Mi",
// "16Mi", "4000000") between MinPluginMaxReply and MaxPluginMaxReply.
func parseMaxReply(v string) (int, error) {
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return 0, fmt.Errorf("plugin_max_reply must be a size in bytes such as \"8Mi\": %v", err)
	}
	n, ok := q.AsInt64()
	if !ok || n < MinPluginMaxReply || n > MaxPluginMaxReply {
		return 0, fmt.Errorf("plugin_max_reply must be between 1Mi and 256Mi, not %q", v)
	}
	return int(n), nil
}

// Package config reads reaperd's HCL configuration file: the shape fixed by
// DESIGN.md, durations as strings, unknown keys and blocks as errors with
// file:line:column diagnostics.
//
// Each block is a struct with reaper tags, decoded the way a plugin's
// block is: sdk.SchemaOf declares it, DecodeBlock checks the block against
// that schema, sdk.Values.Decode fills the struct, and the block's own
// checks refuse what a type cannot say. A component's block is the
// component's own, with its defaults and rules, in its package
// (attemptapi.Block, literunner.Block and PoolBlock, kubesettings.Block and
// WarmPoolBlock): its rules name the key they refuse (settingrule.Problem)
// and this package places each at its key in the file. The host's own
// blocks are in the file of their block (leader.go, telemetry.go, ...).
// config.go holds the file as a whole: the edition rules, and the timing
// ladder, whose rules span the ladder, maintenance, auth, attempt_api and
// runner blocks. Plugin blocks
// (substrate and reaper) are kept undecoded until the plugin has declared
// its schema; DecodeBlock then decodes them the same way.
package config

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/host/audit"
	"github.com/dexaflow/reaper/internal/httplimit"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// Defaults of the top-level settings.
const (
	PluginDirDefault = "./bin"
	// WorkerCredentialLifetimeDefault is auth.max_worker_credential_lifetime.
	WorkerCredentialLifetimeDefault = 24 * time.Hour
	// PluginMaxReplyDefault is plugin_max_reply's default, in bytes.
	PluginMaxReplyDefault = 8 << 20
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

	StoreDSN string // store.dsn, or read from StoreDSNFile, or REAPER_DSN when set
	// StoreDSNFile is the file StoreDSN was read from (store.dsn_file, or
	// REAPER_DSN_FILE); "" when none. A secret of reaperd's: no plugin may
	// read it (Secrets).
	StoreDSNFile string
	// StoreDSNWait is why StoreDSN is empty although StoreDSNFile is set:
	// the file is missing, or its text is not one line (Options.
	// WaitForDSNFile). nil otherwise.
	StoreDSNWait error

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

	// ShadowHorizon is maintenance.shadow_horizon: how long a shadow
	// decision waits for its truth before the leader scores it unresolved
	// (0: audit.ShadowHorizonDefault, 24h).
	ShadowHorizon time.Duration
	// HistoryRetention is maintenance.history_retention: how long the
	// attempt history (replay's and the shadow scorer's) is kept (0:
	// board.HistoryRetentionDefault, 30 days).
	HistoryRetention time.Duration
	// AuditRetention is maintenance.audit_retention: how long the audit of
	// decisions (explain's, the shadow scorer's) and the warm workers'
	// claims are kept (0: board.AuditRetentionDefault, 90 days).
	AuditRetention time.Duration

	// Warnings are accepted settings worth a WARN at boot.
	Warnings []string

	// ranges records where ladder keys were set, for ladder diagnostics.
	ranges map[string]hcl.Range
	file   hcl.Range
}

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
	// WaitForDSNFile accepts a DSN file that is missing or whose text is
	// not one line (a *DSNFileError): Config.StoreDSNWait holds why, and
	// the caller waits for the file (reaperd run). A file others may read
	// is refused all the same.
	WaitForDSNFile bool
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
		Leader:     Leader{Kind: LeaderPostgres, Lease: LeaseDefault},
		Ladder:     ladder.Defaults(),
		Telemetry:  Telemetry{Listen: TelemetryAddrDefault, Limits: httplimit.DefaultTelemetry()},
		AttemptAPI: attemptapi.DefaultSettings(),
		ranges:     map[string]hcl.Range{},
		file:       file.Body.MissingItemRange(),

		WorkerCredentialCeiling: WorkerCredentialLifetimeDefault,
	}
	diags = append(diags, cfg.decode(content)...)
	diags = append(diags, cfg.storeFromEnv(getenv, opts.WaitForDSNFile)...)
	diags = append(diags, cfg.telemetryHost(getenv(EnvTelemetryHost))...)
	diags = append(diags, cfg.checkKeyFiles()...)
	diags = append(diags, cfg.validateLadder()...)
	diags = append(diags, cfg.validateWorkerCeiling()...)
	diags = append(diags, cfg.validateHeartbeatWindow()...)
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

// topLevel is the file's own attributes, outside any block.
type topLevel struct {
	Edition        string `reaper:"edition,required"` // ladder.EditionLite or ladder.EditionKube
	PluginDir      string `reaper:"plugin_dir"`
	PluginMaxReply string `reaper:"plugin_max_reply"` // a quantity of bytes (parseMaxReply)
	DryRun         bool   `reaper:"dry_run"`
}

func defaultTopLevel() topLevel {
	return topLevel{PluginDir: PluginDirDefault, PluginMaxReply: "8Mi"}
}

// rootSchema is the file's: its own attributes and the blocks it takes.
var rootSchema = &hcl.BodySchema{
	Attributes: bodySchema(sdk.SchemaOf(defaultTopLevel())).Attributes,
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

// decode fills cfg from the file's content and returns every problem found.
func (cfg *Config) decode(content *hcl.BodyContent) hcl.Diagnostics {
	diags := cfg.decodeTopLevel(content.Attributes)
	single := map[string]func(*hcl.Block) hcl.Diagnostics{
		"store": cfg.decodeStore, "leader": cfg.decodeLeader, "maintenance": cfg.decodeMaintenance,
		"ladder": cfg.decodeLadder, "auth": cfg.decodeAuth, "telemetry": cfg.decodeTelemetry,
		"runner": cfg.decodeRunner, "attempt_api": cfg.decodeAttemptAPI, "substrate": cfg.decodeSubstrate,
	}
	seen := map[string]*hcl.Block{}
	reaperSeen := map[string]hcl.Range{}
	for _, b := range content.Blocks {
		if b.Type == "reaper" {
			diags = append(diags, cfg.decodeReaper(b, reaperSeen)...)
			continue
		}
		if prev, ok := seen[b.Type]; ok {
			r := b.DefRange
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: &r,
				Summary: fmt.Sprintf("Duplicate %s block", b.Type),
				Detail:  fmt.Sprintf("Only one %s block is allowed; another is at line %d.", b.Type, prev.DefRange.Start.Line)})
			continue
		}
		seen[b.Type] = b
		diags = append(diags, single[b.Type](b)...)
	}
	cfg.kubeRunnerFromSubstrate()
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

// decodeTopLevel decodes the file's own attributes, through the same typed
// decoder as the blocks.
func (cfg *Config) decodeTopLevel(attrs hcl.Attributes) hcl.Diagnostics {
	top := defaultTopLevel()
	ranges, diags := decodeInto(attrsOnly{attrs}, &top)
	cfg.Edition = top.Edition
	cfg.PluginDir = cfg.relative(top.PluginDir)
	cfg.DryRun = top.DryRun
	cfg.PluginMaxReply = PluginMaxReplyDefault
	if diags.HasErrors() {
		return diags
	}
	if _, ok := ranges["edition"]; ok && cfg.Edition != ladder.EditionLite && cfg.Edition != ladder.EditionKube {
		diags = append(diags, invalid(ranges, "edition",
			fmt.Sprintf(`edition must be "lite" or "kube", not %q.`, cfg.Edition)))
	}
	if _, ok := ranges["plugin_max_reply"]; ok {
		n, err := parseMaxReply(top.PluginMaxReply)
		if err != nil {
			diags = append(diags, invalid(ranges, "plugin_max_reply", err.Error()))
		} else {
			cfg.PluginMaxReply = n
		}
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

// decodeLadder decodes the ladder block into the ladder itself, whose
// fields carry the block's keys.
func (cfg *Config) decodeLadder(b *hcl.Block) hcl.Diagnostics {
	ranges, diags := decodeInto(b.Body, &cfg.Ladder)
	for key, r := range ranges {
		cfg.ranges[key] = r
	}
	return diags
}

// maintenanceBlock is the maintenance block: the cycle's period, a rung of
// the ladder, and how long a shadow decision waits for its truth.
type maintenanceBlock struct {
	Interval         time.Duration `reaper:"interval"`
	ShadowHorizon    time.Duration `reaper:"shadow_horizon"`
	HistoryRetention time.Duration `reaper:"history_retention"`
	AuditRetention   time.Duration `reaper:"audit_retention"`
}

func (cfg *Config) decodeMaintenance(b *hcl.Block) hcl.Diagnostics {
	mb := maintenanceBlock{Interval: cfg.Ladder.MaintenanceInterval, ShadowHorizon: cfg.ShadowHorizon,
		HistoryRetention: cfg.HistoryRetention, AuditRetention: cfg.AuditRetention}
	ranges, diags := decodeInto(b.Body, &mb)
	if r, ok := ranges["interval"]; ok {
		cfg.ranges["maintenance.interval"] = r
	}
	cfg.Ladder.MaintenanceInterval = mb.Interval
	if r, ok := ranges["shadow_horizon"]; ok && mb.ShadowHorizon <= 0 {
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: r.Ptr(),
			Summary: "Invalid maintenance.shadow_horizon",
			Detail: fmt.Sprintf("maintenance.shadow_horizon must be a positive duration, got %s: a shadow decision "+
				"waits that long for its truth before it is scored unresolved.", ladder.Format(mb.ShadowHorizon))})
	}
	cfg.ShadowHorizon = mb.ShadowHorizon
	horizon := mb.ShadowHorizon
	if horizon <= 0 {
		horizon = audit.ShadowHorizonDefault
	}
	for _, k := range []struct {
		key, why      string
		set, fallback time.Duration
	}{
		{"history_retention", "the shadow scorer reads an attempt's history until its decision is scored",
			mb.HistoryRetention, board.HistoryRetentionDefault},
		{"audit_retention", "a shadow decision must still be in the audit when its verdict is written",
			mb.AuditRetention, board.AuditRetentionDefault},
	} {
		retention := k.set
		if retention == 0 {
			retention = k.fallback
		}
		if retention > horizon {
			continue
		}
		r, ok := ranges[k.key]
		if !ok {
			r = ranges["shadow_horizon"]
		}
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Subject: r.Ptr(),
			Summary: "Invalid maintenance." + k.key,
			Detail: fmt.Sprintf("maintenance.%s (%s) must be longer than maintenance.shadow_horizon (%s): %s.",
				k.key, ladder.Format(retention), ladder.Format(horizon), k.why)})
	}
	cfg.HistoryRetention, cfg.AuditRetention = mb.HistoryRetention, mb.AuditRetention
	return diags
}

// authBlock is the auth block: the credentials' ceilings, the attempts' a
// rung of the ladder.
type authBlock struct {
	AttemptCeiling time.Duration `reaper:"max_attempt_credential_lifetime"`
	WorkerCeiling  time.Duration `reaper:"max_worker_credential_lifetime"`
}

func (cfg *Config) decodeAuth(b *hcl.Block) hcl.Diagnostics {
	ab := authBlock{AttemptCeiling: cfg.Ladder.CredentialCeiling, WorkerCeiling: cfg.WorkerCredentialCeiling}
	ranges, diags := decodeInto(b.Body, &ab)
	for key, r := range ranges {
		cfg.ranges["auth."+key] = r
	}
	cfg.Ladder.CredentialCeiling = ab.AttemptCeiling
	cfg.WorkerCredentialCeiling = ab.WorkerCeiling
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

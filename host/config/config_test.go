package config_test

import (
	"errors"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/dexaflow/reaper/host/config"
	"github.com/dexaflow/reaper/internal/httplimit"
	"github.com/dexaflow/reaper/sdk"
)

const minimal = `edition = "lite"
substrate "lite" {}
`

const kubeMinimal = `edition = "kube"
substrate "kube" {}
`

func TestKubeRunnerBlock(t *testing.T) {
	src := `edition = "kube"
substrate "kube" {
  namespace  = "tasks"
  kubeconfig = "cluster.kubeconfig"
}
runner {
  max_parallel = 8
  kube {
    image             = "registry.example/task:1"
    service_account   = "task"
    image_pull_policy = "IfNotPresent"
    termination_grace = "45s"
    cpu_request       = "250m"
    memory_limit      = "1Gi"
    attempt_api       = "https://reaper.tasks.svc:9465"
    pod_token_audience = "reaper-api.tasks"
    dispatch_buffer    = 64
    dispatch_workers   = 8
    warm_pool {
      name   = "etl"
      size   = 3
      slots  = 2
      poll   = "500ms"
      refill = "10s"
    }
  }
}
`
	// The build still refuses the kube edition: Check decodes all the same,
	// and that refusal must be its only complaint.
	check := func(src string) *config.Config {
		t.Helper()
		cfg, diags := config.Check("reaper.hcl", []byte(src), config.Options{Getenv: func(string) string { return "" }})
		for _, d := range diags {
			if d.Severity == hcl.DiagError && d.Summary != `Edition "kube" is not available` {
				t.Fatalf("%s: %s", d.Summary, d.Detail)
			}
		}
		return cfg
	}
	cfg := check(src)
	k := cfg.Runner.Kube
	if cfg.Runner.MaxParallel != 8 || k == nil || k.Namespace != "tasks" || k.Image != "registry.example/task:1" ||
		k.ServiceAccount != "task" || k.Kubeconfig != "cluster.kubeconfig" || k.PullPolicy != "IfNotPresent" || k.TerminationGrace != 45*time.Second ||
		k.Requests["cpu"] != "250m" || k.Limits["memory"] != "1Gi" || len(k.Requests) != 1 || len(k.Limits) != 1 ||
		k.AttemptAPI != "https://reaper.tasks.svc:9465" || k.PodTokenAudience != "reaper-api.tasks" ||
		k.DispatchBuffer != 64 || k.DispatchWorkers != 8 {
		t.Fatalf("runner = %+v, kube = %+v", cfg.Runner, k)
	}
	if wp := k.WarmPool; wp == nil || *wp != (config.WarmPool{Name: "etl", Size: 3, Slots: 2, Poll: 500 * time.Millisecond,
		Refill: 10 * time.Second}) {
		t.Fatalf("warm pool %+v", wp)
	}
	if k.RunAsUser != config.PodRunAsDefault || k.RunAsGroup != config.PodRunAsDefault || !k.ReadOnlyRoot {
		t.Fatalf("pods run as %d:%d, read-only root %v: want the non-root default and a read-only root",
			k.RunAsUser, k.RunAsGroup, k.ReadOnlyRoot)
	}
	cfg = check(kubeMinimal + "runner {\n  kube {\n    image = \"x\"\n    run_as_user = 1000\n    run_as_group = 2000\n" +
		"    read_only_root_filesystem = false\n  }\n}\n")
	if k := cfg.Runner.Kube; k.RunAsUser != 1000 || k.RunAsGroup != 2000 || k.ReadOnlyRoot {
		t.Fatalf("pods run as %d:%d, read-only root %v: want 1000:2000, writable", k.RunAsUser, k.RunAsGroup, k.ReadOnlyRoot)
	}
	for _, bad := range []string{"run_as_user = 0", "run_as_group = 0", "run_as_user = -1", "run_as_user = 1.5"} {
		_, diags := config.Check("reaper.hcl", []byte(kubeMinimal+"runner {\n  kube {\n    image = \"x\"\n    "+bad+"\n  }\n}\n"),
			config.Options{Getenv: func(string) string { return "" }})
		if !strings.Contains(diags.Error(), "the runner's pods never run as root") {
			t.Errorf("%s: %v, want refused", bad, diags)
		}
	}
	for bad, want := range map[string]string{
		"dispatch_buffer = -1":                            "dispatch_buffer must be a whole number",
		"dispatch_buffer = 1.5":                           "dispatch_buffer must be a whole number",
		"dispatch_workers = 4":                            "set dispatch_buffer above 0 too",
		"dispatch_buffer = 8\n    dispatch_workers = 0.5": "dispatch_workers must be a whole number from 1 to 256",
		"dispatch_buffer = 8\n    dispatch_workers = 257": "dispatch_workers must be a whole number from 1 to 256",
	} {
		_, diags := config.Check("reaper.hcl", []byte(kubeMinimal+"runner {\n  kube {\n    image = \"x\"\n    "+bad+"\n  }\n}\n"),
			config.Options{Getenv: func(string) string { return "" }})
		if !strings.Contains(diags.Error(), want) {
			t.Errorf("%s: %v, want refused: %s", bad, diags, want)
		}
	}
	cfg = check(kubeMinimal + "runner {\n  kube {\n    image = \"x\"\n  }\n}\n")
	if k := cfg.Runner.Kube; k.DispatchBuffer != 0 || k.DispatchWorkers != 0 {
		t.Fatalf("dispatch buffer %d, workers %d: want none (the tick creates the pods)", k.DispatchBuffer, k.DispatchWorkers)
	}
	if cfg.Runner.Kube.Namespace != config.KubeNamespaceDefault || cfg.Runner.Kube.WarmPool != nil {
		t.Fatalf("namespace %q, warm pool %+v: want the default, none", cfg.Runner.Kube.Namespace, cfg.Runner.Kube.WarmPool)
	}
	cfg = check(kubeMinimal + "runner {\n  kube {\n    image = \"x\"\n    warm_pool {\n      size = 1\n    }\n  }\n}\n")
	if wp := cfg.Runner.Kube.WarmPool; wp == nil || *wp != (config.WarmPool{Size: 1}) {
		t.Fatalf("warm pool %+v: want size 1, the rest the runner's defaults", wp)
	}
}

func parse(t *testing.T, src string, env map[string]string) (*config.Config, error) {
	t.Helper()
	return config.Parse("reaper.hcl", []byte(src), config.Options{Getenv: func(k string) string { return env[k] }})
}

func TestExampleFileParsesAndValidates(t *testing.T) {
	cfg, err := config.Load(filepath.Join("..", "..", "config.hcl.example"), config.Options{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatalf("config.hcl.example: %v", err)
	}
	if cfg.Edition != "lite" || cfg.Substrate.Name != "lite" {
		t.Fatalf("edition/substrate = %q/%q", cfg.Edition, cfg.Substrate.Name)
	}
	if got := strings.Join(cfg.ReaperNames(), ","); got != "dispatchlost,agentlost,orphanrun" {
		t.Fatalf("reapers in order = %s", got)
	}
	if cfg.Ladder.AgentLost != 90*time.Second || cfg.Ladder.MaintenanceInterval != 30*time.Second ||
		cfg.Ladder.CredentialCeiling != time.Hour || cfg.Leader.Lease != 15*time.Second {
		t.Fatalf("ladder = %+v, leader = %+v", cfg.Ladder, cfg.Leader)
	}
	if cfg.Runner == nil || cfg.Runner.Interval != time.Second || cfg.Runner.Agent != filepath.Join("..", "..", "bin", "reaper-agent") {
		t.Fatalf("runner = %+v", cfg.Runner)
	}
	if cfg.Telemetry.Listen != "127.0.0.1:9464" {
		t.Fatalf("telemetry = %+v", cfg.Telemetry)
	}
	if cfg.ShadowHorizon != 24*time.Hour {
		t.Fatalf("maintenance.shadow_horizon = %s", cfg.ShadowHorizon)
	}
	if api := cfg.AttemptAPI; api.Listen != "127.0.0.1:9465" || api.TLSCert != "" || api.SigningKeyFile != "" ||
		api.StateDir != config.DefaultAttemptAPIStateDir() {
		t.Fatalf("attempt_api = %+v", api)
	}
	if len(cfg.Warnings) != 0 {
		t.Fatalf("warnings = %v", cfg.Warnings)
	}
}

func TestBadFiles(t *testing.T) {
	cases := []struct {
		name string
		src  string
		// want are substrings of the diagnostics: the position and the key.
		want []string
	}{
		{"UnknownTopLevelKey", minimal + "colour = \"red\"\n", []string{"reaper.hcl:3:1:", `"colour"`}},
		{"UnknownBlock", minimal + "\nscheduler {\n}\n", []string{"reaper.hcl:4:1:", `"scheduler"`}},
		{"UnknownLadderKey", minimal + "ladder {\n  heartbeet = \"15s\"\n}\n", []string{"reaper.hcl:4:3:", `"heartbeet"`}},
		{"MalformedSyntax", "edition = \"lite\"\nsubstrate \"lite\" {\n", []string{"reaper.hcl:2:"}},
		{"MissingEdition", "substrate \"lite\" {}\n", []string{"reaper.hcl:", `"edition"`}},
		{"UnknownEdition", "edition = \"cloud\"\nsubstrate \"lite\" {}\n", []string{"reaper.hcl:1:11:", "edition"}},
		{"BadDuration", minimal + "ladder {\n  agent_lost = \"ninety\"\n}\n", []string{"reaper.hcl:4:16:", `"agent_lost"`}},
		{"NumberWhereDurationString", minimal + "maintenance {\n  interval = 30\n}\n", []string{"reaper.hcl:4:14:", `"interval"`}},
		{"ShadowHorizonNotPositive", minimal + "maintenance {\n  shadow_horizon = \"0s\"\n}\n",
			[]string{"reaper.hcl:4:20:", "maintenance.shadow_horizon must be a positive duration"}},
		{"HistoryRetentionNotPastTheShadowHorizon", minimal + "maintenance {\n  history_retention = \"12h\"\n}\n",
			[]string{"reaper.hcl:4:23:", "maintenance.history_retention (12h) must be longer than maintenance.shadow_horizon (24h)"}},
		{"ShadowHorizonPastTheDefaultRetention", minimal + "maintenance {\n  shadow_horizon = \"800h\"\n}\n",
			[]string{"reaper.hcl:4:20:", "maintenance.history_retention (720h) must be longer than maintenance.shadow_horizon (800h)"}},
		{"AuditRetentionNotPastTheShadowHorizon", minimal + "maintenance {\n  audit_retention = \"12h\"\n}\n",
			[]string{"reaper.hcl:4:21:", "maintenance.audit_retention (12h) must be longer than maintenance.shadow_horizon (24h)"}},
		{"ShadowHorizonPastTheDefaultAuditRetention", minimal + "maintenance {\n  shadow_horizon = \"2200h\"\n  history_retention = \"2300h\"\n}\n",
			[]string{"reaper.hcl:4:20:", "maintenance.audit_retention (2160h) must be longer than maintenance.shadow_horizon (2200h)"}},
		{"WrongTypeDryRun", "edition = \"lite\"\ndry_run = \"maybe\"\nsubstrate \"lite\" {}\n", []string{"reaper.hcl:2:11:", `"dry_run"`}},
		{"MissingSubstrate", "edition = \"lite\"\n", []string{"reaper.hcl:", "substrate"}},
		{"TwoSubstrates", minimal + "substrate \"lite\" {}\n", []string{"reaper.hcl:3:1:", "Duplicate substrate"}},
		{"SubstrateNotMatchingEdition", "edition = \"kube\"\nsubstrate \"lite\" {}\n", []string{"reaper.hcl:2:1:", `substrate "kube"`}},
		{"DuplicateReaper", minimal + "reaper \"agentlost\" {}\nreaper \"agentlost\" {}\n", []string{"reaper.hcl:4:1:", `"agentlost"`}},
		{"BadChecksum", minimal + "reaper \"agentlost\" {\n  sha256 = \"abc\"\n}\n", []string{"reaper.hcl:4:12:", "sha256"}},
		{"UnknownLeaderKind", minimal + "leader \"zookeeper\" {}\n", []string{"reaper.hcl:3:8:", `"zookeeper"`}},
		{"KubernetesLeaderWithoutName", minimal + "leader \"kubernetes\" {\n  namespace = \"x\"\n}\n", []string{"reaper.hcl:3:8:", "name"}},
		{"RunnerOnKubeWithoutItsKubeBlock", kubeMinimal + "runner {}\n", []string{"reaper.hcl:3:1:", "kube block"}},
		{"RunnerKubeBlockOnLite", minimal + "runner {\n  kube {\n    image = \"x\"\n  }\n}\n", []string{"reaper.hcl:4:3:", "kube edition"}},
		{"RunnerKubeWithoutImage", kubeMinimal + "runner {\n  kube {}\n}\n", []string{"reaper.hcl:4:", `"image"`}},
		{"RunnerKubeBadQuantity", kubeMinimal + "runner {\n  kube {\n    image = \"x\"\n    cpu_limit = \"lots\"\n  }\n}\n", []string{"reaper.hcl:6:17:", "cpu_limit"}},
		{"RunnerKubeAttemptAPINotHTTPS", kubeMinimal + "runner {\n  kube {\n    image = \"x\"\n    attempt_api = \"reaper:9465\"\n  }\n}\n", []string{"reaper.hcl:6:19:", "attempt_api"}},
		{"RunnerKubeBadPullPolicy", kubeMinimal + "runner {\n  kube {\n    image = \"x\"\n    image_pull_policy = \"Sometimes\"\n  }\n}\n", []string{"reaper.hcl:6:25:", "image_pull_policy"}},
		{"WarmPoolWithoutSize", kubeMinimal + "runner {\n  kube {\n    image = \"x\"\n    warm_pool {}\n  }\n}\n", []string{"reaper.hcl:6:", `"size"`}},
		{"WarmPoolSizeZero", kubeMinimal + "runner {\n  kube {\n    image = \"x\"\n    warm_pool {\n      size = 0\n    }\n  }\n}\n", []string{"reaper.hcl:7:14:", `"size"`}},
		{"WarmPoolBadName", kubeMinimal + "runner {\n  kube {\n    image = \"x\"\n    warm_pool {\n      size = 1\n      name = \"ETL_pool\"\n    }\n  }\n}\n", []string{"reaper.hcl:8:14:", `"name"`}},
		{"WarmPoolUnknownKey", kubeMinimal + "runner {\n  kube {\n    image = \"x\"\n    warm_pool {\n      size = 1\n      deadline = \"1h\"\n    }\n  }\n}\n", []string{"reaper.hcl:8:7:", `"deadline"`}},
		{"TwoWarmPools", kubeMinimal + "runner {\n  kube {\n    image = \"x\"\n    warm_pool {\n      size = 1\n    }\n    warm_pool {\n      size = 1\n    }\n  }\n}\n", []string{"reaper.hcl:9:5:", "Duplicate warm_pool"}},
		{"KubeconfigOnThePostgresLeader", minimal + "leader \"postgres\" {\n  kubeconfig = \"k\"\n}\n", []string{"reaper.hcl:3:8:", "kubeconfig"}},
		{"RenewNotInsideTheTrustedLease", minimal + "leader \"postgres\" {\n  lease = \"10s\"\n  renew = \"8s\"\n}\n", []string{"reaper.hcl:3:8:", `"renew"`, "8s of 10s"}},
		{"NegativeRenew", minimal + "leader \"postgres\" {\n  renew = \"-1s\"\n}\n", []string{"reaper.hcl:3:8:", `"renew"`}},
		{"RunnerNegativeParallel", minimal + "runner {\n  max_parallel = -1\n}\n", []string{"reaper.hcl:4:18:", "max_parallel"}},
		{"RunnerNegativeStartCap", minimal + "runner {\n  max_active_runs = -2\n}\n", []string{"reaper.hcl:4:21:", "max_active_runs"}},
		{"RecoveryRateNegative", minimal + "runner {\n  recovery_rate = -1\n}\n", []string{"reaper.hcl:4:19:", "recovery_rate"}},
		{"PoolRecoveryBurstFraction", minimal + "runner {\n  pool \"db\" {\n    slots = 1\n    recovery_burst = 1.5\n  }\n}\n",
			[]string{"reaper.hcl:6:22:", `recovery_burst of pool "db"`}},
		{"PoolUnknownKey", minimal + "runner {\n  pool \"db\" {\n    slots = 1\n    size = 2\n  }\n}\n", []string{"reaper.hcl:6:5:", `"size"`}},
		{"PoolWithoutSlots", minimal + "runner {\n  pool \"db\" {}\n}\n", []string{"reaper.hcl:4:", `"slots"`}},
		{"PoolSlotsZero", minimal + "runner {\n  pool \"db\" {\n    slots = 0\n  }\n}\n", []string{"reaper.hcl:5:13:", `slots of pool "db"`}},
		{"PoolBadName", minimal + "runner {\n  pool \"gpu pool\" {\n    slots = 1\n  }\n}\n", []string{"reaper.hcl:4:8:", "Invalid pool name"}},
		{"PoolTwice", minimal + "runner {\n  pool \"db\" {\n    slots = 1\n  }\n  pool \"db\" {\n    slots = 2\n  }\n}\n",
			[]string{"reaper.hcl:7:3:", "Pool declared twice"}},
		{"UnknownStoreKey", minimal + "store {\n  url = \"x\"\n}\n", []string{"reaper.hcl:4:3:", `"url"`}},
		{"AttemptAPICertWithoutKey", minimal + "attempt_api {\n  tls_cert = \"c.pem\"\n}\n", []string{"reaper.hcl:4:14:", "tls_cert and tls_key"}},
		{"AttemptAPIOffLoopbackWithoutCertificate", minimal + "attempt_api {\n  listen = \"0.0.0.0:9465\"\n}\n",
			[]string{"reaper.hcl:4:12:", "not a loopback address"}},
		{"AttemptAPICAWithoutCertificate", minimal + "attempt_api {\n  tls_ca = \"ca.pem\"\n}\n", []string{"reaper.hcl:4:12:", "tls_ca"}},
		{"AttemptAPIUnknownKey", minimal + "attempt_api {\n  port = 1\n}\n", []string{"reaper.hcl:4:3:", `"port"`}},
		{"PluginMaxReplyNotASize", minimal + "plugin_max_reply = \"lots\"\n", []string{"reaper.hcl:3:20:", "plugin_max_reply"}},
		{"PluginMaxReplyTooSmall", minimal + "plugin_max_reply = \"64Ki\"\n", []string{"reaper.hcl:3:20:", "between 1Mi and 256Mi"}},
		{"PluginMaxReplyTooLarge", minimal + "plugin_max_reply = \"2Gi\"\n", []string{"reaper.hcl:3:20:", "between 1Mi and 256Mi"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.src, nil)
			var cerr *config.Error
			if !errors.As(err, &cerr) {
				t.Fatalf("err = %v, want a *config.Error", err)
			}
			msg := err.Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("diagnostic %q lacks %q", msg, w)
				}
			}
		})
	}
}

func TestLadderRules(t *testing.T) {
	cases := []struct {
		name    string
		edition string
		ladder  string
		extra   string
		want    []string // position, key and rule
	}{
		{"AgentLostNotAboveHeartbeat", "lite", "heartbeat = \"90s\"\n  agent_lost = \"60s\"",
			"", []string{"reaper.hcl:5:16:", "agent_lost (60s) must be greater than heartbeat (90s)"}},
		{"SettlingGraceNotAboveAgentLost", "lite", "settling_grace = \"60s\"",
			"", []string{"reaper.hcl:4:", "settling_grace (60s) must be greater than agent_lost (90s)"}},
		{"TokenTTLNotAboveSettlingGrace", "lite", "attempt_token_ttl = \"3m\"",
			"", []string{"reaper.hcl:4:", "attempt_token_ttl (180s) must be greater than settling_grace (180s)"}},
		{"TwoIntervalsNotBelowSettlingGrace", "lite", "",
			"maintenance {\n  interval = \"90s\"\n}\n", []string{"reaper.hcl:", "settling_grace (180s) must be greater than 2 x maintenance.interval (180s)"}},
		{"KubeValveNotAboveGracePlusTwoIntervals", "kube", "infra_confirm_valve = \"80s\"",
			"", []string{"reaper.hcl:4:", "infra_confirm_valve (80s) must be greater than task_termination_grace + 2 x maintenance.interval (90s)"}},
		{"KubeOrphanRunNotAboveValve", "kube", "orphan_run = \"2m\"",
			"", []string{"reaper.hcl:4:", "orphan_run (120s) must be greater than infra_confirm_valve (120s)"}},
		{"CeilingNotAboveTokenTTL", "lite", "",
			"auth {\n  max_attempt_credential_lifetime = \"10m\"\n}\n",
			[]string{"reaper.hcl:", "auth.max_attempt_credential_lifetime (10m) must be greater than attempt_token_ttl (10m)"}},
		{"HeartbeatNotPositive", "lite", "heartbeat = \"0s\"", "", []string{"heartbeat (0s) must be positive"}},
		{"WorkerCeilingNotAboveTokenTTL", "kube", "",
			"auth {\n  max_worker_credential_lifetime = \"5m\"\n}\n",
			[]string{"reaper.hcl:", "auth.max_worker_credential_lifetime (300s) must be greater than attempt_token_ttl (10m)"}},
		{"WorkerCeilingNotPositive", "kube", "",
			"auth {\n  max_worker_credential_lifetime = \"0s\"\n}\n",
			[]string{"reaper.hcl:", "auth.max_worker_credential_lifetime (0s) must be positive"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := "edition = \"" + tc.edition + "\"\nsubstrate \"" + tc.edition + "\" {}\nladder {\n  " + tc.ladder + "\n}\n" + tc.extra
			_, err := parse(t, src, nil)
			if err == nil {
				t.Fatal("ladder accepted, want a refusal")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}

	t.Run("DefaultsPass", func(t *testing.T) {
		if _, err := parse(t, minimal, nil); err != nil {
			t.Errorf("lite defaults: %v", err)
		}
		if _, err := parse(t, "edition = \"kube\"\nsubstrate \"kube\" {}\n", nil); err != nil {
			t.Errorf("kube defaults: %v", err)
		}
	})

	// The grace rung holds against the grace the kube runner gives its
	// pods, not only against task_termination_grace.
	t.Run("KubeRunnerTerminationGracePastTheValve", func(t *testing.T) {
		src := kubeMinimal + "ladder {\n  infra_confirm_valve = \"3m\"\n}\n" +
			"runner {\n  kube {\n    image = \"x\"\n    termination_grace = \"5m\"\n  }\n}\n"
		_, err := parse(t, src, nil)
		if err == nil {
			t.Fatal("termination_grace = 5m accepted beside a 3m valve")
		}
		for _, w := range []string{"reaper.hcl:9:", "runner.kube.termination_grace (300s, at reaper.hcl:9)",
			"infra_confirm_valve (180s, at reaper.hcl:4)", "2 x maintenance.interval (60s)"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q lacks %q", err, w)
			}
		}
		// The valve left at its default is named as such.
		_, err = parse(t, kubeMinimal+"runner {\n  kube {\n    image = \"x\"\n    termination_grace = \"61s\"\n  }\n}\n", nil)
		if err == nil || !strings.Contains(err.Error(), "infra_confirm_valve (120s, at its default)") {
			t.Fatalf("61s + 2 x 30s against the default 2m valve: %v", err)
		}
	})
	t.Run("KubeRunnerTerminationGraceInsideTheValve", func(t *testing.T) {
		src := kubeMinimal + "runner {\n  kube {\n    image = \"x\"\n    termination_grace = \"59s\"\n  }\n}\n"
		if _, err := parse(t, src, nil); err != nil {
			t.Fatalf("59s + 2 x 30s < 2m refused: %v", err)
		}
	})

	t.Run("WorkerCeilingDefaultsToADayAndIsSettable", func(t *testing.T) {
		cfg, err := parse(t, minimal, nil)
		if err != nil || cfg.WorkerCredentialCeiling != config.WorkerCredentialLifetimeDefault {
			t.Fatalf("default worker ceiling %s (%v)", cfg.WorkerCredentialCeiling, err)
		}
		cfg, err = parse(t, minimal+"auth {\n  max_worker_credential_lifetime = \"6h\"\n}\n", nil)
		if err != nil || cfg.WorkerCredentialCeiling != 6*time.Hour {
			t.Fatalf("worker ceiling %s (%v), want 6h", cfg.WorkerCredentialCeiling, err)
		}
	})

	t.Run("KubeRulesDoNotApplyToLite", func(t *testing.T) {
		if _, err := parse(t, minimal+"ladder {\n  infra_confirm_valve = \"80s\"\n}\n", nil); err != nil {
			t.Fatalf("lite refused a kube-only rule: %v", err)
		}
	})

	t.Run("NonPositiveCeiling_AcceptedWithWarningNamingTheKey", func(t *testing.T) {
		cfg, err := parse(t, minimal+"auth {\n  max_attempt_credential_lifetime = \"0s\"\n}\n", nil)
		if err != nil {
			t.Fatalf("refused: %v", err)
		}
		if len(cfg.Warnings) != 1 || !strings.Contains(cfg.Warnings[0], "auth.max_attempt_credential_lifetime") ||
			!strings.Contains(cfg.Warnings[0], "reaper.hcl:4:") {
			t.Fatalf("warnings = %v", cfg.Warnings)
		}
		if cfg.Ladder.CeilingEnabled() {
			t.Fatal("ceiling still enabled")
		}
	})
}

func TestSettings(t *testing.T) {
	t.Run("EnvDSNOverridesStore", func(t *testing.T) {
		cfg, err := parse(t, minimal+"store {\n  dsn = \"postgres://file\"\n}\n", map[string]string{config.EnvDSN: "postgres://env"})
		if err != nil {
			t.Fatal(err)
		}
		if cfg.StoreDSN != "postgres://env" {
			t.Fatalf("dsn = %q", cfg.StoreDSN)
		}
	})

	t.Run("DSNFileIsReadOneLineItsNewlineTrimmed", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "dsn")
		if err := os.WriteFile(path, []byte("postgres://reaper:hunter2@db/reaper\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := parse(t, minimal+"store {\n  dsn_file = \""+path+"\"\n}\n", nil)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.StoreDSN != "postgres://reaper:hunter2@db/reaper" || cfg.StoreDSNFile != path {
			t.Fatalf("dsn = %q from %q", cfg.StoreDSN, cfg.StoreDSNFile)
		}
		if !slices.Contains(cfg.Secrets(), path) || !slices.Contains(cfg.Secrets(), "reaper.hcl") {
			t.Fatalf("secrets %v: want the DSN file and the configuration file", cfg.Secrets())
		}
		// The environment's file wins over the block's, as REAPER_DSN does.
		other := filepath.Join(t.TempDir(), "dsn")
		if err := os.WriteFile(other, []byte("postgres://env-file\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err = parse(t, minimal+"store {\n  dsn = \"postgres://file\"\n}\n", map[string]string{config.EnvDSNFile: other})
		if err != nil || cfg.StoreDSN != "postgres://env-file" {
			t.Fatalf("REAPER_DSN_FILE: %v, dsn %q", err, cfg.StoreDSN)
		}
	})

	t.Run("DSNAndDSNFileRefusedAtTheirLine", func(t *testing.T) {
		_, err := parse(t, minimal+"store {\n  dsn      = \"postgres://file\"\n  dsn_file = \"/etc/reaper/dsn\"\n}\n", nil)
		if err == nil || !strings.Contains(err.Error(), "reaper.hcl:5:") || !strings.Contains(err.Error(), "exclude each other") {
			t.Fatalf("err = %v, want a refusal at reaper.hcl:5", err)
		}
		_, err = parse(t, minimal, map[string]string{config.EnvDSN: "postgres://a", config.EnvDSNFile: "/etc/reaper/dsn"})
		if err == nil || !strings.Contains(err.Error(), "exclude each other") {
			t.Fatalf("both variables: err = %v, want refused", err)
		}
	})

	t.Run("DSNFileOthersMayReadOrOfTwoLinesIsRefused", func(t *testing.T) {
		dir := t.TempDir()
		open := filepath.Join(dir, "open")
		if err := os.WriteFile(open, []byte("postgres://x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		twoLines := filepath.Join(dir, "two")
		if err := os.WriteFile(twoLines, []byte("postgres://x\npostgres://y\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		for path, want := range map[string]string{open: "mode 0644", twoLines: "more than one line",
			filepath.Join(dir, "missing"): "no such file"} {
			_, err := parse(t, minimal+"store {\n  dsn_file = \""+path+"\"\n}\n", nil)
			if err == nil || !strings.Contains(err.Error(), "reaper.hcl:4:") || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: err = %v, want %q at reaper.hcl:4", path, err, want)
			}
		}
	})

	t.Run("KubeconfigsAreAPICredentialsNotSecrets", func(t *testing.T) {
		src := "edition = \"kube\"\nsubstrate \"kube\" {\n  kubeconfig = \"cluster.kubeconfig\"\n}\n" +
			"leader \"kubernetes\" {\n  namespace  = \"reaper\"\n  name       = \"reaper\"\n  kubeconfig = \"/etc/reaper/leader.kubeconfig\"\n}\n"
		cfg, diags := config.Check("/etc/reaper/reaper.hcl", []byte(src), config.Options{Getenv: func(string) string { return "" }})
		if diags.HasErrors() {
			t.Fatal(diags)
		}
		got := cfg.APICredentials()
		for _, want := range []string{"/etc/reaper/leader.kubeconfig", "cluster.kubeconfig", "/etc/reaper/cluster.kubeconfig"} {
			if !slices.Contains(got, want) {
				t.Errorf("API credentials %v lack %s", got, want)
			}
		}
		if slices.Contains(cfg.Secrets(), "/etc/reaper/leader.kubeconfig") {
			t.Errorf("secrets %v hold a kubeconfig: the substrate could not reach the API server", cfg.Secrets())
		}
	})

	t.Run("PluginDirIsRelativeToTheFile", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "r.hcl")
		if err := os.WriteFile(path, []byte(minimal+"plugin_dir = \"plugins\"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load(path, config.Options{Getenv: func(string) string { return "" }})
		if err != nil {
			t.Fatal(err)
		}
		if cfg.PluginDir != filepath.Join(dir, "plugins") {
			t.Fatalf("plugin_dir = %q", cfg.PluginDir)
		}
	})

	t.Run("PerReaperDryRunAndReservedKeys", func(t *testing.T) {
		cfg, err := parse(t, minimal+"reaper \"agentlost\" {\n  dry_run = true\n  policy = \"hold\"\n}\nreaper \"orphanrun\" {}\n", nil)
		if err != nil {
			t.Fatal(err)
		}
		if !cfg.Reapers[0].DryRun || cfg.Reapers[1].DryRun {
			t.Fatalf("dry_run = %v/%v", cfg.Reapers[0].DryRun, cfg.Reapers[1].DryRun)
		}
		// The plugin's own keys stay in the body for the plugin's schema.
		vals, _, diags := config.DecodeBlock(cfg.Reapers[0].Body, sdk.Schema{Attributes: []sdk.Attribute{
			{Name: "policy", Type: sdk.TypeString, Default: "replace"},
		}})
		if diags.HasErrors() || vals.String("policy") != "hold" {
			t.Fatalf("plugin values = %v, %v", vals, diags)
		}
	})

	t.Run("PluginMaxReplyDefaultsAndIsConfigurable", func(t *testing.T) {
		cfg, err := parse(t, minimal, nil)
		if err != nil || cfg.PluginMaxReply != config.PluginMaxReplyDefault {
			t.Fatalf("default plugin_max_reply = %d (err %v)", cfg.PluginMaxReply, err)
		}
		cfg, err = parse(t, minimal+"plugin_max_reply = \"16Mi\"\n", nil)
		if err != nil || cfg.PluginMaxReply != 16<<20 {
			t.Fatalf("plugin_max_reply = %d (err %v)", cfg.PluginMaxReply, err)
		}
	})

	t.Run("GlobalDryRunAppliesToEveryReaper", func(t *testing.T) {
		cfg, err := parse(t, "edition = \"lite\"\ndry_run = true\nsubstrate \"lite\" {}\nreaper \"agentlost\" {}\n", nil)
		if err != nil {
			t.Fatal(err)
		}
		if !cfg.Reapers[0].DryRun {
			t.Fatal("global dry_run not applied")
		}
	})
}

func TestDecodeBlockAgainstPluginSchema(t *testing.T) {
	schema := sdk.Schema{Attributes: []sdk.Attribute{
		{Name: "policy", Type: sdk.TypeString, Default: "replace"},
		{Name: "brake_share", Type: sdk.TypeNumber, Default: 0.5},
		{Name: "stop_grace", Type: sdk.TypeDuration, Default: "10s"},
		{Name: "labels", Type: sdk.TypeStrings},
		{Name: "token", Type: sdk.TypeString, Required: true},
	}}
	decode := func(src string) (sdk.Values, error) {
		cfg, err := parse(t, minimal+"reaper \"x\" {\n"+src+"}\n", nil)
		if err != nil {
			return nil, err
		}
		v, _, diags := config.DecodeBlock(cfg.Reapers[0].Body, schema)
		if diags.HasErrors() {
			return nil, &config.Error{Diags: diags}
		}
		return v, nil
	}
	t.Run("DefaultsAndValues", func(t *testing.T) {
		v, err := decode("  token = \"t\"\n  labels = [\"a\", \"b\"]\n  brake_share = 0.25\n")
		if err != nil {
			t.Fatal(err)
		}
		if v.String("policy") != "replace" || v.Number("brake_share") != 0.25 || len(v.Strings("labels")) != 2 {
			t.Fatalf("values = %v", v)
		}
		if d, _ := v.Duration("stop_grace"); d != 10*time.Second {
			t.Fatalf("stop_grace = %v", d)
		}
	})
	for name, tc := range map[string]struct{ src, want string }{
		"UnknownPluginKey":   {"  token = \"t\"\n  polcy = \"hold\"\n", `reaper.hcl:5:3: Unsupported argument: An argument named "polcy"`},
		"MissingRequiredKey": {"", `"token" is required`},
		"WrongType":          {"  token = \"t\"\n  brake_share = \"half\"\n", `reaper.hcl:5:17: Invalid value for "brake_share"`},
		"BadDuration":        {"  token = \"t\"\n  stop_grace = \"soon\"\n", `reaper.hcl:5:16: Invalid value for "stop_grace"`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := decode(tc.src)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestKubernetesLeaderIsAccepted(t *testing.T) {
	src := minimal + "leader \"kubernetes\" {\n  namespace = \"reaper\"\n  name = \"reaperd\"\n  lease = \"10s\"\n  renew = \"2s\"\n  kubeconfig = \"kube/admin.conf\"\n}\n"
	cfg, err := config.Parse(filepath.Join("etc", "reaper.hcl"), []byte(src), config.Options{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	want := config.Leader{Kind: config.LeaderKubernetes, Lease: 10 * time.Second, Renew: 2 * time.Second,
		Namespace: "reaper", Name: "reaperd", Kubeconfig: filepath.Join("etc", "kube", "admin.conf")}
	if cfg.Leader != want {
		t.Fatalf("leader = %+v, want %+v", cfg.Leader, want)
	}
	// No kubeconfig: the in-cluster configuration.
	cfg, err = parse(t, minimal+"leader \"kubernetes\" {\n  namespace = \"reaper\"\n  name = \"reaperd\"\n}\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Leader.Kubeconfig != "" || cfg.Leader.Renew != 0 || cfg.Leader.Lease != config.LeaseDefault {
		t.Fatalf("leader = %+v", cfg.Leader)
	}
}

func TestKubeEditionAccepted(t *testing.T) {
	src := "edition = \"kube\"\nsubstrate \"kube\" {\n  namespace = \"tasks\"\n}\n" +
		"reaper \"dispatchlost\" {}\nreaper \"podlost\" {}\nreaper \"agentlost\" {}\nreaper \"warmworker\" {}\nreaper \"orphanrun\" {}\n"
	cfg, err := parse(t, src, nil)
	if err != nil {
		t.Fatalf("kube configuration refused: %v", err)
	}
	if cfg.Edition != "kube" || cfg.Substrate.Name != "kube" || len(cfg.ReaperNames()) != 5 {
		t.Fatalf("decoded %s %s %v", cfg.Edition, cfg.Substrate.Name, cfg.ReaperNames())
	}
}

func TestCheckReportsEveryProblem(t *testing.T) {
	src := "edition = \"lite\"\ncolour = \"red\"\nsubstrate \"lite\" {}\nladder {\n  agent_lost = \"10s\"\n}\nmaintenance {\n  interval = 30\n}\n"
	cfg, diags := config.Check("reaper.hcl", []byte(src), config.Options{Getenv: func(string) string { return "" }})
	if cfg == nil {
		t.Fatal("no configuration decoded")
	}
	msg := config.FormatDiagnostics(diags)
	for _, w := range []string{
		`reaper.hcl:2:1: Unsupported argument`,
		`reaper.hcl:8:14: Invalid value for "interval"`,
		`reaper.hcl:5:16: Timing ladder out of order: agent_lost (10s) must be greater than heartbeat (15s)`,
	} {
		if !strings.Contains(msg, w) {
			t.Errorf("diagnostics lack %q:\n%s", w, msg)
		}
	}
}

func TestRecordDir(t *testing.T) {
	load := func(t *testing.T, src string) *config.Config {
		t.Helper()
		dir := t.TempDir()
		path := filepath.Join(dir, "r.hcl")
		if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load(path, config.Options{Getenv: func(string) string { return "" }})
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	t.Run("DefaultIsTheTemporaryDirectoryOfTheUser", func(t *testing.T) {
		cfg := load(t, minimal)
		want := filepath.Join(os.TempDir(), "dexaflow-agent-pids-"+strconv.Itoa(os.Getuid()))
		if cfg.RecordDir != want {
			t.Fatalf("record dir %q, want %q", cfg.RecordDir, want)
		}
	})
	t.Run("EmptyIsTheDefault", func(t *testing.T) {
		cfg := load(t, "edition = \"lite\"\nsubstrate \"lite\" {\n  record_dir = \"\"\n}\n")
		if !strings.HasPrefix(filepath.Base(cfg.RecordDir), "dexaflow-agent-pids-") {
			t.Fatalf("record dir %q", cfg.RecordDir)
		}
	})
	t.Run("RelativeToTheFile", func(t *testing.T) {
		cfg := load(t, "edition = \"lite\"\nsubstrate \"lite\" {\n  record_dir = \"records\"\n}\n")
		if cfg.RecordDir != filepath.Join(filepath.Dir(cfg.Path), "records") {
			t.Fatalf("record dir %q", cfg.RecordDir)
		}
	})
}

func TestAttemptAPIBlock(t *testing.T) {
	t.Run("AbsentTakesTheLoopbackDefaults", func(t *testing.T) {
		cfg, err := parse(t, minimal, nil)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.AttemptAPI.Listen != config.AttemptAPIAddrDefault || cfg.AttemptAPI.StateDir != config.DefaultAttemptAPIStateDir() ||
			cfg.AttemptAPI.HeartbeatWindow != config.HeartbeatWindowDefault {
			t.Fatalf("attempt_api = %+v", cfg.AttemptAPI)
		}
	})
	t.Run("OperatorFilesAreRelativeToTheConfiguration", func(t *testing.T) {
		cfg, err := config.Parse("/etc/reaper/reaper.hcl", []byte(minimal+`attempt_api {
  listen           = "10.0.0.5:9465"
  advertise        = "https://reaper.internal:9465"
  tls_cert         = "tls/api.crt"
  tls_key          = "tls/api.key"
  tls_ca           = "/etc/ssl/ca.pem"
  signing_key_file = "keys.hcl"
  state_dir        = "state"
}
`), config.Options{Getenv: func(string) string { return "" }})
		if err != nil {
			t.Fatal(err)
		}
		want := config.AttemptAPI{Listen: "10.0.0.5:9465", Advertise: "https://reaper.internal:9465",
			TLSCert: "/etc/reaper/tls/api.crt", TLSKey: "/etc/reaper/tls/api.key", TLSCA: "/etc/ssl/ca.pem",
			SigningKeyFile: "/etc/reaper/keys.hcl", StateDir: "/etc/reaper/state", Limits: httplimit.DefaultAttemptAPI(),
			HeartbeatWindow: config.HeartbeatWindowDefault, Clients: httplimit.DefaultAttemptAPIClients(15 * time.Second)}
		if cfg.AttemptAPI != want {
			t.Fatalf("attempt_api = %+v\nwant %+v", cfg.AttemptAPI, want)
		}
	})
}

// The heartbeat window is held far below the ladder it is read with (the
// ladder block may follow it): a tenth of the heartbeat and of agent_lost -
// heartbeat at most, never negative; a refusal names the key and its line.
func TestHeartbeatWindow(t *testing.T) {
	window := func(w string) string { return minimal + "attempt_api {\n  heartbeat_window = \"" + w + "\"\n}\n" }
	for _, tc := range []struct {
		name, src string
		want      time.Duration
	}{
		{"Zero_NoWindow", window("0s"), 0},
		{"FiftyMilliseconds_Accepted", window("50ms"), 50 * time.Millisecond},
		{"ATenthOfTheHeartbeat_Accepted", window("1500ms"), 1500 * time.Millisecond},
		{"NotGiven_TheDefault", minimal, config.HeartbeatWindowDefault},
		// A ladder moved low (tests run heartbeats of 100ms) takes the
		// largest window its rules allow when the file gives none.
		{"NotGiven_ALowLadderTakesATenthOfItsHeartbeat", minimal + "ladder {\n  heartbeat = \"100ms\"\n  agent_lost = \"1s\"\n}\n",
			10 * time.Millisecond},
		{"NotGiven_ALowAgentLostTakesATenthOfItsSilence", minimal + "ladder {\n  heartbeat = \"100ms\"\n  agent_lost = \"150ms\"\n}\n",
			5 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parse(t, tc.src, nil)
			if err != nil || cfg.AttemptAPI.HeartbeatWindow != tc.want {
				t.Fatalf("heartbeat_window: %v, %v; want %s", cfg, err, tc.want)
			}
		})
	}
	for _, tc := range []struct{ name, src, want string }{
		{"Negative_Refused", window("-1ms"), "must not be negative"},
		{"OverATenthOfTheHeartbeat_Refused", window("1501ms"), "at most a tenth of the heartbeat (15s)"},
		{"OverATenthOfAShorterHeartbeatGivenAfter_Refused", window("600ms") + "ladder {\n  heartbeat = \"5s\"\n}\n",
			"at most a tenth of the heartbeat (5s)"},
		{"OverATenthOfAgentLostPastTheHeartbeat_Refused", window("200ms") + "ladder {\n  agent_lost = \"16s\"\n}\n",
			"at most a tenth of agent_lost - heartbeat"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.src, nil)
			if err == nil || !strings.Contains(err.Error(), "reaper.hcl:4:") ||
				!strings.Contains(err.Error(), "attempt_api.heartbeat_window") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want a refusal at reaper.hcl:4 saying %q", err, tc.want)
			}
		})
	}
}

// Each kube-only rung of the ladder, broken in the file: a Lite
// configuration validates, the same ladder on kube is refused naming the key.
func TestKubeOnlyLadderRungsSkippedOnLite(t *testing.T) {
	cases := []struct{ name, ladder, want string }{
		{"TerminationGracePastTheValve", `task_termination_grace = "5m"`, "infra_confirm_valve (120s) must be greater than task_termination_grace"},
		{"ValveNotAboveGracePlusTwoIntervals", `infra_confirm_valve = "90s"`, "infra_confirm_valve (90s) must be greater than task_termination_grace"},
		{"OrphanRunNotAboveTheValve", `orphan_run = "2m"`, "orphan_run (120s) must be greater than infra_confirm_valve (120s)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			block := "ladder {\n  " + tc.ladder + "\n}\n"
			if _, err := parse(t, minimal+block, nil); err != nil {
				t.Fatalf("lite refused a kube-only rung: %v", err)
			}
			_, err := parse(t, kubeMinimal+block, nil)
			if err == nil || !strings.Contains(err.Error(), "reaper.hcl:4:") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("kube: err = %v, want a refusal at reaper.hcl:4 saying %q", err, tc.want)
			}
		})
	}
}

func TestRunAs(t *testing.T) {
	t.Run("AnotherUserIsAcceptedOnLite", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root: reaperd must be able to switch to the run_as user")
		}
		if _, err := user.Lookup("nobody"); err != nil {
			t.Skip("no user nobody")
		}
		cfg, err := parse(t, minimal+"runner {\n  run_as = \"nobody\"\n}\n", nil)
		if err != nil || cfg.Runner.RunAs != "nobody" {
			t.Fatalf("run_as %q (%v), want nobody", cfg.Runner.RunAs, err)
		}
	})
	for _, tc := range []struct{ name, src, want string }{
		{"RootIsRefused", minimal + "runner {\n  run_as = \"root\"\n}\n", "is root"},
		{"AnUnknownUserIsRefused", minimal + "runner {\n  run_as = \"no-such-user-anywhere\"\n}\n", "unknown user"},
		{"KubeIsRefused", kubeMinimal + "runner {\n  run_as = \"nobody\"\n  kube {\n    image = \"x\"\n  }\n}\n", "run_as is Lite's"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, diags := config.Check("reaper.hcl", []byte(tc.src), config.Options{Getenv: func(string) string { return "" }})
			if !strings.Contains(diags.Error(), tc.want) || !strings.Contains(diags.Error(), `Invalid value for "run_as"`) {
				t.Fatalf("%v, want a refusal naming %q", diags, tc.want)
			}
		})
	}
}

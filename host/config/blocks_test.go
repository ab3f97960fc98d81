package config_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/host/config"
)

// TestEachBlock proves every block of the host's own through the typed
// decoder: a good value lands in the configuration, a value of the wrong
// type and an attribute the block does not declare are each refused with
// one diagnostic at their file:line:column, naming the key.
func TestEachBlock(t *testing.T) {
	lite := func(block string) string { return minimal + block }
	kube := func(block string) string { return kubeMinimal + block }
	in := func(open string, wrap func(string) string) func(string) string {
		return func(attr string) string {
			closing := strings.Repeat("}\n", strings.Count(open, "{"))
			return wrap(open + attr + "\n" + closing)
		}
	}
	cases := []struct {
		name string
		file func(attr string) string
		// good sets an attribute that check finds in the configuration.
		good  string
		check func(*config.Config) bool
		// wrongType and unknown are refused at their key.
		wrongType, unknown string
	}{
		{"TopLevel", lite, "dry_run = true", func(c *config.Config) bool { return c.DryRun },
			`plugin_dir = ["bin"]`, `colour = "red"`},
		{"Store", in("store {\n", lite), `dsn = "postgres://board"`, func(c *config.Config) bool { return c.StoreDSN == "postgres://board" },
			`dsn = ["postgres://board"]`, `url = "postgres://board"`},
		{"Leader", in("leader \"postgres\" {\n", lite), `lease = "20s"`, func(c *config.Config) bool { return c.Leader.Lease == 20*time.Second },
			`lease = ["20s"]`, `ttl = "20s"`},
		{"Maintenance", in("maintenance {\n", lite), `interval = "20s"`,
			func(c *config.Config) bool { return c.Ladder.MaintenanceInterval == 20*time.Second },
			`interval = ["20s"]`, `period = "20s"`},
		{"Ladder", in("ladder {\n", lite), `agent_lost = "100s"`, func(c *config.Config) bool { return c.Ladder.AgentLost == 100*time.Second },
			`agent_lost = ["100s"]`, `heartbeet = "15s"`},
		{"Auth", in("auth {\n", lite), `max_worker_credential_lifetime = "12h"`,
			func(c *config.Config) bool { return c.WorkerCredentialCeiling == 12*time.Hour },
			`max_worker_credential_lifetime = ["12h"]`, `max_lifetime = "12h"`},
		{"Telemetry", in("telemetry {\n", lite), `listen = "127.0.0.1:9999"`,
			func(c *config.Config) bool { return c.Telemetry.Listen == "127.0.0.1:9999" },
			`max_connections = "many"`, `port = 9999`},
		{"AttemptAPI", in("attempt_api {\n", lite), `advertise = "https://reaper.internal:9465"`,
			func(c *config.Config) bool { return c.AttemptAPI.Advertise == "https://reaper.internal:9465" },
			`state_dir = ["state"]`, `port = 9465`},
		{"Runner", in("runner {\n", lite), `max_parallel = 4`, func(c *config.Config) bool { return c.Runner.MaxParallel == 4 },
			`max_parallel = "four"`, `parallel = 4`},
		{"Pool", in("runner {\n  pool \"db\" {\n", lite), `slots = 4`,
			func(c *config.Config) bool {
				return c.Runner.Pools["db"] == 4 && len(c.Runner.Pools) == 1 && len(c.Runner.Recovery.Pools) == 0 &&
					c.Runner.Recovery.Default.Rate == lifecycle.RecoveryRateDefault
			},
			`slots = "four"`, ""}, // slots is required: an unknown key in its place is two errors (PoolUnknownKey)
		{"PoolRecovery", in("runner {\n  recovery_rate = 5\n  pool \"db\" {\n    slots = 4\n", lite), `recovery_rate = 0.5`,
			func(c *config.Config) bool {
				return c.Runner.Recovery.Default.Rate == 5 && c.Runner.Recovery.Pools["db"].Rate == 0.5
			},
			`recovery_rate = "slow"`, ""},
		{"RunnerKube", in("runner {\n  kube {\n    image = \"x\"\n", kube), `service_account = "task"`,
			func(c *config.Config) bool { return c.Runner.Kube.ServiceAccount == "task" },
			`run_as_user = "nobody"`, `replicas = 2`},
		{"WarmPool", in("runner {\n  kube {\n    image = \"x\"\n    warm_pool {\n      size = 1\n", kube), `slots = 2`,
			func(c *config.Config) bool { return c.Runner.Kube.WarmPool.Slots == 2 },
			`slots = "two"`, `deadline = "1h"`},
		// A plugin block's other keys are the plugin's to judge: only the
		// host's reserved keys are decoded here.
		{"PluginReservedKeys", in("reaper \"agentlost\" {\n", lite), `dry_run = true`,
			func(c *config.Config) bool { return c.Reapers[0].DryRun },
			`dry_run = "maybe"`, ""},
	}
	check := func(src string) (*config.Config, hcl.Diagnostics) {
		return config.Check("reaper.hcl", []byte(src), config.Options{Getenv: func(string) string { return "" }})
	}
	// at is where attr's key (or its value) is written in src.
	at := func(src, attr string, value bool) string {
		line := strings.Split(src[:strings.Index(src, attr)], "\n")
		col := len(line[len(line)-1]) + 1
		if value {
			col += strings.Index(attr, "=") + 2
		}
		return fmt.Sprintf("reaper.hcl:%d:%d: ", len(line), col)
	}
	refused := func(t *testing.T, src, attr string, value bool, key string) {
		t.Helper()
		_, diags := check(src)
		msg := config.FormatDiagnostics(diags)
		if n := len(diags.Errs()); n != 1 {
			t.Fatalf("%d errors, want 1:\n%s", n, msg)
		}
		if want := at(src, attr, value); !strings.HasPrefix(msg, want) || !strings.Contains(msg, `"`+key+`"`) {
			t.Fatalf("diagnostic %q, want it at %s naming %q", msg, want, key)
		}
	}
	for _, tc := range cases {
		t.Run(tc.name+"/GoodValue", func(t *testing.T) {
			cfg, diags := check(tc.file(tc.good))
			if diags.HasErrors() {
				t.Fatal(config.FormatDiagnostics(diags))
			}
			if !tc.check(cfg) {
				t.Fatalf("%s not in the configuration", tc.good)
			}
		})
		t.Run(tc.name+"/WrongType", func(t *testing.T) {
			key, _, _ := strings.Cut(tc.wrongType, " ")
			refused(t, tc.file(tc.wrongType), tc.wrongType, true, key)
		})
		if tc.unknown == "" {
			continue
		}
		t.Run(tc.name+"/UnknownAttribute", func(t *testing.T) {
			key, _, _ := strings.Cut(tc.unknown, " ")
			refused(t, tc.file(tc.unknown), tc.unknown, false, key)
		})
	}
}
